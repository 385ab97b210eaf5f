"""epsilon_lo: a high-confidence lower bound on epsilon from a threshold test on canary cosines
(Andrew et al. 2023 §5.1, after Jagielski et al. 2020 and Zanella-Béguelin et al. 2022).

The test says "seen" when a cosine exceeds a threshold ``a``. Its false-negative rate (seen
canaries at or below ``a``) gets a Jeffreys upper confidence bound; its false-positive rate is
either exact from the null cosine distribution (final model, dimension ``d`` known and no unseen
canaries given) or a Jeffreys upper bound on the unseen canaries. Any (epsilon, delta)-DP
mechanism satisfies ``FPR + e^eps FNR >= 1 - delta`` and ``FNR + e^eps FPR >= 1 - delta``, so

    eps_lo(a) = max(log((1 - delta - FPR_hi) / FNR_hi), log((1 - delta - FNR_hi) / FPR_hi)).

How the threshold is chosen is a small strategy type (:class:`NoCorrection`,
:class:`Bonferroni`, :class:`Split`), in the style of jax_privacy's auditing module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special

from ..results import Correction, EpsilonResult, Estimator
from ._validation import check_confidence, check_delta, check_dim, check_scores
from .null import EXACT_NULL_BELOW_DIM, null_logsf

__all__ = [
    "NoCorrection",
    "Bonferroni",
    "GDP_BONFERRONI",
    "Split",
    "epsilon_lower_bound",
    "jeffreys_upper",
    "clopper_pearson_upper",
    "search_thresholds",
    "threshold_counts",
]


@dataclass(frozen=True)
class NoCorrection:
    """The paper's choice: the maximum over every threshold, no multiplicity correction.

    Optimistic: the maximum of many 95% bounds is not a 95% bound.

    Parameters
    ----------
    paper_exact : bool
        ``False`` (default): a cosine above the threshold is a positive (seen <= a counts as a
        false negative) and, with unseen canaries, each rate gets ``alpha / 2`` (union bound).
        ``True``: the rule of the authors' code (``one_shot_epe``'s
        ``optimal_epsilon_lower_bound``), used by :func:`epsilon_lower_bound`: a cosine at or
        above the threshold is a positive, each rate gets the full ``alpha``, and the exact
        null is replaced by ``N(0, 1/d)`` from ``d >= 1000`` on. For reproducing the paper.
    """

    paper_exact: bool = False
    kind = Correction.none


@dataclass(frozen=True)
class Bonferroni:
    """Valid: ``num_thresholds`` thresholds at quantiles of the seen cosines, each bound at
    level ``alpha / num_thresholds``; the maximum holds with the stated confidence.

    By default the quantiles are evenly spaced, ``(i + 1/2) / num_thresholds``. ``quantiles``
    places them explicitly (``num_thresholds`` is then ``len(quantiles)``): fixed in advance,
    so as valid as the even grid. :data:`GDP_BONFERRONI` is the choice for Gaussian-DP bounds.
    """

    num_thresholds: int = 20
    quantiles: tuple[float, ...] | None = None
    kind = Correction.bonferroni

    def __post_init__(self) -> None:
        if self.quantiles is not None:
            q = tuple(float(x) for x in self.quantiles)
            if not q or any(not 0.0 < x < 1.0 for x in q):
                raise ValueError(
                    f"quantiles must be a non-empty sequence in (0, 1), got {self.quantiles!r}"
                )
            object.__setattr__(self, "quantiles", q)
            object.__setattr__(self, "num_thresholds", len(q))
        if not isinstance(self.num_thresholds, int) or self.num_thresholds < 1:
            raise ValueError(f"num_thresholds must be an integer >= 1, got {self.num_thresholds!r}")

    def seen_quantiles(self) -> np.ndarray:
        """The quantiles of the seen scores the thresholds sit at."""
        if self.quantiles is not None:
            return np.asarray(self.quantiles, dtype=np.float64)
        return (np.arange(self.num_thresholds) + 0.5) / self.num_thresholds


#: Thresholds for Gaussian-DP bounds and claim tests with the null from unseen canaries: the
#: seen-score quantiles 0.15 and 0.30 (Bonferroni over 2). For a mu-GDP ROC the best single
#: threshold sits near FNR = Phi(-mu / 2) (0.2-0.3 for mu = 1-2), where both rates' Clopper-
#: Pearson bounds are tightest in probit space; two thresholds there beat 20 spread over (0, 1)
#: and the ROC-hull thresholds of jax_privacy's epsilon_from_gdp (docs/fidelity.md, "Peer").
#: The price: mu_lo saturates earlier for very large mu (about 3.4 at 500 unseen canaries).
GDP_BONFERRONI = Bonferroni(quantiles=(0.15, 0.30))


@dataclass(frozen=True)
class Split:
    """Valid: the threshold is chosen (uncorrected) on a random ``frac`` of the canaries and the
    bound is computed on the rest at full confidence. ``seed`` only drives that split (it is not
    the secret canary seed)."""

    frac: float = 0.5
    seed: int = 0
    kind = Correction.split

    def __post_init__(self) -> None:
        if not (0.0 < float(self.frac) < 1.0):
            raise ValueError(f"frac must be in (0, 1), got {self.frac!r}")


CorrectionStrategy = NoCorrection | Bonferroni | Split


def jeffreys_upper(failures, trials, alpha: float) -> np.ndarray:
    """One-sided upper Jeffreys bound on a binomial rate: the ``1 - alpha`` quantile of
    ``Beta(x + 1/2, n - x + 1/2)``, and 1 when ``x = n``."""
    x = np.asarray(failures, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    upper = special.betaincinv(x + 0.5, np.maximum(n - x, 0.0) + 0.5, 1.0 - alpha)
    return np.where(x >= n, 1.0, upper)


def _eps_at(log_fpr: np.ndarray, log_fnr: np.ndarray, delta: float) -> np.ndarray:
    """Vectorised eps(a) from log upper bounds on FPR and FNR (clipped at 0)."""
    fpr, fnr = np.exp(log_fpr), np.exp(log_fnr)
    with np.errstate(divide="ignore", invalid="ignore"):
        one = np.where(
            1 - delta - fpr > 0, np.log(np.maximum(1 - delta - fpr, 1e-300)) - log_fnr, -np.inf
        )
        two = np.where(
            1 - delta - fnr > 0, np.log(np.maximum(1 - delta - fnr, 1e-300)) - log_fpr, -np.inf
        )
    return np.maximum(np.maximum(one, two), 0.0)


def clopper_pearson_upper(failures, trials, alpha: float) -> np.ndarray:
    """One-sided upper Clopper-Pearson bound on a binomial rate: the ``1 - alpha`` quantile of
    ``Beta(x + 1, n - x)``, and 1 when ``x = n``. Exactly conservative (coverage >= 1 - alpha
    for every rate), unlike :func:`jeffreys_upper`."""
    x = np.asarray(failures, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    upper = special.betaincinv(x + 1.0, np.maximum(n - x, 1.0), 1.0 - alpha)
    return np.where(x >= n, 1.0, upper)


def threshold_counts(
    seen: np.ndarray,
    unseen: np.ndarray | None,
    thresholds: np.ndarray,
    *,
    inclusive: bool = False,
) -> tuple[np.ndarray, np.ndarray | None]:
    """False negatives (seen ``<= a``) and false positives (unseen ``> a``, None without unseen)
    of the test "seen when the score exceeds ``a``", at every threshold ``a``. ``inclusive``:
    the test "seen when the score is at least ``a``" (seen ``< a``, unseen ``>= a``)."""
    side = "left" if inclusive else "right"
    below = np.searchsorted(np.sort(seen), thresholds, side=side)
    if unseen is None:
        return below, None
    return below, unseen.size - np.searchsorted(np.sort(unseen), thresholds, side=side)


def threshold_bounds(
    seen: np.ndarray,
    unseen: np.ndarray | None,
    d: int | None,
    thresholds: np.ndarray,
    alpha: float,
    upper=jeffreys_upper,
    paper_exact: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """log FPR and log FNR upper bounds at every threshold, simultaneously at level alpha
    (``paper_exact``: the authors' rule, see :class:`NoCorrection`)."""
    below, above = threshold_counts(seen, unseen, thresholds, inclusive=paper_exact)
    if unseen is None:
        fnr = upper(below, seen.size, alpha)
        if paper_exact and d >= EXACT_NULL_BELOW_DIM:
            log_fpr = special.log_ndtr(-thresholds * math.sqrt(d))
        else:
            log_fpr = null_logsf(thresholds, d)
    else:
        rate_alpha = alpha if paper_exact else alpha / 2  # union bound over the two rates
        fnr = upper(below, seen.size, rate_alpha)
        with np.errstate(divide="ignore"):
            log_fpr = np.log(upper(above, unseen.size, rate_alpha))
    with np.errstate(divide="ignore"):
        return log_fpr, np.log(fnr)


def _candidate_thresholds(seen: np.ndarray, unseen: np.ndarray | None) -> np.ndarray:
    pooled = seen if unseen is None else np.concatenate([seen, unseen])
    return np.unique(pooled)


@dataclass(frozen=True)
class ThresholdChoice:
    """Outcome of :func:`search_thresholds`: the best value of an objective and where it was."""

    value: float
    index: int  # into the evaluated thresholds (-1 when none)
    threshold: float  # nan when none
    thresholds: np.ndarray  # the thresholds the final value was computed over
    seen: np.ndarray  # the canaries the final value was computed on
    unseen: np.ndarray | None
    note: str | None = None

    def details(self, fpr_upper: float, fnr_upper: float) -> dict[str, Any]:
        """The choice as a result's ``details`` report it, with the rate bounds at it."""
        return {
            "threshold": None if math.isnan(self.threshold) else self.threshold,
            "fpr_upper": fpr_upper,
            "fnr_upper": fnr_upper,
            "num_thresholds": int(np.size(self.thresholds)),
            "num_seen": int(self.seen.size),
            "num_unseen": None if self.unseen is None else int(self.unseen.size),
        }


def search_thresholds(
    seen: np.ndarray,
    unseen: np.ndarray | None,
    *,
    correction: CorrectionStrategy,
    evaluate,
    empty_value: float,
) -> ThresholdChoice:
    """The threshold machinery shared by every threshold-test bound (epsilon_lo, mu_lo, the
    claim test): candidate thresholds and multiplicity from ``correction``.

    ``evaluate(seen, unseen, thresholds, multiplicity)`` returns one value per threshold
    (higher is better) computed at level ``alpha / multiplicity``. :class:`NoCorrection` tries
    every distinct score at multiplicity 1 (not valid); :class:`Bonferroni` tries
    ``num_thresholds`` quantiles of the seen scores at multiplicity ``num_thresholds`` (the
    quantiles of the seen scores do not invalidate the bound on their FNR: at the ``j``-th
    order statistic the true FNR is ``Beta(j, n - j + 1)``, stochastically below the upper
    bounds' ``Beta(j + 1/2, ...)`` or ``Beta(j + 1, ...)``); :class:`Split` picks the best
    threshold on a random ``frac`` of the canaries and evaluates it on the rest.
    """
    if isinstance(correction, NoCorrection):
        thresholds = _candidate_thresholds(seen, unseen)
        values = evaluate(seen, unseen, thresholds, 1)
    elif isinstance(correction, Bonferroni):
        q = correction.seen_quantiles()
        # Just below each quantile, so the test "score > a" counts a seen score equal to the
        # quantile as a positive: with ties (e.g. every seen score at the cosine's maximum 1.0
        # in a run without noise) a threshold AT the tied value would count every seen canary
        # as a false negative. Still valid: a seen count below the j-th order statistic is at
        # most j - 1, whose true rate is Beta(j, n - j + 1) (left limits for ties), which the
        # upper bounds' Beta(x + 1/2, ...) / Beta(x + 1, ...) at x = j - 1 cover.
        thresholds = np.unique(np.nextafter(np.quantile(seen, q), -np.inf))
        values = evaluate(seen, unseen, thresholds, correction.num_thresholds)
    else:
        rng = np.random.default_rng(correction.seed)
        pick_seen = rng.random(seen.size) < correction.frac
        pick_unseen = None if unseen is None else rng.random(unseen.size) < correction.frac
        sel_seen, used_seen = seen[pick_seen], seen[~pick_seen]
        if unseen is None:
            sel_unseen = used_unseen = None
        else:
            sel_unseen, used_unseen = unseen[pick_unseen], unseen[~pick_unseen]
        if (
            sel_seen.size == 0
            or used_seen.size == 0
            or (unseen is not None and (sel_unseen.size == 0 or used_unseen.size == 0))
        ):
            return ThresholdChoice(
                empty_value,
                -1,
                math.nan,
                np.empty(0),
                used_seen,
                used_unseen,
                "too few canaries to split",
            )
        cand = _candidate_thresholds(sel_seen, sel_unseen)
        chosen = cand[int(np.argmax(evaluate(sel_seen, sel_unseen, cand, 1)))]
        thresholds = np.array([chosen])
        values = evaluate(used_seen, used_unseen, thresholds, 1)
        seen, unseen = used_seen, used_unseen
    i = int(np.argmax(values))
    return ThresholdChoice(float(values[i]), i, float(thresholds[i]), thresholds, seen, unseen)


def check_threshold_inputs(seen, unseen, d, correction, threat_model=None):
    """Validated ``(seen, unseen, d, threat_model)`` for a threshold-test bound; ``d`` is
    required without ``unseen`` (exact null FPR). ``threat_model`` labels the result: default
    ``final_model`` with the exact null, else ``all_iterates``. Raises ``ValueError`` naming the
    argument."""
    seen = check_scores(seen, "seen")
    if unseen is None:
        if d is None:
            raise ValueError("d is required when unseen is not given (exact null FPR)")
        d = check_dim(d)
    else:
        unseen = check_scores(unseen, "unseen")
        if d is not None:
            d = check_dim(d)
    if not isinstance(correction, (NoCorrection, Bonferroni, Split)):
        raise ValueError(
            f"correction must be NoCorrection(), Bonferroni() or Split(), got {correction!r}"
        )
    if threat_model is None:
        threat_model = "final_model" if unseen is None else "all_iterates"
    return seen, unseen, d, threat_model


def threshold_multiplicity(correction: CorrectionStrategy) -> int:
    """How many thresholds the level is shared by: ``num_thresholds`` under Bonferroni, else 1."""
    return correction.num_thresholds if isinstance(correction, Bonferroni) else 1


def epsilon_lower_bound(
    seen,
    unseen=None,
    *,
    d: int | None = None,
    delta: float,
    confidence: float = 0.95,
    correction: CorrectionStrategy = NoCorrection(),
    threat_model: str | None = None,
) -> EpsilonResult:
    """Lower confidence bound epsilon_lo from a threshold test on canary cosines.

    Parameters
    ----------
    seen : array_like
        Cosines of the seen (inserted) canaries.
    unseen : array_like, optional
        Cosines of the unseen canaries. When omitted, ``d`` is required and the false-positive
        rate comes exactly from the null cosine distribution in dimension ``d``.
    d : int, optional
        Model dimension (required when ``unseen`` is None).
    delta : float
        Target delta in (0, 1).
    confidence : float
        Confidence level of the bound (0.95: the paper's alpha = 0.05).
    correction : NoCorrection, Bonferroni or Split
        How the threshold is chosen (see the classes). Default: the paper's uncorrected maximum.
    threat_model : str, optional
        Label for the result; default ``final_model`` with exact null, else ``all_iterates``.

    Returns
    -------
    EpsilonResult
        ``details``: ``threshold``, ``fpr_upper``, ``fnr_upper``, ``num_thresholds``,
        ``num_seen``, ``num_unseen`` and ``fpr`` ("exact null" or "jeffreys").
    """
    seen, unseen, d, threat_model = check_threshold_inputs(
        seen, unseen, d, correction, threat_model
    )
    delta = check_delta(delta)
    confidence = check_confidence(confidence)
    alpha = 1.0 - confidence
    details: dict = {}
    paper_exact = isinstance(correction, NoCorrection) and correction.paper_exact

    def evaluate(s_, u_, thresholds, multiplicity):
        log_fpr, log_fnr = threshold_bounds(
            s_, u_, d, thresholds, alpha / multiplicity, paper_exact=paper_exact
        )
        return _eps_at(log_fpr, log_fnr, delta)

    choice = search_thresholds(
        seen, unseen, correction=correction, evaluate=evaluate, empty_value=0.0
    )
    eps, thresholds = choice.value, choice.thresholds
    used_seen, used_unseen = choice.seen, choice.unseen
    fpr = fnr = 1.0
    if choice.note:
        details["note"] = choice.note
    else:
        log_fpr, log_fnr = threshold_bounds(
            used_seen,
            used_unseen,
            d,
            thresholds[[choice.index]],
            alpha / threshold_multiplicity(correction),
            paper_exact=paper_exact,
        )
        fpr, fnr = float(np.exp(log_fpr[0])), float(np.exp(log_fnr[0]))
    label = {
        Correction.none: (
            "max over all thresholds, uncorrected (the paper's; NOT a valid 95% bound "
            "near epsilon 0, see docs/fidelity.md)"
        )
        + (
            "; the authors' rule: cos >= a is a positive, alpha for each rate"
            if paper_exact
            else ""
        ),
        Correction.bonferroni: "Bonferroni over the thresholds tried",
        Correction.split: f"threshold chosen on a {correction.frac if isinstance(correction, Split) else ''} split",
    }[correction.kind]
    details.update(choice.details(fpr, fnr), fpr="exact null" if unseen is None else "jeffreys")
    if paper_exact:
        details["rule"] = "paper_exact"
    return EpsilonResult(
        epsilon=float(eps),
        estimator=Estimator.lower_bound,
        threat_model=threat_model,
        delta=delta,
        correction=correction.kind,
        confidence=confidence,
        method="threshold test on cosines: Jeffreys upper bound on FNR, "
        + ("exact null CDF for FPR" if unseen is None else "Jeffreys upper bound on FPR")
        + f"; {label} (Andrew et al. §5.1); the intervals take the scores as independent "
        "(one release's scores share its noise scale: docs/estimators.md)",
        details=details,
    )
