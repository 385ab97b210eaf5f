"""The assumption-free tier: the one-run f-DP guessing game (Mahloujifar, Melis & Chaudhuri,
ICML 2025) with one pre-declared guess count (issue #19 item 2).

Canaries are seen or unseen by fair coins, so the guessing game needs no independence between
canary scores: it is valid for every mechanism that meets its claimed trade-off curve. The
adversary guesses IN for the ``g`` highest known-rounds scores and OUT for the ``g`` lowest
(``g`` fixed by :func:`design_guesses` before the audit: no search over a grid, so no
Bonferroni factor), and the claim is refuted when that many correct guesses are infeasible
under it (:func:`flaudit.auditor.estimators.gdp.fdp_one_run_p_value`).
"""

from __future__ import annotations

import math

import numpy as np

from flaudit.auditor.estimators.gdp import (
    ClaimTestResult,
    GaussianDPClaim,
    _guess_counts,
    _guess_game_feasible,
    fdp_one_run_p_value,
)
from flaudit.auditor.results import Correction

from .tiers import AlarmTest

__all__ = ["design_guesses", "fdp_claim_test", "fdp_mu_lo"]

#: Fraction of the canaries guessed on at each end.
GUESS_FRACTION = 0.1


def design_guesses(num_canaries: int) -> int:
    """Guesses at each end (IN for the highest, OUT for the lowest scores), fixed in advance."""
    return max(1, int(math.ceil(GUESS_FRACTION * num_canaries))) if num_canaries >= 2 else 0


def fdp_claim_test(scores, seen_mask, *, claim, threat_model: str = "known_rounds") -> ClaimTestResult:
    """p-value of the guessing game's outcome under ``claim`` (scores: one per canary, seen and
    unseen; NaN scores are left out)."""
    scores = np.asarray(scores, dtype=np.float64)
    seen = np.asarray(seen_mask, dtype=bool)
    keep = np.isfinite(scores)
    scores, seen = scores[keep], seen[keep]
    m = int(scores.size)
    g = design_guesses(m)
    details: dict = {"test": AlarmTest.known_rounds_fdp_one_run.value, "m": m,
                     "k_plus": g, "k_minus": g, "guesses": 2 * g if m >= 2 * g else m,
                     "correct": 0}
    if m < 2 or not claim.is_claim:
        return ClaimTestResult(1.0, claim, threat_model, Correction.not_applicable,
                               "one-run f-DP guessing game: too few scored canaries" if m < 2
                               else "no DP claim: nothing to test", details)
    kp = min(g, m)
    km = min(g, m - kp)
    (_, _, correct), = _guess_counts(scores, seen, [(kp, km)])
    details.update(k_plus=kp, k_minus=km, guesses=kp + km, correct=int(correct))
    p = fdp_one_run_p_value(claim, int(correct), kp + km, m)
    return ClaimTestResult(
        float(p), claim, threat_model, Correction.not_applicable,
        f"one-run f-DP guessing game (Mahloujifar et al. 2025): IN for the {kp} highest and OUT "
        f"for the {km} lowest known-rounds scores (fixed in advance); valid without independence",
        details)


def fdp_mu_lo(correct: int, guesses: int, m: int, level: float, *, mu_max: float = 50.0) -> float:
    """Largest ``mu`` whose Gaussian-DP curve makes ``correct`` of ``guesses`` infeasible at
    ``level`` (0 when none is)."""
    if correct <= 0 or guesses <= 0:
        return 0.0

    def rejected(mu: float) -> bool:
        return not bool(_guess_game_feasible(GaussianDPClaim(mu), np.array([level]),
                                             correct, guesses, m)[0])

    if not rejected(1e-9):
        return 0.0
    lo, hi = 0.0, mu_max
    if rejected(hi):
        return hi
    while hi - lo > 1e-3:
        mid = 0.5 * (lo + hi)
        if rejected(mid):
            lo = mid
        else:
            hi = mid
    return lo
