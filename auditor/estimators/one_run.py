"""One-run lower bound on epsilon (Steinke, Nasr & Jagielski 2023, Thm 3.1).

Each canary is seen (S = +1) or unseen (S = -1) by a fair coin. Guess IN for the ``k+`` highest
scores and OUT for the ``k-`` lowest, abstain on the rest; ``W`` is the number of correct guesses
among ``r = k+ + k-``. If the mechanism is (eps, delta)-DP then

    P[W >= v] <= P[Bin(r, p) >= v] + delta * m * alpha,   p = e^eps / (1 + e^eps),
    alpha = max_{i in 1..m} (2 / i) * P[v > Bin(r, p) >= v - i]            (eq. 3)

so eps is rejected at level beta when the right-hand side at the observed ``v = W`` is <= beta.
The bound is the largest rejected eps. ``(k+, k-)`` is chosen after looking at the data from a
grid, so each pair is tested at ``beta / len(grid)`` (Bonferroni).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from ..results import Correction, EpsilonResult, Estimator
from ._validation import check_confidence, check_delta, check_mask, check_scores

__all__ = [
    "one_run_lower_bound",
    "one_run_p_value",
    "one_run_epsilon",
    "default_guess_grid",
    "check_guess_inputs",
    "guess_details",
]

_EPS_MAX = 50.0


def one_run_p_value(eps: float, correct: int, guesses: int, m: int, delta: float) -> float:
    """Right-hand side of Thm 3.1 (eq. 2 with alpha from eq. 3) at ``v = correct``."""
    v, r = int(correct), int(guesses)
    if v <= 0:
        return 1.0
    if v > r:
        raise ValueError(f"correct ({v}) must be <= guesses ({r})")
    p = 1.0 / (1.0 + math.exp(-eps))
    tail = float(special.bdtrc(v - 1, r, p))  # P[Bin >= v]
    if delta == 0:
        return tail
    # alpha = max_i (2/i) (cdf(v-1) - cdf(v-1-i)); for i >= v the bracket is cdf(v-1) and 2/i
    # only shrinks, so i = 1..min(m, v) suffices
    i = np.arange(1, min(m, v) + 1)
    upper = float(special.bdtr(v - 1, r, p))
    lower_j = v - 1 - i
    lower = np.where(lower_j >= 0, special.bdtr(np.maximum(lower_j, 0), r, p), 0.0)
    alpha = float(np.max(2.0 / i * (upper - lower)))
    return tail + delta * m * alpha


def one_run_epsilon(
    correct: int, guesses: int, m: int, delta: float, beta: float, *, tol: float = 1e-4
) -> float:
    """Largest eps (bisection to ``tol``, 0 if none) with ``one_run_p_value(eps, ...) <= beta``."""
    if guesses == 0 or one_run_p_value(0.0, correct, guesses, m, delta) > beta:
        return 0.0
    lo, hi = 0.0, _EPS_MAX
    if one_run_p_value(hi, correct, guesses, m, delta) <= beta:
        return hi
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if one_run_p_value(mid, correct, guesses, m, delta) <= beta:
            lo = mid
        else:
            hi = mid
    return lo


def default_guess_grid(m: int) -> list[tuple[int, int]]:
    """A small grid of ``(k+, k-)``: equal counts and IN-only guesses at a few fractions of m."""
    fracs = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5)
    sizes = sorted({max(1, int(round(f * m))) for f in fracs})
    grid = {(k, k) for k in sizes if 2 * k <= m} | {(k, 0) for k in sizes}
    return sorted(grid)


def check_guess_inputs(scores, seen_mask, delta: float, confidence: float, grid) -> tuple:
    """A one-run audit's inputs, checked: ``(scores, seen_mask, delta, confidence, grid)``,
    ``grid`` the ``(k_plus, k_minus)`` guess counts as integers (:func:`default_guess_grid`
    when None). Raises ValueError naming the bad argument (a grid that is empty, or a pair
    that guesses more than the canaries or a negative count)."""
    scores = check_scores(scores, "scores")
    seen_mask = check_mask(seen_mask, "seen_mask", scores.size, "scores")
    delta, confidence = check_delta(delta), check_confidence(confidence)
    m = scores.size
    grid = default_guess_grid(m) if grid is None else [(int(kp), int(km)) for kp, km in grid]
    if not grid:
        raise ValueError("grid must not be empty")
    for kp, km in grid:
        if kp < 0 or km < 0 or kp + km > m:
            raise ValueError(f"grid entry ({kp}, {km}) must satisfy 0 <= k+, k- and k+ + k- <= {m}")
    return scores, seen_mask, delta, confidence, grid


def guess_details(kp: int, km: int, correct: int, m: int, grid_size: int) -> dict[str, int]:
    """A one-run bound's ``details``: the best pair's guesses and what they were chosen from."""
    return {
        "k_plus": kp,
        "k_minus": km,
        "correct": correct,
        "guesses": kp + km,
        "m": m,
        "grid_size": grid_size,
    }


def one_run_lower_bound(
    scores,
    seen_mask,
    *,
    delta: float,
    confidence: float = 0.95,
    grid: list[tuple[int, int]] | None = None,
    threat_model: str = "final_model",
) -> EpsilonResult:
    """Steinke et al. one-run lower bound on epsilon.

    Parameters
    ----------
    scores : array_like
        One score per canary (higher = more likely seen), e.g. final-model cosines.
    seen_mask : array_like of bool
        True where the canary was seen (inserted).
    delta : float
        delta of the hypothesis (eps, delta)-DP, in (0, 1).
    confidence : float
        1 - beta.
    grid : list of (k_plus, k_minus), optional
        Guess counts to try; default :func:`default_guess_grid`. Bonferroni over its size.

    Returns
    -------
    EpsilonResult
        ``details``: ``k_plus``, ``k_minus``, ``correct``, ``guesses``, ``m``, ``grid_size``.
    """
    scores, seen_mask, delta, confidence, grid = check_guess_inputs(
        scores, seen_mask, delta, confidence, grid
    )
    m = scores.size
    beta = (1.0 - confidence) / len(grid)
    order = np.argsort(-scores, kind="stable")
    seen_sorted = seen_mask[order]
    in_prefix = np.concatenate([[0], np.cumsum(seen_sorted)])  # seen among top j
    out_suffix = np.concatenate([[0], np.cumsum(~seen_sorted[::-1])])  # unseen among bottom j
    best: tuple[float, int, int, int] | None = None
    for kp, km in grid:
        correct = int(in_prefix[kp] + out_suffix[km])
        if best is not None and one_run_p_value(best[0], correct, kp + km, m, delta) > beta:
            continue  # the p-value grows with eps: this pair cannot beat the best so far
        eps = one_run_epsilon(correct, kp + km, m, delta, beta)
        if best is None or eps > best[0]:
            best = (eps, kp, km, correct)
    eps, kp, km, correct = best
    return EpsilonResult(
        epsilon=float(eps),
        estimator=Estimator.one_run,
        threat_model=threat_model,
        delta=delta,
        correction=Correction.bonferroni,
        confidence=confidence,
        method=f"Steinke et al. Thm 3.1 (with the delta*m*alpha term): guess IN for the k+ "
        f"highest and OUT for the k- lowest scores; Bonferroni over {len(grid)} (k+, k-) pairs",
        details=guess_details(kp, km, correct, m, len(grid)),
    )
