"""What a record-level canary plan costs the service (issue #37, docs/record-level.md "Sizes"):
the seconds to generate one plan row (one DP-SGD step's sum of sampled canary directions) at
dimension ``d``, and the plan's bytes for ``steps`` steps.

Rerun:
    PYTHONPATH=. .venv/bin/python benchmarks/record_plan_cost.py --dim 1000000 --steps 36
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from flaudit.auditor.canaries import seen_mask
from flaudit.auditor.estimators.record_level import SeededRecordCanaries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=10**6)
    parser.add_argument("--steps", type=int, default=36, help="steps of one plan")
    parser.add_argument("--canaries", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rows", type=int, default=10, help="rows timed")
    args = parser.parse_args()
    seed = 12345678901234567890  # public: a benchmark's seed
    seen = seen_mask(seed, args.canaries) & (np.arange(args.canaries) % args.clients == 0)
    source = SeededRecordCanaries(seed, seen, sample_rate=1 / 18)
    source.step_canary_sum(0, args.dim)  # the family, built once
    started = time.perf_counter()
    for step in range(1, args.rows + 1):
        source.step_canary_sum(step, args.dim)
    per_row = (time.perf_counter() - started) / args.rows
    size = args.steps * args.dim * 4
    print(
        f"d = {args.dim}: {per_row * 1e3:.1f} ms per plan row; a {args.steps}-step plan is "
        f"{size / 2**20:.0f} MiB and {per_row * args.steps:.1f} s of one core"
    )


if __name__ == "__main__":
    main()
