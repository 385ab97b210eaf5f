"""When an external audit stops waiting for its run (docs/flower.md, "When an audit ends").

Two limits, both read by :meth:`flaudit.service.store.Store.end_silent_external`:

* **Start:** an audit whose run never declared its claim ends ``failed`` ("the run never
  started") ``start_timeout_seconds`` after its creation.
* **Silence:** a run that has started is given up after a silence that follows its own round
  cadence: ``CADENCE_FACTOR`` times the median time between the rounds received, at least
  ``MIN_SILENCE_SECONDS``, at most the spec's ``timeout_seconds`` (which alone applies until
  two rounds have arrived). A live ServerApp that trains slowly is never silent: its wrapper
  sends heartbeats well inside the floor (every quarter of the limit, at most 60 s).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from statistics import median
from typing import Any

__all__ = ["CADENCE_FACTOR", "MIN_SILENCE_SECONDS", "DEFAULT_START_TIMEOUT", "SilenceLimit",
           "silence_limit", "start_limit"]

#: The silence limit is this many median round gaps ...
CADENCE_FACTOR = 5.0
#: ... and never less than this (seconds).
MIN_SILENCE_SECONDS = 120.0
#: ``start_timeout_seconds`` of a spec that predates the field.
DEFAULT_START_TIMEOUT = 600.0
_DEFAULT_TIMEOUT = 3600.0


@dataclass(frozen=True)
class SilenceLimit:
    """How long the run may be silent (``seconds``) and why (``rule``, for the reason)."""

    seconds: float
    rule: str


def _timeout(spec: Mapping[str, Any]) -> float:
    return float(spec.get("timeout_seconds") or _DEFAULT_TIMEOUT)


def start_limit(spec: Mapping[str, Any]) -> SilenceLimit:
    """How long an external audit waits for its run to declare its claim."""
    start = float(spec.get("start_timeout_seconds") or DEFAULT_START_TIMEOUT)
    return SilenceLimit(start, f"start_timeout_seconds = {start:g} s")


def silence_limit(spec: Mapping[str, Any], round_times: Sequence[datetime]) -> SilenceLimit:
    """The silence after which a started run is given up, from the times its rounds arrived
    (in round order)."""
    timeout = _timeout(spec)
    times = [t.timestamp() for t in round_times]
    steps = [b - a for a, b in zip(times, times[1:])]
    if not steps:
        return SilenceLimit(timeout, f"timeout_seconds = {timeout:g} s; fewer than two rounds "
                                     "arrived to measure the run's cadence")
    cadence = max(0.0, median(steps))
    seconds = min(timeout, max(MIN_SILENCE_SECONDS, CADENCE_FACTOR * cadence))
    return SilenceLimit(seconds, (
        f"{CADENCE_FACTOR:g}x the median {cadence:.3g} s between its rounds, at least "
        f"{MIN_SILENCE_SECONDS:g} s, at most timeout_seconds = {timeout:g} s"))
