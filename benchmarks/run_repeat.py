"""`flaudit run` many times in a row: does any run hang? (issue #28, "Nothing hangs")

Each run is a fresh ``flaudit run SPEC --json`` process (Flower's simulation engine, Ray, the
audit thread beside the ServerApp) with a wall-clock limit; a run that passes the limit counts
as a hang and is killed. Prints one line per run and a summary (runs, hangs, exit statuses,
wall time median / max / total), then a Markdown row for docs/benchmarks.md.

Run (docs/benchmarks.md, "flaudit run in a row", has the numbers)::

    .venv/bin/python benchmarks/run_repeat.py --runs 50                       # the README's spec
    .venv/bin/python benchmarks/run_repeat.py --runs 50 --set num_canaries=1000 --set num_clients=1000  # #28's k
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLAUDIT = Path(sys.executable).with_name("flaudit")


def _spec_file(base: Path, overrides: list[str], directory: Path) -> Path:
    """``base``, or a copy with ``KEY=VALUE`` overrides (VALUE in TOML) of top-level keys."""
    if not overrides:
        return base
    keys = {item.split("=", 1)[0].strip() for item in overrides}
    kept = [
        line
        for line in base.read_text().splitlines()
        if line.split("=", 1)[0].strip() not in keys or line.startswith("[")
    ]
    first_table = next((i for i, line in enumerate(kept) if line.startswith("[")), len(kept))
    text = "\n".join(kept[:first_table] + overrides + kept[first_table:]) + "\n"
    tomllib.loads(text)  # a bad override fails here, not 50 times
    out = directory / "spec.toml"
    out.write_text(text)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--spec", type=Path, default=ROOT / "examples" / "audit.toml")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a top-level spec key (VALUE in TOML), repeatable",
    )
    parser.add_argument(
        "--limit",
        type=float,
        default=300.0,
        help="seconds after which a run counts as hung and is killed",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="flaudit-run-repeat-"))
    spec = _spec_file(args.spec, args.set, work)
    env = {
        **os.environ,
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_HOME": str(work / "flwr-home"),
    }
    times: list[float] = []
    statuses: collections.Counter[str] = collections.Counter()
    hangs = 0
    started_all = time.monotonic()
    for i in range(args.runs):
        started = time.monotonic()
        try:
            done = subprocess.run(
                [str(FLAUDIT), "run", str(spec), "--json"],
                env=env,
                capture_output=True,
                text=True,
                timeout=args.limit,
                cwd=work,
            )
            status = str(done.returncode)
        except subprocess.TimeoutExpired:
            hangs += 1
            status = "hung"
        elapsed = time.monotonic() - started
        times.append(elapsed)
        statuses[status] += 1
        print(f"run {i + 1:3d}: exit {status:>4}  {elapsed:6.1f} s", flush=True)
    total = time.monotonic() - started_all
    load = os.getloadavg()[0]
    print(
        f"\n{args.runs} runs of `flaudit run {args.spec.name} {' '.join(args.set)}` (k = "
        f"{tomllib.loads(spec.read_text())['num_canaries']}): {hangs} hung "
        f"(limit {args.limit:g} s); exit statuses {dict(statuses)}; wall time median "
        f"{statistics.median(times):.1f} s, max {max(times):.1f} s, total {total / 60:.1f} min "
        f"(load average {load:.1f} at the end)"
    )
    print(
        f"| {args.runs} | {tomllib.loads(spec.read_text())['num_canaries']} | {hangs} | "
        f"{dict(statuses)} | {statistics.median(times):.1f} s | {max(times):.1f} s | "
        f"{total / 60:.1f} min |"
    )
    return 1 if hangs else 0


if __name__ == "__main__":
    raise SystemExit(main())
