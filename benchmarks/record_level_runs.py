"""The built-in record-level engine (issue #37) over several canary seeds: how often does the
alarm fire on the correct run, and on each deliberate bug? Each run is ``flaudit run
examples/record-level-audit.json [--inject-bug BUG] --json`` in this process with the canary seed
``seed0 + i`` (``new_master_seed`` replaced), so every number is the real engine's: Opacus
DP-SGD in every client, record canaries, the record-level alarm and verdict.

Rerun:
    .venv/bin/python benchmarks/record_level_runs.py --runs 5 --bugs none,noise_scale=0.5,no_clipping

Prints per bug: runs refuted, the rounds where the alarm first fired, the causes named, the mean
noise and shift ratios measured, and the seconds per run.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import time
import warnings
from pathlib import Path

import flaudit.commands.record_run
from flaudit.commands.cli import main as cli_main

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "record-level-audit.json"


def one_run(spec: Path, bug: str, seed: int) -> dict:
    flaudit.commands.record_run.new_master_seed = lambda: seed
    argv = ["run", str(spec), "--json"] + ([] if bug == "none" else ["--inject-bug", bug])
    out = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(out):
        warnings.simplefilter("ignore")
        cli_main(argv)
    return json.loads(out.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=EXAMPLE)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed0", type=int, default=1000)
    parser.add_argument("--bugs", default="none,noise_scale=0.5,no_clipping")
    args = parser.parse_args()
    for bug in args.bugs.split(","):
        refuted, rounds, causes, noise, shift, seconds = 0, [], collections.Counter(), [], [], []
        for i in range(args.runs):
            started = time.monotonic()
            result = one_run(args.spec, bug, args.seed0 + i)
            seconds.append(time.monotonic() - started)
            if result["verdict"]["status"] == "claim_refuted":
                refuted += 1
                first = next(look for look in result["looks"] if look["status"] == "error")
                rounds.append(first["round"] or "end")
                causes[result["cause"]["cause"]] += 1
            noise.append(result["measured"]["noise_ratio"])
            shift.append(result["measured"]["sensitivity_ratio"])
        print(
            f"{bug}: refuted {refuted}/{args.runs}; first alarm at {rounds}; causes "
            f"{dict(causes)}; noise ratio {sum(noise) / len(noise):.3f}, shift ratio "
            f"{sum(shift) / len(shift):.3f}; {sum(seconds) / len(seconds):.0f} s per run",
            flush=True,
        )


if __name__ == "__main__":
    main()
