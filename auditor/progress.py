"""Time left in a run, from measured round times (pure: numbers in, numbers out).

Flower and Ray take seconds to tens of seconds to start before round 1 arrives; counting that
start-up as round time made the first ETAs several times too long. Only the intervals between
rounds from round 1 on are used, and their median, so one slow round (an evaluation, a
straggler) does not swing the estimate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["eta_seconds"]


def eta_seconds(round_times: Sequence[float], num_rounds: int) -> float | None:
    """Seconds until round ``num_rounds``: the median interval between consecutive rounds
    (from round 1 on) times the rounds left.

    Parameters
    ----------
    round_times : sequence of float
        When rounds 1, 2, ..., t arrived (seconds on any one clock, increasing).
    num_rounds : int
        Rounds in the run (``T``).

    Returns
    -------
    float or None
        ``None`` before two rounds (no interval measured yet); ``0.0`` once all rounds arrived.
    """
    t = len(round_times)
    if t >= num_rounds:
        return 0.0
    if t < 2:
        return None
    gaps = sorted(max(b - a, 0.0) for a, b in zip(round_times[:-1], round_times[1:]))
    mid = len(gaps) // 2
    median = gaps[mid] if len(gaps) % 2 else 0.5 * (gaps[mid - 1] + gaps[mid])
    eta = median * (num_rounds - t)
    return eta if math.isfinite(eta) else None
