"""Reference route for the tracker's canary statistic: explicit canary vectors, float64 dots.

Independent of :mod:`flaudit.auditor.statistics`' fast path (no transform, no bank): tests compare the
tracker, the service and the ServerApp against it.
"""

from __future__ import annotations

import numpy as np

from flaudit.auditor.canaries import CanaryFamily, canary_vectors, resolve_canary_family


def expected_statistics(
    seed: int, num_canaries: int, vector: np.ndarray, *, family=None, vectors=None
) -> np.ndarray:
    """What ``CosineTracker(seed, k, d, family=family).all_cosines(vector)`` should return.

    Gaussian family: plain cosines ``<c_j, v> / ||v||``. Orthogonal family: each dot studentized
    by ``s``, ``s^2`` the energy of ``v`` outside all ``k`` canaries' span per remaining
    dimension (``||v||^2 - sum_j <c_j, v>^2`` over ``d - k``, the canaries being orthonormal),
    then mapped to the cosine of equal probability, here through scipy.stats' Student-t and
    Beta laws (``|cos|^2 ~ Beta(1/2, (d - 1)/2)`` under the null).
    """
    from scipy import stats

    v = np.asarray(vector, dtype=np.float32).astype(np.float64)
    d = v.size
    family = resolve_canary_family(family, num_canaries=num_canaries, dim=d)
    if vectors is None:
        vectors = canary_vectors(seed, np.arange(num_canaries), d, family=family)
    dots = vectors.astype(np.float64) @ v
    if family is CanaryFamily.gaussian:
        return dots / np.linalg.norm(v)
    dof = d - num_canaries
    t = dots / np.sqrt((v @ v - np.sum(dots**2)) / dof)
    outer = 2.0 * stats.t(dof).sf(np.abs(t))  # P(|T| > |t|), accurate in the tail
    inner = 1.0 - outer
    square = stats.beta(0.5, (d - 1) / 2.0)
    return np.sign(t) * np.sqrt(np.where(inner < 0.5, square.ppf(inner), square.isf(outer)))
