"""Tests of a claimed trade-off curve against the canary scores: :func:`claim_test` (a p-value
for the observed counts against the claimed curve ``f``) and the one-run f-DP audit of
Mahloujifar, Melis & Chaudhuri (ICML 2025), :func:`fdp_one_run_p_value` /
:func:`fdp_one_run_lower_bound`, with the claimed curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import special

from ..estimators.gdp import (
    GaussianDPResult,
    correction_label,
    gdp_epsilon,
)
from ..estimators.lower_bound import (
    GDP_BONFERRONI,
    CorrectionStrategy,
    check_threshold_inputs,
    search_thresholds,
    threshold_counts,
)
from ..estimators.null import null_logsf
from ..estimators.one_run import check_guess_inputs, guess_details
from ..results import Correction, Estimator, jsonable
from .curves import EpsilonDeltaCurveClaim, GaussianDPClaim, NoDPClaim, TradeOffClaim

__all__ = ["ClaimTestResult", "claim_test", "fdp_one_run_p_value", "fdp_one_run_lower_bound"]


@dataclass(frozen=True)
class ClaimTestResult:
    """A p-value for canary scores against a claimed trade-off curve.

    ``p_value`` is small when the scores are unlikely under every mechanism satisfying the
    claim; ``rejected(alpha)`` is the level-``alpha`` test. A :class:`NoDPClaim` gives
    ``p_value = 1`` and ``has_claim = False``.
    """

    p_value: float
    claim: TradeOffClaim
    threat_model: str
    correction: Correction
    method: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def has_claim(self) -> bool:
        return bool(self.claim.is_claim)

    def rejected(self, alpha: float) -> bool:
        return self.has_claim and self.p_value <= alpha

    def to_dict(self) -> dict[str, Any]:
        return {
            "p_value": self.p_value,
            "claim": self.claim.to_dict(),
            "threat_model": self.threat_model,
            "correction": self.correction.value,
            "method": self.method,
            "details": jsonable(self.details),
        }


# -- the claim test ------------------------------------------------------------------------------


def _claim_p_values(seen, unseen, d, thresholds, claim, multiplicity):
    """Per-threshold p-values (times ``multiplicity``, capped at 1) of the observed counts
    against the claimed curve: see :func:`claim_test`."""
    below, above = threshold_counts(seen, unseen, thresholds)
    n_s = seen.size
    if unseen is None:
        fpr = np.exp(null_logsf(thresholds, d))
        p = special.bdtr(below, n_s, np.clip(claim.tradeoff(fpr), 0.0, 1.0))
        p = np.where(below >= n_s, 1.0, p)
    else:
        n_u = unseen.size

        def g1(x):  # P[Bin(n_u, x) <= observed FP]: decreasing in x
            return np.where(above >= n_u, 1.0, special.bdtr(above, n_u, x))

        def g2(x):  # P[Bin(n_s, f(x)) <= observed FN]: increasing in x
            return np.where(below >= n_s, 1.0, special.bdtr(below, n_s, claim.tradeoff(x)))

        # sup over the curve of min(g1, g2) is at their crossing: bisect in log x
        lo = np.full(thresholds.shape, -40.0)
        hi = np.zeros(thresholds.shape)
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            x = np.exp(mid)
            left = g1(x) > g2(x)
            lo = np.where(left, mid, lo)
            hi = np.where(left, hi, mid)
        x_lo, x_hi = np.exp(lo), np.exp(hi)
        best = np.maximum(np.minimum(g1(x_lo), g2(x_lo)), np.minimum(g1(x_hi), g2(x_hi)))
        # x below e^-40: g1 ~ 1 there, so the sup is at least g2(0) = P[Bin(n_s, f(0)) <= FN]
        best = np.maximum(best, np.minimum(g1(np.zeros_like(x_lo)), g2(np.zeros_like(x_lo))))
        p = 2.0 * best
    return np.minimum(1.0, multiplicity * p)


def claim_test(
    seen,
    unseen=None,
    *,
    claim: TradeOffClaim,
    d: int | None = None,
    correction: CorrectionStrategy = GDP_BONFERRONI,
    threat_model: str | None = None,
) -> ClaimTestResult:
    """p-value of the canary scores against a claimed trade-off curve ``f``.

    If the mechanism satisfies ``f``, the test "seen when the score exceeds ``a``" has rates
    ``(p, q)`` with ``q >= f(p)`` at every threshold. With the final-model exact null, ``p`` is
    known and the p-value at ``a`` is the exact binomial ``P[Bin(n_seen, f(p)) <= FN]``. With
    unseen canaries, the p-value at ``a`` is

        2 * sup_x min(P[Bin(n_unseen, x) <= FP], P[Bin(n_seen, f(x)) <= FN]),

    valid because at the true point one of the two binomial tails must be small (a union bound
    at ``alpha / 2`` each; equivalently, ``f`` passes below the Clopper-Pearson rectangle of
    the two rates). For a GDP claim ``mu0`` this rejects at level ``alpha`` exactly when the
    Clopper-Pearson ``mu_lo`` of that threshold exceeds ``mu0``. Over thresholds: Bonferroni
    (``num_thresholds`` times the smallest), Split, or the uncorrected minimum (not valid).

    Parameters
    ----------
    seen, unseen, d
        As for :func:`gdp_lower_bound`.
    claim : GaussianDPClaim, EpsilonDeltaCurveClaim or NoDPClaim
        The claimed curve (see :func:`audit_claims`).
    correction : Bonferroni, Split or NoCorrection
        Threshold strategy.
    threat_model : str, optional
        Label; default ``final_model`` with the exact null, else ``all_iterates``.

    Returns
    -------
    ClaimTestResult
    """
    seen, unseen, d, threat_model = check_threshold_inputs(
        seen, unseen, d, correction, threat_model
    )
    if not isinstance(claim, (GaussianDPClaim, EpsilonDeltaCurveClaim, NoDPClaim)):
        raise ValueError(f"claim must be a trade-off claim, got {type(claim).__name__}")
    method = (
        "exact binomial test of the false negatives against the claimed curve at the exact-null FPR"
        if unseen is None
        else "2 * sup over the claimed curve of min(binomial tails of false positives, false negatives)"
    ) + f"; {correction_label(correction)}"
    if not claim.is_claim:
        return ClaimTestResult(
            1.0,
            claim,
            threat_model,
            correction.kind,
            "no DP claim: nothing to test",
            {"note": claim.description},
        )

    def evaluate(s_, u_, thresholds, multiplicity):
        return -_claim_p_values(s_, u_, d, thresholds, claim, multiplicity)

    choice = search_thresholds(
        seen, unseen, correction=correction, evaluate=evaluate, empty_value=-1.0
    )
    details: dict[str, Any] = {
        "threshold": None if math.isnan(choice.threshold) else choice.threshold,
        "num_thresholds": int(choice.thresholds.size),
        "num_seen": int(choice.seen.size),
        "num_unseen": None if choice.unseen is None else int(choice.unseen.size),
    }
    if choice.note:
        details["note"] = choice.note
    return ClaimTestResult(
        float(min(1.0, -choice.value)), claim, threat_model, correction.kind, method, details
    )


# -- one-run f-DP audit (Mahloujifar, Melis & Chaudhuri, ICML 2025) ------------------------------


def _inverse_blow_up(claim: TradeOffClaim, y: np.ndarray) -> np.ndarray:
    """``B^-1(y) = inf {x : 1 - f(x) >= y}``: the smallest FPR at which a test of the claimed
    curve can reach power ``y``. Closed form for GDP (``Phi(Phi^-1(y) - mu)``), bisection
    otherwise (``1 - f`` is nondecreasing)."""
    y = np.clip(np.asarray(y, dtype=np.float64), 0.0, 1.0)
    if isinstance(claim, GaussianDPClaim):
        with np.errstate(divide="ignore"):
            return special.ndtr(special.ndtri(y) - claim.mu)
    lo, hi = np.zeros_like(y), np.ones_like(y)
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        ok = 1.0 - claim.tradeoff(mid) >= y
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid)
    return hi


def _guess_game_feasible(claim, tau: np.ndarray, correct: int, guesses: int, m: int) -> np.ndarray:
    """Whether an f-DP mechanism can make ``>= correct`` of ``guesses`` guesses right with
    probability ``>= tau`` (vectorised over ``tau``): the backward recursion of Mahloujifar et
    al. over the number of correct guesses, for the binary guessing game (each of ``m`` canaries
    included by a fair coin; the adversary guesses on ``guesses`` of them and abstains on the
    rest). Infeasible at ``tau`` means: under the claim, ``P[>= correct right] < tau``."""
    scale = np.asarray(tau, dtype=np.float64) / m
    r = scale * correct  # mass of the "correct" side at the last level
    h = scale * (guesses - correct)  # mass of the "wrong" side
    for i in range(correct - 1, -1, -1):
        h_next = np.maximum(h, _inverse_blow_up(claim, r))
        r = r + (i / (guesses - i)) * (h_next - h)
        h = h_next
    return r + h <= guesses / m


def fdp_one_run_p_value(claim: TradeOffClaim, correct: int, guesses: int, m: int) -> float:
    """Smallest ``tau`` at which the guessing-game outcome (``correct`` of ``guesses`` right, ``m``
    canaries) is infeasible under the claimed curve: a p-value for the claim (1 when feasible
    at every level or when there is no claim). Grid passes on ``log tau`` to ~1e-3 relative."""
    if not claim.is_claim or correct <= 0 or guesses <= 0:
        return 1.0
    if bool(_guess_game_feasible(claim, np.array([1.0]), correct, guesses, m)[0]):
        return 1.0
    lo, hi = -60.0, 0.0  # log tau: feasible below lo? then p < e^-60
    if not bool(_guess_game_feasible(claim, np.array([math.exp(lo)]), correct, guesses, m)[0]):
        return math.exp(lo)
    while hi - lo > 1e-3:  # grid passes, vectorised over tau (feasible below p, not above)
        grid = np.linspace(lo, hi, 257)
        feasible = _guess_game_feasible(claim, np.exp(grid), correct, guesses, m)
        first = int(np.argmin(feasible)) if not feasible.all() else grid.size - 1
        lo, hi = float(grid[max(first - 1, 0)]), float(grid[first])
    return math.exp(hi)


def guess_counts(scores: np.ndarray, seen: np.ndarray, grid) -> list[tuple[int, int, int]]:
    """For each ``(k+, k-)`` of ``grid``: ``(k+, k-, correct)``, the number of correct guesses
    when the ``k+`` highest scores are guessed seen and the ``k-`` lowest unseen."""
    order = np.argsort(-scores, kind="stable")
    seen_sorted = seen[order]
    in_prefix = np.concatenate([[0], np.cumsum(seen_sorted)])
    out_suffix = np.concatenate([[0], np.cumsum(~seen_sorted[::-1])])
    return [(kp, km, int(in_prefix[kp] + out_suffix[km])) for kp, km in grid]


def fdp_one_run_lower_bound(
    scores,
    seen_mask,
    *,
    delta: float,
    confidence: float = 0.95,
    claim: TradeOffClaim | None = None,
    grid: list[tuple[int, int]] | None = None,
    threat_model: str = "final_model",
    mu_max: float = 50.0,
) -> GaussianDPResult:
    """One-run f-DP audit (Mahloujifar, Melis & Chaudhuri, ICML 2025) for Gaussian-DP curves.

    Canaries are included independently by fair coins (robust to any dependence between
    canaries, as Steinke et al.'s bound). Guess IN for the ``k+`` highest scores and OUT for
    the ``k-`` lowest; for each ``(k+, k-)`` of the grid (Bonferroni over its size), ``mu_lo``
    is the largest ``mu`` whose ``mu``-GDP curve makes the observed number of correct guesses
    infeasible at level ``alpha / len(grid)`` (bisection on ``mu``; feasibility is monotone in
    ``mu``). ``.epsilon`` reads ``mu_lo`` at ``delta``. When ``claim`` is given, ``details``
    also has ``claim_p_value``: the Bonferroni p-value of the outcome under that curve (GDP or
    an (epsilon, delta) curve).

    Returns
    -------
    GaussianDPResult
        ``details``: ``mu``, ``k_plus``, ``k_minus``, ``correct``, ``guesses``, ``m``,
        ``grid_size`` and, with a claim, ``claim_p_value``.
    """
    scores, seen, delta, confidence, grid = check_guess_inputs(
        scores, seen_mask, delta, confidence, grid
    )
    m = scores.size
    beta = (1.0 - confidence) / len(grid)
    counts = guess_counts(scores, seen, grid)
    best = (0.0, grid[0][0], grid[0][1], counts[0][2])
    for kp, km, correct in counts:
        guesses = kp + km
        if correct == 0 or guesses == 0:
            continue

        # this pair's counts bound as defaults: the closure is only called in this iteration
        def rejected(mu: float, correct: int = correct, guesses: int = guesses) -> bool:
            return not bool(
                _guess_game_feasible(GaussianDPClaim(mu), np.array([beta]), correct, guesses, m)[0]
            )

        if not rejected(best[0]):
            continue  # rejection is monotone in mu: this pair cannot beat the best so far
        lo, hi = best[0], mu_max
        if rejected(hi):
            lo = hi
        while hi - lo > 1e-3:
            mid = 0.5 * (lo + hi)
            if rejected(mid):
                lo = mid
            else:
                hi = mid
        if lo > best[0]:
            best = (lo, kp, km, correct)
    mu_lo, kp, km, correct = best
    details: dict[str, Any] = {"mu": mu_lo, **guess_details(kp, km, correct, m, len(grid))}
    if claim is not None:
        p = min(fdp_one_run_p_value(claim, c, a + b, m) for a, b, c in counts)
        details["claim_p_value"] = float(min(1.0, len(grid) * p))
    return GaussianDPResult(
        epsilon=gdp_epsilon(mu_lo, delta),
        estimator=Estimator.fdp_one_run,
        threat_model=threat_model,
        delta=delta,
        correction=Correction.bonferroni,
        confidence=confidence,
        method="one-run f-DP audit (Mahloujifar, Melis & Chaudhuri 2025): guess IN for the k+ "
        "highest and OUT for the k- lowest scores; mu_lo = largest mu-GDP curve under which the "
        f"correct guesses are infeasible; Bonferroni over {len(grid)} (k+, k-) pairs; epsilon "
        "is that of the mu_lo-Gaussian mechanism at delta",
        details=details,
    )
