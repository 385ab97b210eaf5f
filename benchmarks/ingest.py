"""Benchmark: ingest one round's model delta into the auditor's CosineTracker, per canary family.

Three ways to score the k canaries of a round, side by side in one run, each cell in its own
subprocess so that its peak memory (``ru_maxrss``) is its own:

* ``orthogonal``: the orthogonal family (two float32 DCTs of length d per round, whatever k);
* ``default``: the gaussian family as the service ran it before (a 256 MiB canary cache, every
  other canary regenerated from its Philox stream each round, ``workers=1``);
* ``bank``: the gaussian family with every canary in a float32 bank (``k d 4`` bytes).

``default`` and ``bank`` are infeasible at most sizes (minutes per round; a 20M x 100,000 bank
is 8 TB), so by default they are *measured on a subset* and *extrapolated* linearly in k:
``default`` times a round with the cached canaries plus ``--regen-sample`` regenerated ones and
scales the regenerated part to k; ``bank`` times the matrix-vector product of a
``--bank-sample``-row bank (at most 512 MiB) and scales it to k (the bank build likewise). Every extrapolated
number is marked so in the output. ``--full`` runs chosen cells for real.

The orthogonal child also checks float32 accuracy: its cosines against a float64 transform of
the same delta (maximum error in units of the null standard deviation ``1/sqrt(d)``).

    .venv/bin/python benchmarks/ingest.py                       # the docs/benchmarks.md table
    .venv/bin/python benchmarks/ingest.py --dims 1.2e6 --ks 2000 --full default:1200000:2000
    .venv/bin/python benchmarks/ingest.py --dims 2e5 --ks 500 --rounds 2    # quick smoke run
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

DEFAULT_CACHE_BYTES = 256 << 20  # the service's canary_cache_bytes default
BANK_SAMPLE_BYTES = 512 << 20  # largest bank actually built per extrapolated bank cell


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _deltas(d: int, rounds: int):
    import numpy as np

    rng = np.random.default_rng(0)
    return [rng.standard_normal(d, dtype=np.float32) for _ in range(rounds)]


def _time_rounds(tracker, deltas, cpu: list[float] | None = None) -> list[float]:
    """Wall seconds per round; CPU seconds of this process (all threads) appended to ``cpu``."""
    times = []
    for delta in deltas:
        t0, c0 = time.perf_counter(), time.process_time()
        tracker.update(delta)
        times.append(time.perf_counter() - t0)
        if cpu is not None:
            cpu.append(time.process_time() - c0)
    return times


#: The orthogonal rows as last written into docs/benchmarks.md: (d, k) -> (median wall seconds
#: per round, date, load). Update with the docs when a change moves them.
RECORDED = {
    (1_200_000, 2_000): (0.028, "2026-12-06", "load 1.2"),
    (4_100_000, 2_000): (0.170, "2026-11-23", "idle"),
    (20_000_000, 2_000): (0.745, "2026-11-23", "idle"),
}


#: CPU seconds per round (all threads, median) as last written into docs/benchmarks.md: (d, k) ->
#: (seconds, date, load). CPU time moves far less with the machine's load than wall time, so on a
#: shared machine this is the comparison to read.
RECORDED_CPU = {
    (1_200_000, 2_000): (0.0424, "2026-12-06", "load 13-14"),
}


def _orthogonal(d: int, k: int, rounds: int, workers: int) -> dict:
    import numpy as np

    from flaudit.auditor.canaries import new_master_seed
    from flaudit.auditor.statistics import CosineTracker

    deltas = _deltas(d, rounds)
    baseline = _peak_mib()
    start = time.perf_counter()
    tracker = CosineTracker(new_master_seed(), k, d, family="orthogonal", workers=workers)
    setup = time.perf_counter() - start
    cpu: list[float] = []
    times = _time_rounds(tracker, deltas, cpu)
    peak = _peak_mib()
    # float32 accuracy: <c_j, v> through the float32 transform vs the same transform in float64
    family, v = tracker._orthogonal, deltas[0]
    x = family.transpose_apply(v.astype(np.float64), backend="numpy")  # float64 all the way
    exact = x[tracker._positions] / np.linalg.norm(x)
    fast = family.dots(v, tracker._positions) / float(np.linalg.norm(v.astype(np.float64)))
    error_in_null_sd = float(np.max(np.abs(fast - exact)) * np.sqrt(d))
    return {
        "setup_seconds": setup,
        "round_seconds": times,
        "peak_rss_mib": peak,
        "round_cpu_seconds": cpu,
        "baseline_rss_mib": baseline,
        "float32_error_null_sd": error_in_null_sd,
        "extrapolated": False,
    }


def _default(d: int, k: int, regen_sample: int, full: bool) -> dict:
    from flaudit.auditor.canaries import new_master_seed
    from flaudit.auditor.statistics import CosineTracker

    cached = min(k, DEFAULT_CACHE_BYTES // (4 * d))
    deltas = _deltas(d, 1)
    baseline = _peak_mib()
    seed = new_master_seed()
    start = time.perf_counter()
    tracker = CosineTracker(
        seed,
        k if full else max(cached, 1),
        d,
        family="gaussian",
        cache_bytes=DEFAULT_CACHE_BYTES,
        workers=1,
    )
    setup = time.perf_counter() - start
    (measured,) = _time_rounds(tracker, deltas)
    out = {
        "setup_seconds": setup,
        "cached_canaries": cached,
        "extrapolated": not full,
        "baseline_rss_mib": baseline,
    }
    if full or cached >= k:
        out.update(round_seconds=[measured], measured_k=k, peak_rss_mib=_peak_mib())
        return out
    del tracker
    sample = min(regen_sample, k - cached)
    regenerating = CosineTracker(seed, sample, d, family="gaussian", cache_bytes=0, workers=1)
    (regen,) = _time_rounds(regenerating, deltas)
    per_canary = regen / sample
    out.update(
        round_seconds=[measured + per_canary * (k - cached)],
        measured_k=cached + sample,
        seconds_per_regenerated_canary=per_canary,
        peak_rss_mib=_peak_mib(),
    )
    return out


def _bank(d: int, k: int, bank_sample: int, rounds: int, full: bool) -> dict:
    from flaudit.auditor.canaries import new_master_seed
    from flaudit.auditor.statistics import CosineTracker

    measured_k = k if full else min(k, bank_sample, max(4, BANK_SAMPLE_BYTES // (4 * d)))
    deltas = _deltas(d, rounds)
    baseline = _peak_mib()
    start = time.perf_counter()
    tracker = CosineTracker(
        new_master_seed(),
        measured_k,
        d,
        family="gaussian",
        cache_bytes=measured_k * d * 4,
        workers=2,
    )
    setup = time.perf_counter() - start
    times = _time_rounds(tracker, deltas)
    scale = k / measured_k
    return {
        "setup_seconds": setup * scale,
        "round_seconds": [t * scale for t in times],
        "peak_rss_mib": _peak_mib(),
        "baseline_rss_mib": baseline,
        "measured_k": measured_k,
        "bank_mib": k * d * 4 / 2**20,
        "extrapolated": measured_k != k,
    }


def _child(mode: str, d: int, k: int, args) -> dict:
    full = f"{mode}:{d}:{k}" in args.full
    if mode == "orthogonal":
        out = _orthogonal(d, k, args.rounds, args.workers)
    elif mode == "default":
        out = _default(d, k, args.regen_sample, full)
    else:
        out = _bank(d, k, args.bank_sample, args.rounds, full)
    times = sorted(out["round_seconds"])
    out.update(mode=mode, d=d, k=k, median_round_seconds=times[len(times) // 2])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dims", type=float, nargs="+", default=[1.2e6, 4.1e6, 2e7])
    parser.add_argument("--ks", type=int, nargs="+", default=[2000, 10_000, 100_000])
    parser.add_argument("--modes", default="orthogonal,default,bank")
    parser.add_argument("--rounds", type=int, default=5, help="rounds timed (orthogonal, bank)")
    parser.add_argument("--workers", type=int, default=2, help="scipy.fft threads (orthogonal)")
    parser.add_argument(
        "--regen-sample",
        type=int,
        default=16,
        help="regenerated canaries timed per default cell (then extrapolated)",
    )
    parser.add_argument(
        "--bank-sample",
        type=int,
        default=200,
        help="bank rows timed per bank cell (then extrapolated)",
    )
    parser.add_argument(
        "--full",
        nargs="*",
        default=[],
        help="cells run for real, as mode:d:k (e.g. default:1200000:2000)",
    )
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        mode, d, k = args.child[0], int(args.child[1]), int(args.child[2])
        print(json.dumps(_child(mode, d, k, args)))
        return 0
    passthrough = [
        "--rounds",
        str(args.rounds),
        "--workers",
        str(args.workers),
        "--regen-sample",
        str(args.regen_sample),
        "--bank-sample",
        str(args.bank_sample),
        "--full",
        *args.full,
    ]
    results = []
    print(
        f"{'d':>10} {'k':>7} {'mode':>10} | {'per round':>10} {'setup':>8} {'peak RSS':>9} | note",
        flush=True,
    )
    for d in (int(x) for x in args.dims):
        for k in args.ks:
            if k > d:
                continue
            row = {}
            for mode in args.modes.split(","):
                cmd = [sys.executable, __file__, "--child", mode, str(d), str(k), *passthrough]
                out = subprocess.run(cmd, capture_output=True, text=True)
                if out.returncode != 0:
                    print(f"{d:>10} {k:>7} {mode:>10} | failed: {out.stderr.strip()[-300:]}")
                    continue
                res = json.loads(out.stdout.strip().splitlines()[-1])
                times = res["round_seconds"]
                results.append(res)
                row[mode] = res
                note = f"EXTRAPOLATED from k={res['measured_k']}" if res["extrapolated"] else ""
                if mode == "orthogonal":
                    note = (
                        f"CPU {sorted(res['round_cpu_seconds'])[len(times) // 2]:.3f} s/round; "
                        f"float32 error {res['float32_error_null_sd']:.1e} null sd"
                    )
                    last = RECORDED.get((d, k))
                    if last is not None:  # a regression shows the day it lands
                        note += (
                            f"; last recorded {last[0]:.3f} s wall ({last[1]}, "
                            f"{last[2]}): now {res['median_round_seconds'] / last[0]:.1f}x"
                        )
                    last_cpu = RECORDED_CPU.get((d, k))
                    if last_cpu is not None:
                        cpu = sorted(res["round_cpu_seconds"])[len(times) // 2]
                        note += (
                            f"; last recorded CPU {last_cpu[0]:.4f} s ({last_cpu[1]}, "
                            f"{last_cpu[2]}): now {cpu / last_cpu[0]:.2f}x"
                        )
                print(
                    f"{d:>10} {k:>7} {mode:>10} | {res['median_round_seconds']:>9.3f}s "
                    f"{res['setup_seconds']:>7.2f}s {res['peak_rss_mib']:>6.0f} MiB | {note}",
                    flush=True,
                )
            if "orthogonal" in row:
                for other in ("default", "bank"):
                    if other in row:
                        ratio = (
                            row[other]["median_round_seconds"]
                            / row["orthogonal"]["median_round_seconds"]
                        )
                        print(
                            f"{'':>10} {'':>7} {'':>10} | orthogonal {ratio:,.0f}x faster than {other}"
                        )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
