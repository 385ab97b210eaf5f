"""The known-rounds statistic for the all-iterates threat model (issue #10 item 5).

The auditor knows the rounds ``R_j`` in which each seen canary ``j`` was inserted. For the
adversary who knows those rounds and sees every released aggregate ``rho_bar_t`` (what DP-FedAvg
releases, before the server optimizer), the natural statistic of canary ``j`` is the sum of its
per-round cosines over its own rounds, each mapped to its *normal score* under the exact null:

    Z_jt = Phi^-1(F_d(cos(c_j, rho_bar_t))),   score_j = sum_{t in R_j} Z_jt / sqrt(|R_j|).

``F_d`` is the law of the cosine between a uniformly random unit vector and any vector independent
of it (:func:`flaudit.auditor.estimators.null.null_probit`): for a canary absent from round ``t``
its direction is independent of ``rho_bar_t``, so ``Z_jt`` is *exactly* ``N(0, 1)`` whatever the
mechanism, the task or the noise actually added -- no scale is estimated and no claimed
parameter enters. A DP bug that changes the noise changes the seen scores only.

Under DP-FedAvg with fixed clipping ``S``, expected cohort ``m`` and noise multiplier ``z``, a
seen canary adds ``S/m`` along ``c_j`` and the noise projects onto ``c_j`` with std ``z S / m``,
so one round's score is close to ``N(1/z, 1)`` and the score of a canary seen in ``r`` rounds to
``N(sqrt(r)/z, 1)``: the ``mu = sqrt(r)/z`` Gaussian-DP claim of the known-rounds adversary,
which :mod:`flaudit.auditor.claims` tests (docs/estimators.md, "Normal-score claim tests", proves
that a seen score of any mechanism meeting the claim is stochastically below ``N(mu, 1)``).
For an unseen canary, ``R_j`` is drawn from the same schedule, so seen and unseen scores are
computed the same way (the unseen ones check the null). The measured noise scale of each round
(:func:`noise_scale` on the unseen canaries) is kept as a diagnostic only.

The seen canaries of one round share that round's noise scale (the statistics are studentized
by one ``s``, :func:`flaudit.auditor.statistics.null_standardized_cosines`), so their scores
are not independent. The exact claim test therefore works per round: the seen participants'
studentized values summed, ``R_t = sum_j t_jt / sqrt(c_t)``, which under DP-FedAvg's Gaussian
noise is noncentral Student-t with the scale's ``scale_dof`` degrees of freedom
(:class:`flaudit.auditor.claims.normal_scores.RoundSums`); rounds are independent.

Pure numpy, streaming, ``O(k)`` state (:class:`KnownRoundsState`: plain arrays, no seed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..estimators.null import null_probit, studentized_from_cosine
from ..validation import check_integer_at_least
from .normal_scores import RoundSums

__all__ = ["KnownRoundsStatistic", "KnownRoundsState", "noise_scale"]

#: MAD -> standard deviation for a normal law.
_MAD_TO_STD = 1.482602218505602
#: Null cosines beyond this many robust standard deviations are outliers (a normal law puts
#: 6e-5 of its mass there); the plain RMS is taken over the rest.
_TRIM_AT = 4.0


def noise_scale(null_cosines: np.ndarray) -> float:
    """Robust estimate of the standard deviation of mean-zero noise cosines.

    A first robust scale ``s0 = 1.4826 * median(|x|)`` (the centre is known: a pure-noise cosine
    has mean 0), then the root mean square of the values with ``|x| <= 4 s0``, rescaled for that
    truncation. A few outliers (e.g. a mislabelled seen canary) move it by ``O(outliers / n)``
    of the trimmed tail only, and for normal data it is nearly as efficient as the plain RMS.

    Returns ``nan`` for an empty array and ``0.0`` when every value is 0.
    """
    x = np.abs(np.asarray(null_cosines, dtype=np.float64))
    if x.size == 0:
        return math.nan
    s0 = _MAD_TO_STD * float(np.median(x))
    if s0 == 0.0:
        return float(np.sqrt(np.mean(x * x)))
    kept = x[x <= _TRIM_AT * s0]
    # E[Z^2 | |Z| <= c] for Z ~ N(0, 1): 1 - 2 c phi(c) / (2 Phi(c) - 1)
    c = _TRIM_AT
    phi = math.exp(-0.5 * c * c) / math.sqrt(2 * math.pi)
    mass = math.erf(c / math.sqrt(2))
    factor = 1.0 - 2.0 * c * phi / mass
    return float(math.sqrt(np.mean(kept * kept) / factor))


@dataclass
class KnownRoundsState:
    """Everything needed to resume a :class:`KnownRoundsStatistic` (plain arrays, no seed).

    Attributes
    ----------
    sums : numpy.ndarray
        (k,) ``sum_{t in R_j} Z_jt`` so far (normal scores under the exact null).
    counts : numpy.ndarray
        (k,) ``|R_j|`` so far (int64).
    num_rounds : int
        Rounds folded in (including rounds skipped for want of a noise scale).
    round_sums : numpy.ndarray
        (T',) per round with a seen participant, ``R_t = sum_j t_jt / sqrt(c_t)`` over its seen
        participants' studentized values (float64; empty for a state saved before they
        existed).
    round_counts : numpy.ndarray
        (T',) ``c_t``, the seen participants behind each ``R_t`` (int64).
    round_factors : numpy.ndarray
        (T',) each round's signal factor under the claim
        (:func:`flaudit.auditor.noise_calibration.signal_factor`: its weight over its noise's
        clip-norm factor); empty: all 1 (every round at the claim, a state saved before they
        existed or a run with equal weights and matched noise).
    """

    sums: np.ndarray
    counts: np.ndarray
    num_rounds: int = 0
    round_sums: np.ndarray = field(default_factory=lambda: np.zeros(0))
    round_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    round_factors: np.ndarray = field(default_factory=lambda: np.zeros(0))


class KnownRoundsStatistic:
    """Streaming known-rounds score of every canary (see the module docstring).

    Parameters
    ----------
    num_canaries : int
        ``k`` (seen and unseen canaries alike).
    dim : int
        Model dimension ``d`` (the exact null of a cosine depends on it).
    state : KnownRoundsState, optional
        Resume from a previous :meth:`state` (its arrays are copied).
    min_null : int
        Fewest noise-only cosines a round needs for the diagnostic ``last_noise_scale``.
    scale_dof : int, optional
        Degrees of freedom of the noise scale each round's statistics share
        (:func:`flaudit.auditor.statistics.scale_dof`: ``d - k`` for orthogonal canaries);
        default ``dim`` (plain cosines).
    """

    def __init__(
        self,
        num_canaries: int,
        *,
        dim: int,
        state: KnownRoundsState | None = None,
        min_null: int = 2,
        scale_dof: int | None = None,
    ) -> None:
        check_integer_at_least(num_canaries, "num_canaries", 1)
        check_integer_at_least(dim, "dim", 2)
        check_integer_at_least(min_null, "min_null", 1)
        if scale_dof is not None:
            check_integer_at_least(scale_dof, "scale_dof", 1)
        self.num_canaries, self.dim, self.min_null = num_canaries, dim, min_null
        self.scale_dof = int(dim if scale_dof is None else scale_dof)
        k = self.num_canaries
        self._round_sums: list[float] = []
        self._round_counts: list[int] = []
        self._round_factors: list[float] = []
        if state is None:
            self._sums = np.zeros(k, dtype=np.float64)
            self._counts = np.zeros(k, dtype=np.int64)
            self._num_rounds = 0
        else:
            if not isinstance(state, KnownRoundsState):
                raise ValueError(f"state must be a KnownRoundsState, got {type(state).__name__}")
            sums = np.array(state.sums, dtype=np.float64)
            counts = np.array(state.counts, dtype=np.int64)
            if sums.shape != (k,) or counts.shape != (k,):
                raise ValueError(
                    f"state arrays must have shape ({k},), got {sums.shape} and {counts.shape}"
                )
            if not np.all(np.isfinite(sums)) or np.any(counts < 0):
                raise ValueError("state.sums must be finite and state.counts >= 0")
            self._sums, self._counts = sums, counts
            self._round_sums = [float(v) for v in np.asarray(state.round_sums, dtype=np.float64)]
            self._round_counts = [int(v) for v in np.asarray(state.round_counts, dtype=np.int64)]
            if len(self._round_sums) != len(self._round_counts):
                raise ValueError("state.round_sums and state.round_counts differ in length")
            factors = [float(v) for v in np.asarray(state.round_factors, dtype=np.float64)]
            if factors and len(factors) != len(self._round_sums):
                raise ValueError("state.round_factors and state.round_sums differ in length")
            if not all(math.isfinite(v) and v >= 1.0 for v in factors):
                raise ValueError("state.round_factors must be finite and >= 1")
            self._round_factors = factors or [1.0] * len(self._round_sums)
            num_rounds = (
                int(state.num_rounds)
                if isinstance(state.num_rounds, np.integer)
                else state.num_rounds
            )
            check_integer_at_least(num_rounds, "state.num_rounds", 0)
            self._num_rounds = num_rounds
        self.last_noise_scale: float = math.nan

    def _mask(self, value, name: str) -> np.ndarray:
        array = np.asarray(value)
        if array.shape != (self.num_canaries,):
            raise ValueError(f"{name} must have shape ({self.num_canaries},), got {array.shape}")
        if array.dtype != np.bool_:
            raise ValueError(f"{name} must be boolean, got dtype {array.dtype}")
        return array

    def update(
        self,
        round_cosines: np.ndarray,
        participants: np.ndarray,
        null_mask: np.ndarray,
        *,
        factor: float = 1.0,
    ) -> None:
        """Fold in one round.

        Parameters
        ----------
        round_cosines : numpy.ndarray
            (k,) ``cos(c_j, rho_bar_t)`` of this round's released aggregate.
        participants : numpy.ndarray of bool
            (k,) canary ``j`` is counted in round ``t`` (seen: actually inserted; unseen: its
            rounds drawn from the same schedule).
        null_mask : numpy.ndarray of bool
            (k,) canaries whose cosine this round is pure noise (the unseen canaries): the
            round's noise scale is measured on them (:func:`noise_scale`) as a diagnostic
            (``last_noise_scale``); the others among the participants (the seen canaries
            inserted) make the round's entry of :attr:`rounds`.
        factor : float
            The round's signal factor under the claim (at least 1:
            :func:`flaudit.auditor.noise_calibration.signal_factor` of its weight factor and
            its noise's clip-norm factor); its claim test runs at it (:meth:`rounds_at`).

        Raises
        ------
        ValueError
            On a wrong shape or dtype, or a NaN/Inf cosine (nothing is changed then).
        """
        cos = np.asarray(round_cosines, dtype=np.float64)
        if cos.shape != (self.num_canaries,):
            raise ValueError(
                f"round_cosines must have shape ({self.num_canaries},), got {cos.shape}"
            )
        if not np.all(np.isfinite(cos)):
            raise ValueError("round_cosines contains NaN or Inf")
        if not (math.isfinite(factor) and factor >= 1.0):
            raise ValueError(f"factor must be finite and >= 1, got {factor!r}")
        part = self._mask(participants, "participants")
        null = self._mask(null_mask, "null_mask")
        self._num_rounds += 1
        self.last_noise_scale = (
            noise_scale(cos[null]) if int(null.sum()) >= self.min_null else math.nan
        )
        if part.any():
            self._sums[part] += null_probit(cos[part], self.dim)
            self._counts[part] += 1
        seen = part & ~null
        count = int(seen.sum())
        if count:
            studentized = studentized_from_cosine(cos[seen], self.scale_dof, self.dim)
            self._round_sums.append(float(np.sum(studentized)) / math.sqrt(count))
            self._round_counts.append(count)
            self._round_factors.append(float(factor))

    @property
    def scores(self) -> np.ndarray:
        """(k,) ``sum_{t in R_j} Z_jt / sqrt(|R_j|)``; NaN where ``|R_j| = 0``."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self._counts > 0, self._sums / np.sqrt(self._counts), np.nan)

    @property
    def rounds(self) -> RoundSums:
        """The per-round sums of the seen participants' studentized values, for the exact
        claim test (:class:`flaudit.auditor.claims.normal_scores.RoundSums`), each round
        weighted by its signal factor relative to the unweighted claim (:meth:`rounds_at`)."""
        return self.rounds_at(1.0)

    @property
    def max_round_factor(self) -> float:
        """The largest round signal factor (1 with none)."""
        return max(self._round_factors, default=1.0)

    def rounds_at(self, influence: float) -> RoundSums:
        """:attr:`rounds` for a claim tested at ``influence`` times the unweighted one (the
        claims of :func:`flaudit.auditor.claims.audit_claims` with ``weight_factor =
        influence``): round ``t``'s weight is ``factor_t / influence``, so its noncentrality
        under the claim is ``sqrt(c_t) factor_t / z``, its own, whatever the influence the
        claim is stated at (issue #38). No weights (None) when every round is at the
        influence, so a run with equal weights and matched noise is tested as before."""
        influence = float(influence)
        if not (math.isfinite(influence) and influence > 0):
            raise ValueError(f"influence must be finite and > 0, got {influence!r}")
        factors = np.array(self._round_factors, dtype=np.float64)
        weights = None if np.all(factors == influence) else factors / influence
        return RoundSums(
            np.array(self._round_sums, dtype=np.float64),
            np.array(self._round_counts, dtype=np.int64),
            float(self.scale_dof),
            weights,
        )

    @property
    def num_participations(self) -> np.ndarray:
        """(k,) ``|R_j|``: rounds counted for each canary so far."""
        return self._counts.copy()

    @property
    def num_rounds(self) -> int:
        """Rounds folded in so far."""
        return self._num_rounds

    def state(self) -> KnownRoundsState:
        """A copy of the running sums and counts (resumable; no seed, no cosines of old rounds)."""
        return KnownRoundsState(
            sums=self._sums.copy(),
            counts=self._counts.copy(),
            num_rounds=self._num_rounds,
            round_sums=np.array(self._round_sums, dtype=np.float64),
            round_counts=np.array(self._round_counts, dtype=np.int64),
            round_factors=np.array(
                [] if all(v == 1.0 for v in self._round_factors) else self._round_factors,
                dtype=np.float64,
            ),
        )
