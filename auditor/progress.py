"""Time left in a run, from measured round times (pure: numbers in, numbers out).

Flower and Ray take seconds to tens of seconds to start before round 1 arrives; counting that
start-up as round time made the first ETAs several times too long. Only the intervals between
rounds from round 1 on are used, and their median, so one slow round (an evaluation, a
straggler) does not swing the estimate.

Given the time now, the round in progress counts too (issue #40: a demo sat at "round 4 of 10"
for a minute with an ETA of 2 s, because rounds 1-4 had arrived within a second and the median
of those gaps was all the estimate knew). The time per round is then at least the average since
round 1 *including the wait for the next round*: a stall makes the ETA grow while it lasts, and
the wait itself is reported (:func:`round_wait`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["RoundWait", "eta_seconds", "fmt_seconds", "round_wait"]


def fmt_seconds(seconds: float | None, *, tenths_below: float = 0.0) -> str:
    """``42 s``, ``3 min 05 s``, ``1 h 02 min``; ``?`` when unknown; under ``tenths_below``
    seconds, two significant digits (``0.09 s``)."""
    if seconds is None:
        return "?"
    if 0 <= seconds < tenths_below:
        return f"{seconds:.2g} s"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def eta_seconds(
    round_times: Sequence[float], num_rounds: int, now: float | None = None
) -> float | None:
    """Seconds until round ``num_rounds``.

    Without ``now``: the median interval between consecutive rounds (from round 1 on) times the
    rounds left. With ``now`` (same clock): the time per round is the larger of that median and
    the average since round 1 counting the round in progress, ``(now - t_1) / t``; the ETA is
    what is left of the round in progress (none once it has taken longer) plus that time for
    each round after it. A round that takes longer than the earlier ones raises the ETA for as
    long as it lasts instead of leaving it at the old median.

    Parameters
    ----------
    round_times : sequence of float
        When rounds 1, 2, ..., t arrived (seconds on any one clock, increasing).
    num_rounds : int
        Rounds in the run (``T``).
    now : float, optional
        The time now, on the clock of ``round_times`` (``>=`` the last of them).

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
    median = _median([max(b - a, 0.0) for a, b in zip(round_times[:-1], round_times[1:])])
    if now is None:
        eta = median * (num_rounds - t)
    else:
        waited = max(now - round_times[-1], 0.0)
        per_round = max(median, (round_times[-1] + waited - round_times[0]) / t)
        eta = max(per_round - waited, 0.0) + per_round * (num_rounds - t - 1)
    return eta if math.isfinite(eta) else None


@dataclass(frozen=True)
class RoundWait:
    """The round the run is waiting for and how long it has waited, beside how long the rounds
    before it took (``typical_seconds``: their median interval; None before two rounds)."""

    round: int
    waited_seconds: float
    typical_seconds: float | None

    @property
    def overdue(self) -> bool:
        """The wait is longer than twice the rounds' typical interval and than it plus 5 s (a
        run of sub-second rounds is not called slow for a second's hiccup)."""
        typical = self.typical_seconds
        return typical is not None and self.waited_seconds > max(2.0 * typical, typical + 5.0)


def round_wait(round_times: Sequence[float], num_rounds: int, now: float) -> RoundWait | None:
    """What the run waits for at ``now`` after rounds 1..t arrived at ``round_times``: round
    ``t + 1``, waited for since round ``t``. None before round 1 (what the run waits for then is
    its start, which only the caller knows) and once all ``num_rounds`` arrived."""
    t = len(round_times)
    if t == 0 or t >= num_rounds:
        return None
    gaps = [max(b - a, 0.0) for a, b in zip(round_times[:-1], round_times[1:])]
    return RoundWait(
        round=t + 1,
        waited_seconds=max(now - round_times[-1], 0.0),
        typical_seconds=_median(gaps) if gaps else None,
    )
