"""Round progress for ``flaudit run``: a bar on a terminal, one line per round in a log.

The ETA comes from :func:`flaudit.auditor.progress.eta_seconds` (rounds since round 1, not the Flower/Ray
start-up). Log records of Flower's ``flwr`` logger (e.g. its ``DEPRECATED FEATURE:
run_simulation`` warning) are printed on their own lines, never into the bar's line.
"""

from __future__ import annotations

import logging
import shutil
import sys
import time
from typing import TextIO

from ..auditor.progress import eta_seconds

__all__ = ["RoundProgress", "fmt_seconds"]


def fmt_seconds(seconds: float | None) -> str:
    """``42 s``, ``3 min 05 s``, ``1 h 02 min``; ``?`` when unknown."""
    if seconds is None:
        return "?"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class _BarSafeStream:
    """A stream for log handlers that clears the bar's line before a record and redraws after."""

    def __init__(self, progress: "RoundProgress") -> None:
        self._progress = progress

    def write(self, text: str) -> int:
        self._progress._clear_line()
        self._progress.stream.write(text)
        if text.endswith("\n"):
            self._progress._draw()
        return len(text)

    def flush(self) -> None:
        self._progress.stream.flush()


class RoundProgress:
    """Progress of one audit's rounds.

    Parameters
    ----------
    total : int
        Rounds in the run.
    name : str
        Shown before the counter.
    stream : file, optional
        Default ``sys.stderr``.
    tty : bool, optional
        Draw a bar that rewrites its line (default: whether ``stream`` is a terminal); else one
        line per round.
    clock : callable, optional
        Seconds on a monotonic clock (for tests).
    """

    def __init__(self, total: int, *, name: str, stream: TextIO | None = None,
                 tty: bool | None = None, clock=time.monotonic) -> None:
        self.total = int(total)
        self.name = name
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(tty) if tty is not None else bool(getattr(self.stream, "isatty", lambda: False)())
        self._clock = clock
        self._started = clock()
        self._times: list[float] = []
        self._drawn = False
        self._handlers: list[tuple[logging.StreamHandler, TextIO]] = []

    # -- context: keep Flower's log records out of the bar's line -----------------------------
    def __enter__(self) -> "RoundProgress":
        self.stream.write(f"{self.name}: starting the Flower simulation (start-up is not counted "
                          f"in the ETA)\n")
        self.stream.flush()
        if self.tty:
            safe = _BarSafeStream(self)
            for handler in logging.getLogger("flwr").handlers:
                if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                    self._handlers.append((handler, handler.setStream(safe)))
        return self

    def __exit__(self, *exc) -> None:
        for handler, previous in self._handlers:
            handler.setStream(previous)
        self._handlers.clear()
        if self._drawn:
            self.stream.write("\n")
            self._drawn = False
        self.stream.flush()

    # -- updates ---------------------------------------------------------------------------
    def update(self, t: int) -> None:
        """Round ``t`` (1-based) has finished."""
        now = self._clock()
        while len(self._times) < t:
            self._times.append(now)
        if self.tty:
            self._clear_line()
            self._draw()
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def line(self, width: int | None = None) -> str:
        """The status text: ``name: round t/T, x s/round, ETA y`` (with a bar when ``width``)."""
        t = len(self._times)
        eta = eta_seconds(self._times, self.total)
        gaps = [b - a for a, b in zip(self._times[:-1], self._times[1:])]
        pace = f", {sorted(gaps)[len(gaps) // 2]:.3g} s/round" if gaps else ""
        start = f", start-up {fmt_seconds(self._times[0] - self._started)}" if t == 1 else ""
        text = f"round {t}/{self.total}{pace}{start}, ETA {fmt_seconds(eta)}"
        if width is None:
            return f"{self.name}: {text}"
        room = width - len(text) - 4
        if room < 10:
            return text[:width - 1]
        bar = max(0, min(30, room - len(self.name) - 2))
        filled = round(bar * t / self.total) if self.total else bar
        head = f"{self.name}: " if bar + len(self.name) + 2 <= room else ""
        return f"{head}[{'#' * filled}{'.' * (bar - filled)}] {text}"

    def _draw(self) -> None:
        if not self._times:
            return
        width = min(shutil.get_terminal_size((100, 24)).columns, 100)
        self.stream.write("\r" + self.line(width))
        self._drawn = True

    def _clear_line(self) -> None:
        if self._drawn:
            self.stream.write("\r\033[K")
            self._drawn = False
