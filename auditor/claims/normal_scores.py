"""Claim tests on normal scores, calibrated at the claimed Gaussian (issue #19 item 1).

Every statistic flaudit scores a canary with has a *known* null: with the canary absent, its
direction is independent of the release, so its cosine follows the exact null law ``F_d`` of a
random direction (:mod:`flaudit.auditor.estimators.null`). The normal score
``Z = Phi^-1(F_d(cos))`` is then exactly ``N(0, 1)``. If the mechanism is ``mu``-Gaussian DP
towards the canary, every threshold test on ``Z`` has power at most ``1 - G_mu(size)``, which
(docs/estimators.md, "Normal-score claim tests", averaging over the random direction with
Jensen's inequality) says ``P(Z_seen > t) <= P(N(mu, 1) > t)`` for every ``t``: each seen score
is stochastically below ``N(mu, 1)``. For independent seen scores, any non-negative weighted sum
is then stochastically below the same sum of independent ``N(mu_j, 1)``, so

    reject when  sum_j w_j S_j > sum_j w_j mu_j + z_{1-a} * ||w||

has level at most ``a``. Under the alternative "noise x s" each score shifts to ``mu_j / s``, so
``w_j = mu_j`` is the Neyman-Pearson test. Inverting it over the scale of the claim gives the
lower confidence bound ``mu_lo``.

Pure numpy/scipy: arrays in, numbers out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from flaudit.auditor.estimators.null import null_probit

__all__ = ["final_model_normal_scores", "NormalScoreTest", "normal_score_test"]


def final_model_normal_scores(cosines, dim: int) -> np.ndarray:
    """``Phi^-1(F_d(cos))`` of final-model cosines: exactly ``N(0, 1)`` for an absent canary."""
    return np.asarray(null_probit(np.asarray(cosines, dtype=np.float64), int(dim)), dtype=np.float64)


@dataclass(frozen=True)
class NormalScoreTest:
    """The weighted normal-score test of one look.

    The claim says canary ``j``'s score is below ``N(lam * a_j, 1)`` (``lam``: the claimed
    per-participation Gaussian-DP parameter, ``a_j = sqrt(n_j)``); the weights are ``a_j``.

    Attributes
    ----------
    statistic : float
        ``sum_j a_j S_j``.
    claimed_mean : float
        ``lam_claim * sum_j a_j^2``.
    scale : float
        ``||a||`` (the standard deviation under the calibration).
    num_scores : int
        Scores used.
    mu_per_unit : float
        ``mu / lam`` for the reported ``mu`` (``sqrt(r)`` for the known-rounds claim of ``r``
        rounds; 1 for a claim on one score per canary).
    """

    statistic: float
    claimed_mean: float
    scale: float
    num_scores: int
    lam_claim: float
    mu_per_unit: float

    @property
    def z(self) -> float:
        """Standardised excess over the claim (``+inf`` with no scores... never: 0 then)."""
        if self.scale == 0:
            return 0.0
        return (self.statistic - self.claimed_mean) / self.scale

    @property
    def p_value(self) -> float:
        """One-sided p-value of the claim (exact under the calibration; 1 with no scores)."""
        if self.num_scores == 0:
            return 1.0
        return float(special.ndtr(-self.z))

    def mu_lo(self, level: float) -> float:
        """Lower confidence bound (confidence ``1 - level``) on the claimed quantity ``mu``:
        the smallest claim scale the test does not reject, clipped at 0."""
        if self.num_scores == 0 or self.scale == 0:
            return 0.0
        lam = (self.statistic - float(special.ndtri(1.0 - level)) * self.scale) / self.scale ** 2
        return max(0.0, lam) * self.mu_per_unit

    def to_details(self) -> dict:
        return {"statistic": self.statistic, "claimed_mean": self.claimed_mean,
                "scale": self.scale, "num_scores": self.num_scores,
                "lam_claim": self.lam_claim, "mu_per_unit": self.mu_per_unit}

    @classmethod
    def from_details(cls, details: dict) -> "NormalScoreTest":
        return cls(float(details["statistic"]), float(details["claimed_mean"]),
                   float(details["scale"]), int(details["num_scores"]),
                   float(details["lam_claim"]), float(details["mu_per_unit"]))


def normal_score_test(scores, *, claim_mu: float, participations=None,
                      claim_participations: int = 1) -> NormalScoreTest:
    """The Neyman-Pearson normal-score test of a Gaussian-DP claim.

    Parameters
    ----------
    scores : array_like
        Seen canaries' normal scores ``S_j`` (NaN entries are left out).
    claim_mu : float
        The claimed ``mu`` for ``claim_participations`` participations (``sqrt(r)/z`` for the
        known-rounds claim with ``r`` repeats; the whole claim for the final model).
    participations : array_like of int, optional
        ``n_j``: participations behind each score so far (known rounds); the claim for canary
        ``j`` is then ``claim_mu * sqrt(n_j / claim_participations)``. Omitted: every score
        carries the whole claim.
    claim_participations : int
        ``r``, the participations ``claim_mu`` is for.

    Returns
    -------
    NormalScoreTest
    """
    s = np.asarray(scores, dtype=np.float64).ravel()
    if participations is None:
        n = np.full(s.shape, float(claim_participations))
    else:
        n = np.asarray(participations, dtype=np.float64).ravel()
        if n.shape != s.shape:
            raise ValueError(f"participations must have the shape of scores {s.shape}, got {n.shape}")
    keep = np.isfinite(s) & (n > 0)
    s, n = s[keep], n[keep]
    if claim_mu < 0 or not math.isfinite(claim_mu):
        raise ValueError(f"claim_mu must be finite and >= 0, got {claim_mu!r}")
    if claim_participations < 1:
        raise ValueError(f"claim_participations must be >= 1, got {claim_participations!r}")
    a = np.sqrt(n)
    lam = claim_mu / math.sqrt(claim_participations)
    scale = float(np.sqrt(np.sum(a * a)))
    return NormalScoreTest(
        statistic=float(np.sum(a * s)),
        claimed_mean=float(lam * np.sum(a * a)),
        scale=scale,
        num_scores=int(s.size),
        lam_claim=float(lam),
        mu_per_unit=math.sqrt(claim_participations),
    )
