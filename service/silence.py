"""When an external audit stops waiting for its run (docs/flower.md, "When an audit ends").

The rules, read by :meth:`flaudit.service.store.Store.end_silent_external`; they do not depend
on the run's round cadence, so a dead run is given up as fast after its first round as after its
hundredth, and a slow one lives as long as it makes progress:

* **Start:** an audit whose run never declared its claim ends ``failed`` ("the run never
  started") ``start_timeout_seconds`` after its creation.
* **Silence:** a run that has started ends ``failed`` once it shows no sign of progress for
  ``SILENCE_SECONDS`` (at most the spec's ``timeout_seconds``). Signs of progress: its claim,
  every ingest (rounds, gaps, models), and each heartbeat, *as of what the heartbeat reports*
  (:func:`progress_at`): a ServerApp whose SuperLink stopped answering, or whose rounds stopped
  moving, still heartbeats, but its heartbeats stop counting.
* **Heartbeats:** the wrapper heartbeats while its run is quiet (every quarter of the limit, at
  most 30 s) and says when the SuperLink last answered it (``grid_age_seconds``) and when the
  run last moved (a round started or was reported: ``progress_age_seconds``) under its round
  timeout (``round_timeout_seconds``: twice Flower's ``Strategy.start(timeout=...)``). A heartbeat
  counts from the SuperLink's last answer, and from ``PROGRESS_GRACE_SECONDS`` plus the round
  timeout after the last move: a 10-minute round under Flower's default 3600 s timeout stays
  alive; a run stuck in a round ends ``PROGRESS_GRACE_SECONDS`` after its round timeout ran out.
  A heartbeat that says nothing (an older wrapper) counts as progress now.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

__all__ = [
    "SILENCE_SECONDS",
    "PROGRESS_GRACE_SECONDS",
    "DEFAULT_START_TIMEOUT",
    "SilenceLimit",
    "progress_at",
    "silence_limit",
    "start_limit",
]

#: A started run that shows no sign of progress for this long (seconds) is given up ...
SILENCE_SECONDS = 150.0
#: ... and one whose heartbeats say it has not moved for its round timeout plus this long.
PROGRESS_GRACE_SECONDS = 120.0
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


def silence_limit(spec: Mapping[str, Any]) -> SilenceLimit:
    """How long a started run may show no sign of progress before it is given up."""
    timeout = _timeout(spec)
    if timeout < SILENCE_SECONDS:
        return SilenceLimit(timeout, f"timeout_seconds = {timeout:g} s")
    return SilenceLimit(
        SILENCE_SECONDS,
        (
            "signs of progress: rounds, models, and heartbeats as of the progress they report; at "
            f"most timeout_seconds = {timeout:g} s"
        ),
    )


def _age(value: Any) -> float | None:
    try:
        age = float(value)
    except (TypeError, ValueError):
        return None
    return age if age == age and age >= 0 else None  # (NaN: not a report)


def progress_at(
    now: datetime, beat: Mapping[str, Any] | None, *, silence_seconds: float = SILENCE_SECONDS
) -> datetime:
    """The time a heartbeat received at ``now`` vouches for: ``now`` minus how long ago the
    SuperLink last answered the run (``grid_age_seconds``), and no later than
    ``PROGRESS_GRACE_SECONDS - silence_seconds`` past the run's round timeout after its last
    move (``progress_age_seconds``, ``round_timeout_seconds``): a silence rule of
    ``silence_seconds`` then ends the run that long after the SuperLink's last answer, or
    ``PROGRESS_GRACE_SECONDS`` after its round timeout ran out without a move. Fields missing:
    ``now``."""
    beat = beat or {}
    stale = 0.0
    grid = _age(beat.get("grid_age_seconds"))
    if grid is not None:
        stale = max(stale, grid)
    moved, round_timeout = (
        _age(beat.get("progress_age_seconds")),
        _age(beat.get("round_timeout_seconds")),
    )
    if moved is not None and round_timeout is not None:
        stale = max(stale, moved - round_timeout - PROGRESS_GRACE_SECONDS + silence_seconds)
    return now - timedelta(seconds=stale)
