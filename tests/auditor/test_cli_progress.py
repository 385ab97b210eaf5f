"""``flaudit run``'s progress: one line per round in a log, a bar on a terminal that Flower's
log records never write into, and an ETA that leaves out the start-up."""

from __future__ import annotations

import io
import logging

from flaudit.commands._progress import RoundProgress, fmt_seconds
from flaudit.commands._table import fmt_number


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_non_tty_prints_one_line_per_round_with_an_eta_from_round_times():
    stream, clock = io.StringIO(), FakeClock()
    with RoundProgress(10, name="audit 'x'", stream=stream, tty=False, clock=clock) as bar:
        clock.now = 45.0  # Flower/Ray start-up
        bar.update(1)
        for t in range(2, 5):
            clock.now += 2.0
            bar.update(t)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("audit 'x': starting the Flower simulation")
    assert lines[1] == "audit 'x': round 1/10, start-up 45 s, ETA ?"
    assert lines[-1] == "audit 'x': round 4/10, 2 s/round, ETA 12 s"
    assert len(lines) == 5 and "\r" not in stream.getvalue()


def test_tty_bar_keeps_flower_log_records_on_their_own_lines():
    stream, clock = io.StringIO(), FakeClock()
    flwr = logging.getLogger("flwr")
    handler = logging.StreamHandler(io.StringIO())
    flwr.addHandler(handler)
    try:
        with RoundProgress(5, name="audit", stream=stream, tty=True, clock=clock) as bar:
            clock.now = 30.0
            bar.update(1)
            flwr.warning("DEPRECATED FEATURE: run_simulation")
            clock.now = 31.0
            bar.update(2)
    finally:
        flwr.removeHandler(handler)
    text = stream.getvalue()
    assert handler.stream is not stream and "DEPRECATED" not in handler.stream.getvalue()
    # the record is written after the bar's line was cleared (tqdm overwrites it with blanks and
    # returns to its start), then the bar is redrawn
    before, after = text.split("DEPRECATED FEATURE: run_simulation", 1)
    drawn, blanks, rest = before.rsplit("\r", 3)[-3:]
    assert "round 1/5" in drawn and blanks.strip() == "" and len(blanks) >= len(drawn)
    assert "round" not in rest  # (Flower's own handler, if flwr is imported, writes its prefix)
    assert after.startswith("\n") and "round 2/5" in after
    for line in text.replace("\r", "\n").splitlines():
        assert len(line) <= 100
        assert not ("DEPRECATED" in line and "round" in line)
    assert text.endswith("round 2/5, 1 s/round, ETA 3 s\n")


def test_tty_bar_keeps_the_handlers_own_format_and_level():
    # Flower's console handler formats its records itself and drops DEBUG (its logger is at
    # DEBUG): the bar changes where a record is written, not what or whether
    stream, clock = io.StringIO(), FakeClock()
    flwr = logging.getLogger("flwr")
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(logging.Formatter("%(levelname)s : %(message)s"))
    handler.setLevel(logging.INFO)
    flwr.addHandler(handler)
    level = flwr.level
    flwr.setLevel(logging.DEBUG)
    try:
        with RoundProgress(3, name="audit", stream=stream, tty=True, clock=clock) as bar:
            clock.now = 5.0
            bar.update(1)
            flwr.debug("a debug record")
            flwr.info("an info record")
    finally:
        flwr.removeHandler(handler)
        flwr.setLevel(level)
    lines = stream.getvalue().replace("\r", "\n").splitlines()
    assert "INFO : an info record" in lines
    assert not any("a debug record" in line for line in lines)


def test_number_and_duration_formats():
    assert fmt_number(2.7778563309723988e-05) == "2.778e-05"
    assert fmt_number(23.97134) == "23.97" and fmt_number(float("inf")) == "inf"
    assert fmt_number(None) == "-"
    assert fmt_seconds(None) == "?" and fmt_seconds(65) == "1 min 05 s"
    assert fmt_seconds(3 * 3600 + 120) == "3 h 02 min"


def test_every_option_of_every_subcommand_has_help():
    import argparse

    from flaudit.commands.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [
        f"{name} {opt}"
        for name, p in sub.choices.items()
        for a in p._actions
        for opt in a.option_strings[:1]
        if not a.help and opt != "-h"
    ]
    assert missing == []
    assert "log level" in sub.choices["serve"].format_help()
