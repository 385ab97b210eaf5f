"""The assumption-free tier: the one-run f-DP guessing game (Mahloujifar, Melis & Chaudhuri,
ICML 2025) with one pre-declared guess count (issue #19 item 2).

Canaries are seen or unseen by fair coins, so the guessing game needs no independence between
canary scores: it is valid for every mechanism that meets its claimed trade-off curve. The
adversary guesses IN for the ``g`` highest known-rounds scores and OUT for the ``g`` lowest
(``g`` fixed by :func:`design_guesses` before the audit: no search over a grid, so no
Bonferroni factor), and the claim is refuted when that many correct guesses are infeasible
under it (:func:`flaudit.auditor.claims.curve_tests.fdp_one_run_p_value`).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from ..results import Correction
from .curve_tests import ClaimTestResult, fdp_one_run_p_value, guess_counts
from .tiers import AlarmTest

__all__ = ["design_guesses", "fdp_claim_test", "fdp_mu_lo"]

#: Fraction of the canaries guessed on at each end.
GUESS_FRACTION = 0.1


def design_guesses(num_canaries: int) -> int:
    """Guesses at each end (IN for the highest, OUT for the lowest scores), fixed in advance."""
    return max(1, int(math.ceil(GUESS_FRACTION * num_canaries))) if num_canaries >= 2 else 0


def fdp_claim_test(
    scores, seen_mask, *, claim, threat_model: str = "known_rounds"
) -> ClaimTestResult:
    """p-value of the guessing game's outcome under ``claim`` (scores: one per canary, seen and
    unseen; NaN scores are left out)."""
    scores = np.asarray(scores, dtype=np.float64)
    seen = np.asarray(seen_mask, dtype=bool)
    keep = np.isfinite(scores)
    scores, seen = scores[keep], seen[keep]
    m = int(scores.size)
    g = design_guesses(m)
    details: dict = {
        "test": AlarmTest.known_rounds_fdp_one_run.value,
        "m": m,
        "k_plus": g,
        "k_minus": g,
        "guesses": 2 * g if m >= 2 * g else m,
        "correct": 0,
    }
    if m < 2 or not claim.is_claim:
        return ClaimTestResult(
            1.0,
            claim,
            threat_model,
            Correction.not_applicable,
            "one-run f-DP guessing game: too few scored canaries"
            if m < 2
            else "no DP claim: nothing to test",
            details,
        )
    kp = min(g, m)
    km = min(g, m - kp)
    ((_, _, correct),) = guess_counts(scores, seen, [(kp, km)])
    details.update(k_plus=kp, k_minus=km, guesses=kp + km, correct=int(correct))
    p = fdp_one_run_p_value(claim, int(correct), kp + km, m)
    return ClaimTestResult(
        float(p),
        claim,
        threat_model,
        Correction.not_applicable,
        f"one-run f-DP guessing game (Mahloujifar et al. 2025): IN for the {kp} highest and OUT "
        f"for the {km} lowest known-rounds scores (fixed in advance); valid without independence",
        details,
    )


def _gdp_infeasible(
    mus: np.ndarray, level: float, correct: int, guesses: int, m: int
) -> np.ndarray:
    """For each ``mu`` of ``mus``: whether ``correct`` of ``guesses`` right is infeasible at
    ``level`` for a ``mu``-GDP mechanism -- the recursion of
    :func:`flaudit.auditor.claims.curve_tests._guess_game_feasible` vectorised over ``mu`` (the
    inverse blow-up of GDP is ``Phi(Phi^-1(y) - mu)``)."""
    mus = np.asarray(mus, dtype=np.float64)
    scale = level / m
    r = np.full(mus.shape, scale * correct)
    h = np.full(mus.shape, scale * (guesses - correct))
    for i in range(correct - 1, -1, -1):
        with np.errstate(divide="ignore"):
            blow = special.ndtr(special.ndtri(np.clip(r, 0.0, 1.0)) - mus)
        h_next = np.maximum(h, blow)
        r = r + (i / (guesses - i)) * (h_next - h)
        h = h_next
    return r + h > guesses / m


def fdp_mu_lo(correct: int, guesses: int, m: int, level: float, *, mu_max: float = 50.0) -> float:
    """Largest ``mu`` whose Gaussian-DP curve makes ``correct`` of ``guesses`` infeasible at
    ``level`` (0 when none is), to about 1e-3: two vectorised grid passes (infeasibility is
    monotone in ``mu``: a larger ``mu`` allows more)."""
    if correct <= 0 or guesses <= 0:
        return 0.0
    lo, hi = 0.0, float(mu_max)
    if not bool(_gdp_infeasible(np.array([1e-9]), level, correct, guesses, m)[0]):
        return 0.0
    if bool(_gdp_infeasible(np.array([hi]), level, correct, guesses, m)[0]):
        return hi
    while hi - lo > 1e-3:
        grid = np.linspace(lo, hi, 257)
        bad = _gdp_infeasible(grid, level, correct, guesses, m)
        last = int(np.flatnonzero(bad)[-1]) if bad.any() else 0
        lo, hi = float(grid[last]), float(grid[min(last + 1, grid.size - 1)])
        if last == grid.size - 1:
            break
    return lo
