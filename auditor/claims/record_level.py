"""The record-level claim test (issue #37): record canaries in clients' DP-SGD.

Each client's update in each round it trained is one *release*. In it, seen canary ``j`` has a
studentized score ``t_j`` (:func:`record_level_scores` of its cosine ``cos(-Delta, c_j)``) and,
from the seed, the steps it was included at, hence its claimed signal ``lam_j``
(:func:`flaudit.auditor.estimators.record_claim.record_level_claimed_mu`, ``0`` if never
included). With isotropic Gaussian noise and orthonormal canaries the coordinates
``y_j = lam'_j + N(0, 1)`` are independent (``lam'_j``: the signal actually carried, ``lam_j``
times ``z / z_true`` for noise ``z_true``), and the scale they are studentized by comes from the
other coordinates (``dof`` of them). So with ``a_j = lam_j / ||lam||`` (the Neyman-Pearson
weights against "noise x s", which scales every ``lam_j`` by ``1/s``)

    R = sum_j a_j t_j  ~  noncentral t(dof, sum_j a_j lam'_j),

``= ||lam||`` on the claim, below it for any smaller signal. Each release's ``R`` goes through
:class:`flaudit.auditor.claims.normal_scores.NormalScoreTest` (its exact normal score under the
claim, one release per client-round, releases independent: fresh noise) with ``lam_claim =
1/z`` and the release's weight ``z ||lam||``: the same test, the same ``mu_lo`` inversion, the
same details round trip as the user-level exact tests. ``mu_lo`` here bounds ``1/z_true``, the
per-inclusion signal; ``1/mu_lo`` is an upper confidence bound on the noise multiplier the steps
carried (:func:`record_noise_multiplier_hi`), and the run's epsilon at it is what the audit
measured.

Validity (docs/estimators.md, "Record-level claim test"): size at most ``a`` -- exactly ``a`` at
the claim -- for DP-SGD with flat clipping, Gaussian noise at least ``z C``, canaries added at
the clip norm and ``torch.optim.SGD`` (plain or momentum) starting each round from an empty
buffer, whatever the sampling of the real examples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..estimators.null import studentized_from_cosine
from .normal_scores import NormalScoreTest, RoundSums, normal_score_test

__all__ = [
    "record_level_claim_test",
    "record_level_rounds",
    "record_level_scores",
    "record_noise_multiplier_hi",
]


def record_level_scores(cosines, dim: int, *, dof: float | None = None) -> np.ndarray:
    """Studentized scores of the cosines ``cos(-Delta, c_j)`` of a ``dim``-parameter update: the
    Student-t value (``dof`` degrees of freedom, default ``dim``: the cosine's ``||Delta||``)
    with the cosine's null probability; exactly the null law for a never-included canary."""
    dim = int(dim)
    return np.asarray(
        studentized_from_cosine(
            np.asarray(cosines, dtype=np.float64), dim if dof is None else dof, dim
        ),
        dtype=np.float64,
    )


def record_level_rounds(
    scores: Sequence[np.ndarray],
    signals: Sequence[np.ndarray],
    *,
    noise_multiplier: float,
    dof: float,
) -> RoundSums:
    """The releases' weighted sums for :func:`record_level_claim_test`.

    ``scores[r]`` and ``signals[r]``: release ``r``'s seen canaries' studentized scores and
    claimed signals (``lam_j >= 0`` at ``noise_multiplier``). Canaries with ``lam_j = 0`` carry
    no weight; a release with none included is left out. NaN scores are refused (a canary the
    audit planned cannot go missing without biasing the sum)."""
    if len(scores) != len(signals):
        raise ValueError(f"{len(scores)} score arrays but {len(signals)} signal arrays")
    z = float(noise_multiplier)
    if not (math.isfinite(z) and z > 0):
        raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier!r}")
    sums, weights = [], []
    for r, (t, lam) in enumerate(zip(scores, signals, strict=True)):
        t = np.asarray(t, dtype=np.float64).ravel()
        lam = np.asarray(lam, dtype=np.float64).ravel()
        if t.shape != lam.shape:
            raise ValueError(f"release {r}: {t.size} scores but {lam.size} signals")
        if np.any(np.isnan(t)) or not np.all(np.isfinite(lam) & (lam >= 0)):
            raise ValueError(f"release {r}: scores must not be NaN, signals finite and >= 0")
        norm = float(np.linalg.norm(lam))
        if norm == 0:
            continue
        with np.errstate(invalid="ignore"):  # +inf * 0: a noiseless never-included canary
            terms = np.where(lam > 0, lam * t, 0.0)
        sums.append(float(np.sum(terms)) / norm)
        weights.append(norm * z)
    n = len(sums)
    return RoundSums(
        np.asarray(sums), np.ones(n, dtype=np.int64), dof, np.asarray(weights) if n else None
    )


def record_level_claim_test(
    scores: Sequence[np.ndarray],
    signals: Sequence[np.ndarray],
    *,
    noise_multiplier: float,
    dof: float,
) -> NormalScoreTest:
    """The exact test of a record-level claim on every release's seen canaries (module
    docstring). ``p_value`` is the claim's one-sided p-value; ``mu_lo(level)`` the lower
    confidence bound on the per-inclusion signal ``1/z_true``. ``dof``: the degrees of freedom
    of each release's scale (``dim`` for :func:`record_level_scores`' default; ``inf`` for
    independent normal scores with a known scale)."""
    rounds = record_level_rounds(scores, signals, noise_multiplier=noise_multiplier, dof=dof)
    return normal_score_test(rounds, claim_mu=1.0 / float(noise_multiplier))


def record_noise_multiplier_hi(test: NormalScoreTest, level: float) -> float:
    """Upper confidence bound (confidence ``1 - level``) on the noise multiplier the DP-SGD
    steps carried: ``1 / mu_lo`` (``inf`` when nothing is refuted beyond zero signal, ``0`` for
    a release with no noise at all). The claim is refuted at ``level`` when it is below the
    claimed ``z``."""
    mu = test.mu_lo(level)
    if mu == 0:
        return math.inf
    return 0.0 if math.isinf(mu) else 1.0 / mu
