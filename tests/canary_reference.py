"""Reference route for the tracker's canary statistic: explicit canary vectors, float64 dots.

Independent of :mod:`flaudit.auditor.statistics`' fast path (no transform, no bank): tests compare the
tracker, the service and the ServerApp against it.
"""

from __future__ import annotations

import numpy as np

from flaudit.auditor.canaries import CanaryFamily, canary_vectors, resolve_canary_family, seen_mask


def expected_statistics(
    seed: int, num_canaries: int, vector: np.ndarray, *, family=None, vectors=None
) -> np.ndarray:
    """What ``CosineTracker(seed, k, d, family=family).all_cosines(vector)`` should return.

    Gaussian family: plain cosines ``<c_j, v> / ||v||``. Orthogonal family: the dots over the
    null scale ``sqrt(d) s``, ``s^2`` the energy of ``v`` outside the seen canaries' span per
    remaining dimension (``v`` has ``||v||^2 - sum_seen <c_j, v>^2`` of it, the canaries being
    orthonormal).
    """
    v = np.asarray(vector, dtype=np.float32).astype(np.float64)
    d = v.size
    family = resolve_canary_family(family, num_canaries=num_canaries, dim=d)
    if vectors is None:
        vectors = canary_vectors(seed, np.arange(num_canaries), d, family=family)
    dots = vectors.astype(np.float64) @ v
    if family is CanaryFamily.gaussian:
        return dots / np.linalg.norm(v)
    seen = seen_mask(seed, num_canaries)
    null_energy = (v @ v - np.sum(dots[seen] ** 2)) / (d - seen.sum())
    return np.clip(dots / np.sqrt(d * null_energy), -1.0, 1.0)
