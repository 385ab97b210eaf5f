"""Round progress for ``flaudit run``: a tqdm bar on a terminal, one line per round in a log.

The ETA comes from :func:`flaudit.auditor.progress.eta_seconds` (rounds since round 1, not the Flower/Ray
start-up), not from tqdm's rate, which would count the start-up; tqdm draws the bar and its line.
Log records of Flower's ``flwr`` logger are printed on their own lines, never into the bar's line:
its console handlers write through tqdm's :class:`tqdm.contrib.DummyTqdmFile`, which clears the
bar before a record and redraws it after (``tqdm.write``). Not
:func:`tqdm.contrib.logging.logging_redirect_tqdm`: that replaces the handler with one of its own,
which drops Flower's level prefix (``ConsoleHandler.format``) and its INFO threshold (the ``flwr``
logger itself is at DEBUG), so Flower's debug records would reach the terminal.
"""

from __future__ import annotations

import logging
import shutil
import sys
import time
from typing import TextIO

from tqdm import tqdm
from tqdm.contrib import DummyTqdmFile

from ..auditor.progress import eta_seconds, fmt_seconds

__all__ = ["RoundProgress", "fmt_seconds"]


class _StatusBar(tqdm):
    """tqdm with our status text (round, pace, ETA) as ``{status}`` in its ``bar_format``."""

    def __init__(self, *args, status: str = "", **kwargs) -> None:
        self.status = status  # before tqdm draws the bar for the first time
        super().__init__(*args, **kwargs)

    @property
    def format_dict(self):
        return {**super().format_dict, "status": self.status}


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

    def __init__(
        self,
        total: int,
        *,
        name: str,
        stream: TextIO | None = None,
        tty: bool | None = None,
        clock=time.monotonic,
    ) -> None:
        self.total = int(total)
        self.name = name
        self.stream = stream if stream is not None else sys.stderr
        self.tty = (
            bool(tty) if tty is not None else bool(getattr(self.stream, "isatty", lambda: False)())
        )
        self._clock = clock
        self._started = clock()
        self._times: list[float] = []
        self._bar: _StatusBar | None = None  # created at round 1 (the start-up has no bar)
        self._handlers: list[tuple[logging.StreamHandler, TextIO]] = []

    # -- context: keep Flower's log records out of the bar's line -----------------------------
    def __enter__(self) -> RoundProgress:
        self.stream.write(
            f"{self.name}: starting the Flower simulation (start-up is not counted in the ETA)\n"
        )
        self.stream.flush()
        if self.tty:
            safe = DummyTqdmFile(self.stream)  # tqdm.write: clear the bar, write, redraw
            for handler in logging.getLogger("flwr").handlers:
                if isinstance(handler, logging.StreamHandler) and not isinstance(
                    handler, logging.FileHandler
                ):
                    self._handlers.append((handler, handler.setStream(safe)))
        return self

    def __exit__(self, *exc) -> None:
        for handler, previous in self._handlers:
            handler.setStream(previous)
        self._handlers.clear()
        if self._bar is not None:
            self._bar.close()  # leaves the bar's last line, ended by a newline
            self._bar = None
        self.stream.flush()

    # -- updates ---------------------------------------------------------------------------
    def update(self, t: int) -> None:
        """Round ``t`` (1-based) has finished."""
        now = self._clock()
        while len(self._times) < t:
            self._times.append(now)
        if self.tty:
            self._draw()
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def line(self) -> str:
        """One line per round in a log: ``name: round t/T, x s/round, ETA y``."""
        return f"{self.name}: {self.status()}"

    def status(self) -> str:
        """``round t/T, x s/round, ETA y`` (``start-up z`` at round 1): the text after the bar."""
        t = len(self._times)
        eta = eta_seconds(self._times, self.total)
        gaps = [b - a for a, b in zip(self._times[:-1], self._times[1:])]
        pace = f", {sorted(gaps)[len(gaps) // 2]:.3g} s/round" if gaps else ""
        start = f", start-up {fmt_seconds(self._times[0] - self._started)}" if t == 1 else ""
        return f"round {t}/{self.total}{pace}{start}, ETA {fmt_seconds(eta)}"

    def _draw(self) -> None:
        if self._bar is None:  # tqdm draws it as it is made
            self._bar = _StatusBar(
                total=self.total,
                initial=len(self._times),
                status=self.status(),
                desc=self.name,
                file=self.stream,
                bar_format="{desc}: [{bar}] {status}",
                ncols=min(shutil.get_terminal_size((100, 24)).columns, 100),
                leave=True,
            )
            return
        self._bar.status = self.status()
        self._bar.n = len(self._times)
        self._bar.refresh()
