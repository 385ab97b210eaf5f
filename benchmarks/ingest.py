"""Benchmark: ingest one round's model delta into the auditor's CosineTracker.

Compares a tracker that keeps every canary in a cached float32 bank (one matrix-vector product per
round) with one that regenerates every canary from its counter-based stream each round (what the
paper's code does). Each mode runs in its own subprocess so that its peak memory (ru_maxrss) is its
own. Not a test: results go to docs/benchmarks.md.

    .venv/bin/python benchmarks/ingest.py                  # d = 1.2M, k = 2000 (needs ~10 GB RAM)
    .venv/bin/python benchmarks/ingest.py --d 200000 --k 500 --rounds 2   # quick
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def _child(mode: str, d: int, k: int, rounds: int, chunk: int, workers: int) -> dict:
    import numpy as np

    from auditor.canaries import new_master_seed
    from auditor.statistics import CosineTracker

    seed = new_master_seed()
    rng = np.random.default_rng(0)
    deltas = [rng.standard_normal(d, dtype=np.float32) for _ in range(rounds)]
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    cache = k * d * 4 if mode == "cached" else 0
    tracker = CosineTracker(
        seed, k, d, family="gaussian", chunk_size=chunk, cache_bytes=cache, workers=workers
    )
    setup = time.perf_counter() - start
    times = []
    for delta in deltas:
        t0 = time.perf_counter()
        tracker.update(delta)
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "mode": mode,
        "d": d,
        "k": k,
        "chunk_size": chunk,
        "workers": workers,
        "rounds": rounds,
        "setup_seconds": setup,
        "round_seconds": times,
        "median_round_seconds": float(np.median(times)),
        "peak_rss_mib": peak / 1024,
        "baseline_rss_mib": rss_before / 1024,
        "bank_mib": cache / 2**20,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d", type=float, default=1.2e6)
    parser.add_argument("--k", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3, help="rounds timed in cached mode")
    parser.add_argument("--regen-rounds", type=int, default=1, help="rounds timed when regenerating")
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--workers", type=int, default=1,
                        help="threads generating canaries (bank build and regeneration)")
    parser.add_argument("--modes", default="cached,regenerate")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    d = int(args.d)
    if args.child:
        rounds = args.rounds if args.child == "cached" else args.regen_rounds
        print(json.dumps(_child(args.child, d, args.k, rounds, args.chunk, args.workers)))
        return 0
    results = []
    for mode in args.modes.split(","):
        cmd = [sys.executable, __file__, "--child", mode, "--d", str(d), "--k", str(args.k),
               "--rounds", str(args.rounds), "--regen-rounds", str(args.regen_rounds),
               "--chunk", str(args.chunk), "--workers", str(args.workers)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        res = json.loads(out.stdout.strip().splitlines()[-1])
        results.append(res)
        print(f"{mode:>10} (workers={args.workers}): setup {res['setup_seconds']:.1f} s, per round {res['median_round_seconds']:.3f} s "
              f"(rounds {[round(t, 3) for t in res['round_seconds']]}), peak RSS {res['peak_rss_mib']:.0f} MiB",
              flush=True)
    by_mode = {r["mode"]: r for r in results}
    if {"cached", "regenerate"} <= by_mode.keys():
        ratio = by_mode["regenerate"]["median_round_seconds"] / by_mode["cached"]["median_round_seconds"]
        print(f"speed-up of the cached bank: {ratio:.0f}x")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
