"""Small helpers shared by the fidelity benchmarks (binomial intervals, JSON output)."""

from __future__ import annotations

import json
import math

from scipy import stats


def clopper_pearson(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided Clopper-Pearson interval for a binomial rate."""
    a = 1 - confidence
    lo = 0.0 if successes == 0 else float(stats.beta.ppf(a / 2, successes, trials - successes + 1))
    hi = 1.0 if successes == trials else float(stats.beta.ppf(1 - a / 2, successes + 1, trials - successes))
    return lo, hi


def rate_consistent_with(successes: int, trials: int, limit: float, confidence: float = 0.95) -> bool:
    """True unless the data show the rate is above ``limit`` at ``confidence`` (one-sided exact
    binomial test: P[Bin(n, limit) >= x] > 1 - confidence)."""
    if successes == 0:
        return True
    return float(stats.binom.sf(successes - 1, trials, limit)) > 1 - confidence


def fmt(x: float, digits: int = 2) -> str:
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.{digits}f}"


def dump(obj) -> str:
    def default(o):
        if isinstance(o, float) and math.isinf(o):
            return "inf"
        return str(o)

    return json.dumps(obj, default=default)
