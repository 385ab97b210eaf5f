"""Claim tests calibrated at the claimed Gaussian (issue #19 item 1), exact for DP-FedAvg.

Every statistic flaudit scores a canary with has a *known* null: with the canary absent, its
statistic follows the cosine null ``F_d`` (:mod:`flaudit.auditor.estimators.null`), so its normal
score ``Z = Phi^-1(F_d(cos))`` is exactly ``N(0, 1)``. If the mechanism is ``mu``-Gaussian DP
towards the canary, every threshold test on ``Z`` has power at most ``1 - G_mu(size)``, so each
seen score is stochastically below ``N(mu, 1)`` (docs/estimators.md, "Normal-score claim
tests").

Summing seen scores needs more than that: the statistics of one release share its noise scale
(the cosine's ``||v||``, or the orthogonal family's studentizing ``s``), so a release whose scale
came out small inflates all its seen scores at once. Under DP-FedAvg's Gaussian noise the sum is
exact instead: in noise units a seen canary's coordinate is ``lam + N(0, 1)`` (``lam``: its
per-participation signal, at most the claimed ``1/z``) and the scale is ``sqrt(chi2_nu / nu)``,
independent of it, so the seen participants' studentized values summed over one release,

    R_t = sum_j t_jt / sqrt(c_t)  ~  noncentral t(nu, sqrt(c_t) * lam),

and releases (rounds) are independent. Each ``R_t`` is mapped to its exact normal score under
the claim, ``Y_t = Phi^-1(F_nct(R_t; nu, sqrt(c_t) lam_claim))``, and

    reject when  sum_t sqrt(c_t) Y_t / sqrt(sum_t c_t) > z_{1-a}

has level exactly ``a`` at the claim and below it for every smaller signal (the noncentral t
grows stochastically with its noncentrality). With a known scale (``nu = inf``) this is the
Neyman-Pearson test of the claim against "noise x s" on independent ``N(lam, 1)`` scores.
Inverting it over ``lam`` gives the lower confidence bound ``mu_lo``.

Pure numpy/scipy: arrays in, numbers out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special

from ..estimators.null import null_probit, studentized_from_cosine
from .nct import nct_log_cdf, nct_normal_score

__all__ = [
    "final_model_normal_scores",
    "final_model_rounds",
    "NormalScoreTest",
    "RoundSums",
    "nct_log_cdf",
    "normal_score_test",
]


@dataclass(frozen=True)
class RoundSums:
    """The exact claim tests' data: per release (round, or the final model), the seen
    canaries' studentized statistics summed.

    Attributes
    ----------
    sums : numpy.ndarray
        (T,) ``R_t = sum_j t_jt / sqrt(c_t)``.
    counts : numpy.ndarray
        (T,) ``c_t >= 1``: seen canaries (participations) behind each ``R_t``.
    dof : float
        Degrees of freedom of each release's noise scale (``inf``: the scale is known and the
        ``t_jt`` are independent ``N(lam, 1)``-bounded normal scores).
    weights : numpy.ndarray, optional
        (T,) ``w_t > 0``: release ``t``'s per-participation signal under the claim is ``w_t``
        times the claim's (noncentrality ``sqrt(c_t) w_t lam``); None: all 1. A weighted
        FedAvg tested at the heaviest influence ``W`` the canaries carried passes
        ``w_t = W_t / W`` (:meth:`with_weights`), so each round is tested at its own weight
        ``W_t`` and the test stays exact (issue #38; docs/estimators.md, "Weighted FedAvg").
    """

    sums: np.ndarray
    counts: np.ndarray
    dof: float
    weights: np.ndarray | None = None

    def __post_init__(self) -> None:
        sums = np.asarray(self.sums, dtype=np.float64).ravel()
        counts = np.asarray(self.counts, dtype=np.int64).ravel()
        if sums.shape != counts.shape:
            raise ValueError(f"sums and counts differ in shape: {sums.shape} and {counts.shape}")
        if np.any(counts < 1):
            raise ValueError("counts must be >= 1")
        if np.any(np.isnan(sums)):
            raise ValueError("sums contains NaN")
        if not float(self.dof) > 0:
            raise ValueError(f"dof must be > 0 (or inf), got {self.dof!r}")
        object.__setattr__(self, "sums", sums)
        object.__setattr__(self, "counts", counts)
        object.__setattr__(self, "dof", float(self.dof))
        if self.weights is not None:
            weights = np.asarray(self.weights, dtype=np.float64).ravel()
            if weights.shape != sums.shape:
                raise ValueError(
                    f"weights must have the shape of sums {sums.shape}, got {weights.shape}"
                )
            if not np.all(np.isfinite(weights) & (weights > 0)):
                raise ValueError("weights must be finite and > 0")
            object.__setattr__(self, "weights", weights)

    def with_weights(self, weights) -> RoundSums:
        """The same releases with per-release signal weights (class docstring)."""
        return RoundSums(self.sums, self.counts, self.dof, weights)

    @property
    def signal_weights(self) -> np.ndarray:
        """(T,) the weights, ones when none were given."""
        return np.ones(self.sums.shape) if self.weights is None else self.weights

    @classmethod
    def from_scores(cls, scores, participations=None) -> RoundSums:
        """Independent normal scores with a known scale (``dof = inf``): score ``S_j`` of
        ``n_j`` participations (``sum`` of its per-round scores over ``sqrt(n_j)``) counts as
        one release with ``c = n_j`` (the test only sees ``sum sqrt(c) (R - sqrt(c) lam)``,
        the same however the scores are grouped). NaN scores and ``n_j = 0`` are left out."""
        s = np.asarray(scores, dtype=np.float64).ravel()
        n = (
            np.ones(s.shape, dtype=np.int64)
            if participations is None
            else np.asarray(participations, dtype=np.int64).ravel()
        )
        if n.shape != s.shape:
            raise ValueError(
                f"participations must have the shape of scores {s.shape}, got {n.shape}"
            )
        keep = np.isfinite(s) & (n > 0)
        return cls(s[keep], n[keep], math.inf)

    @property
    def num_scores(self) -> int:
        return int(self.counts.sum())


#: The lowest normal score a release counts with (its evidence *for* the claim is capped).
_Y_FLOOR = -40.0


def _round_scores(rounds: RoundSums, lam: float) -> np.ndarray:
    """``Y_t``: the exact normal score of each ``R_t`` under a per-participation signal ``lam``
    (``N(0, 1)`` when every seen participation carries exactly ``lam``), each from its own tail
    so both stay accurate (:func:`flaudit.auditor.claims.nct.nct_normal_score`)."""
    delta = np.sqrt(rounds.counts) * rounds.signal_weights * lam
    sums = rounds.sums
    if math.isinf(rounds.dof):
        return np.maximum(sums - delta, _Y_FLOOR)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        out = np.full(sums.shape, _Y_FLOOR)
        finite = np.isfinite(sums)
        if np.any(finite):
            out[finite] = nct_normal_score(sums[finite], rounds.dof, delta[finite])
        # a sum at or below 0 needs N <= -delta: P(T <= r) <= Phi(-delta), so Y <= -delta
        out = np.where(sums <= 0, np.minimum(out, -delta), out)
    out = np.where(np.isposinf(sums), np.inf, out)  # a cosine of exactly 1: no noise at all
    # at most Y_FLOOR below: max(Y, floor) is stochastically below N(0, 1) wherever Y is (up to
    # Phi(floor) ~ 1e-350), and no single release can outweigh every other in the sum
    return np.maximum(np.nan_to_num(out, nan=_Y_FLOOR), _Y_FLOOR)


def final_model_normal_scores(cosines, dim: int) -> np.ndarray:
    """``Phi^-1(F_d(cos))`` of final-model cosines: exactly ``N(0, 1)`` for an absent canary."""
    return np.asarray(
        null_probit(np.asarray(cosines, dtype=np.float64), int(dim)), dtype=np.float64
    )


def final_model_rounds(cosines, dim: int, *, dof: float) -> RoundSums:
    """The seen canaries' final-model statistics as one release (they share its noise scale
    of ``dof`` degrees of freedom: :func:`flaudit.auditor.statistics.scale_dof`)."""
    x = np.asarray(cosines, dtype=np.float64).ravel()
    x = x[np.isfinite(x)]
    if x.size == 0:
        return RoundSums(np.zeros(0), np.zeros(0, dtype=np.int64), dof)
    # a cosine of exactly +-1 (no noise along the canary) studentizes to +-inf, and two of
    # opposite signs would sum to NaN: read each cosine to float64 resolution instead
    bound = 1.0 - np.finfo(np.float64).eps
    t = studentized_from_cosine(np.clip(x, -bound, bound), dof, int(dim))
    return RoundSums(np.array([float(np.sum(t)) / math.sqrt(x.size)]), np.array([x.size]), dof)


@dataclass(frozen=True)
class NormalScoreTest:
    """The exact claim test of one look on per-release sums (module docstring).

    Attributes
    ----------
    rounds : RoundSums
        The releases' sums.
    lam_claim : float
        The claimed per-participation Gaussian-DP parameter (``1/z`` for DP-FedAvg).
    mu_per_unit : float
        ``mu / lam`` for the reported ``mu`` (``sqrt(r)`` for the known-rounds claim of ``r``
        rounds; 1 for the final model, one score per canary).
    """

    rounds: RoundSums
    lam_claim: float
    mu_per_unit: float

    @property
    def num_scores(self) -> int:
        """Seen participations behind the test."""
        return self.rounds.num_scores

    def _z(self, lam: float) -> float:
        total = self.num_scores
        if total == 0:
            return 0.0
        y = _round_scores(self.rounds, lam)
        if np.any(np.isposinf(y)):  # a release with no noise at all: beyond every signal
            return math.inf
        if np.any(np.isnan(y)):
            raise FloatingPointError(f"normal-score test: a release's score is NaN at lam={lam!r}")
        with np.errstate(over="ignore"):  # a huge finite score: the sum is +inf, as it should
            return float(np.sum(np.sqrt(self.rounds.counts) * y)) / math.sqrt(total)

    @property
    def z(self) -> float:
        """Standardised excess over the claim: ``N(0, 1)`` at the claim boundary."""
        return self._z(self.lam_claim)

    @property
    def p_value(self) -> float:
        """One-sided p-value of the claim (exact at the boundary; 1 with no scores)."""
        if self.num_scores == 0:
            return 1.0
        return float(special.ndtr(-self.z))

    def mu_lo(self, level: float) -> float:
        """Lower confidence bound (confidence ``1 - level``) on the claimed quantity ``mu``:
        the smallest signal the test does not reject, clipped at 0 (``inf`` when a release
        is beyond every signal: a cosine of exactly 1, no noise)."""
        if self.num_scores == 0:
            return 0.0
        crit = float(special.ndtri(1.0 - level))

        def excess(lam: float) -> float:
            return self._z(lam) - crit

        if excess(0.0) <= 0:
            return 0.0
        finite = self.rounds.sums[np.isfinite(self.rounds.sums)]
        if finite.size < self.rounds.sums.size:
            return math.inf
        # a known-scale guess, doubled until the test no longer rejects
        hi = max(
            1.0,
            float(np.sum(np.sqrt(self.rounds.counts) * finite))
            / self.num_scores
            / float(np.min(self.rounds.signal_weights, initial=1.0)),
        )
        while excess(hi) > 0:
            hi *= 2.0
            if hi > 1e12:
                return math.inf
        lam = optimize.brentq(excess, 0.0, hi, xtol=1e-10, rtol=1e-10)
        return float(lam) * self.mu_per_unit

    def to_details(self) -> dict:
        return {
            "statistic": self.z,
            "num_scores": self.num_scores,
            "round_sums": [float(v) for v in self.rounds.sums],
            "round_counts": [int(v) for v in self.rounds.counts],
            "dof": "inf" if math.isinf(self.rounds.dof) else self.rounds.dof,
            "lam_claim": self.lam_claim,
            "mu_per_unit": self.mu_per_unit,
            **(
                {}
                if self.rounds.weights is None
                else {"round_weights": [float(v) for v in self.rounds.weights]}
            ),
        }

    @classmethod
    def from_details(cls, details: dict) -> NormalScoreTest:
        dof = details["dof"]
        rounds = RoundSums(
            np.asarray(details["round_sums"], dtype=np.float64),
            np.asarray(details["round_counts"], dtype=np.int64),
            math.inf if dof == "inf" else float(dof),
            details.get("round_weights"),
        )
        return cls(rounds, float(details["lam_claim"]), float(details["mu_per_unit"]))


def normal_score_test(
    rounds: RoundSums, *, claim_mu: float, claim_participations: int = 1
) -> NormalScoreTest:
    """The exact test of a Gaussian-DP claim on per-release sums (module docstring).

    Parameters
    ----------
    rounds : RoundSums
        The seen canaries' per-release sums (:attr:`flaudit.auditor.claims.known_rounds.KnownRoundsStatistic.rounds`,
        :func:`final_model_rounds`, or :meth:`RoundSums.from_scores` for independent scores).
    claim_mu : float
        The claimed ``mu`` for ``claim_participations`` participations (``sqrt(r)/z`` for the
        known-rounds claim with ``r`` repeats; the whole claim for the final model).
    claim_participations : int
        ``r``, the participations ``claim_mu`` is for.

    Returns
    -------
    NormalScoreTest
    """
    if not isinstance(rounds, RoundSums):
        raise TypeError(f"rounds must be a RoundSums, got {type(rounds).__name__}")
    if claim_mu < 0 or not math.isfinite(claim_mu):
        raise ValueError(f"claim_mu must be finite and >= 0, got {claim_mu!r}")
    if claim_participations < 1:
        raise ValueError(f"claim_participations must be >= 1, got {claim_participations!r}")
    lam = claim_mu / math.sqrt(claim_participations)
    return NormalScoreTest(rounds, float(lam), math.sqrt(claim_participations))
