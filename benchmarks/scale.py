"""Benchmark (issue #23): one orthogonal-family audit round at d = 10^6 ... 10^9, per back end and
thread count -- seconds per round and peak memory beyond the update.

Each cell runs in its own subprocess (its ``ru_maxrss`` is its own): it draws the update (float32,
d values; on the GPU too with ``--on-device``), records the peak RSS, builds a ``CosineTracker``
(set-up timed apart), then times ``--rounds`` calls of ``all_cosines``. Reported: the first round
with set-up (what the issue's 44.2 s measured), the median round, the extra peak host memory
(``ru_maxrss`` after minus before, in units of the update's 4d bytes), the peak GPU memory, the
1-minute load average next to every timing (the machine may be shared), and each round's CPU time
(user + system, all threads: on a loaded machine the wall time says little, and the CPU time over
the cores bounds what an idle machine would take). Every round's time is in
the JSON line printed last.

Modes: ``copy`` (the caller keeps its update: a working copy is made) and ``consume`` (the service:
the round body's buffer is transformed in place). ``--compare-with DIR`` also runs the same cells
with the flaudit checkout in DIR (e.g. the code before #23), alternating old and new cell by cell
so that their ratio is measured under the same load.

    .venv/bin/python benchmarks/scale.py --dims 1e6 1e7 --backends numpy torch --threads 1 2
    .venv/bin/python benchmarks/scale.py --dims 2e8 --backends numpy --modes copy consume --rounds 2
    # on a GPU machine (CUDA torch): the issue's GPU targets (d = 1e8 <= 0.1 s, 1e9 <= 1 s)
    .venv/bin/python benchmarks/scale.py --dims 1e6 2e7 1e8 5e8 1e9 --backends torch --on-device \\
        --rounds 5 --k 10000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def _peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _child(args) -> dict:
    if args.code:
        sys.path.insert(0, args.code)
    import numpy as np

    from flaudit.auditor.statistics import CosineTracker

    d, k = int(args.d), int(args.k)
    torch = None
    if args.backend == "torch" or args.on_device:
        import torch

        torch.set_num_threads(args.threads)
    device = (
        "cuda" if (args.on_device and torch is not None and torch.cuda.is_available()) else None
    )
    rng = np.random.default_rng(0)

    def update():
        v = rng.standard_normal(d, dtype=np.float32)
        if device:
            v = torch.from_numpy(v).to(device)
        return v

    v = update()
    baseline = _peak_bytes()
    options = {"workers": args.threads}
    if not args.code:
        options["backend"] = args.backend
    start = time.perf_counter()
    tracker = CosineTracker(12345, k, d, family="orthogonal", **options)
    setup = time.perf_counter() - start
    times, cpu, loads = [], [], []
    for r in range(args.rounds):
        if args.mode == "consume" and r:
            v = None
            v = update()
        loads.append(os.getloadavg()[0])
        start, start_cpu = time.perf_counter(), time.process_time()
        if args.mode == "copy":
            tracker.all_cosines(v)
        else:
            tracker.all_cosines(v, consume=True)
        if device:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    peak = _peak_bytes()
    out = {
        "d": d,
        "k": k,
        "backend": args.backend,
        "threads": args.threads,
        "mode": args.mode,
        "code": args.code or "this",
        "device": device or "cpu",
        "setup_s": setup,
        "first_round_with_setup_s": setup + times[0],
        "round_s": times,
        "median_round_s": statistics.median(times),
        "cpu_s": cpu,
        "load_1min": loads,
        "extra_peak_host_bytes": peak - baseline,
        "extra_peak_in_4d": (peak - baseline) / (4 * d),
    }
    if device:
        out["peak_gpu_bytes"] = int(torch.cuda.max_memory_allocated())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dims", type=float, nargs="+", default=[1e6, 1e7])
    parser.add_argument("--k", type=float, default=1e4)
    parser.add_argument("--backends", nargs="+", default=["numpy", "torch"])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--modes", nargs="+", default=["copy"], choices=["copy", "consume"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--on-device", action="store_true", help="torch: the update lives on the GPU (no host copy)"
    )
    parser.add_argument(
        "--compare-with",
        default=None,
        help="also run the cells with the flaudit checkout in this directory",
    )
    parser.add_argument(
        "--compare-modes",
        nargs="+",
        default=["copy"],
        choices=["copy", "consume"],
        help="the modes run with --compare-with's code (consume needs code that "
        "has all_cosines(consume=True), i.e. from #23 on)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--d", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--code", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.threads = args.threads[0]
        print(json.dumps(_child(args)))
        return 0
    results = []
    print(
        f"{'d':>11} {'backend':>7} {'thr':>3} {'mode':>7} {'code':>5} | {'round':>8} "
        f"{'1st+setup':>9} | {'extra peak':>10} {'x 4d':>5} | load",
        flush=True,
    )
    for d in args.dims:
        for backend in args.backends:
            for threads in args.threads:
                for mode in args.modes:
                    codes = [None] + ([args.compare_with] if args.compare_with else [])
                    for code in codes:
                        if code and (backend != "numpy" or mode not in args.compare_modes):
                            continue  # compared: the numpy back end, in the modes asked
                        cmd = [
                            sys.executable,
                            __file__,
                            "--child",
                            "--d",
                            str(d),
                            "--k",
                            str(args.k),
                            "--backend",
                            backend,
                            "--threads",
                            str(threads),
                            "--mode",
                            mode,
                            "--rounds",
                            str(args.rounds),
                        ]
                        if args.on_device:
                            cmd.append("--on-device")
                        if code:
                            cmd += ["--code", code]
                        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
                        env["PYTHONPATH"] = code or env.get("PYTHONPATH", "")
                        run = subprocess.run(cmd, capture_output=True, text=True, env=env)
                        label = "old" if code else "new"
                        if run.returncode != 0:
                            print(
                                f"{int(d):>11} {backend:>7} {threads:>3} {mode:>7} {label:>5} | "
                                f"failed: {run.stderr.strip()[-300:]}",
                                flush=True,
                            )
                            continue
                        res = json.loads(run.stdout.strip().splitlines()[-1])
                        results.append(res)
                        gpu = (
                            f" gpu {res['peak_gpu_bytes'] / 2**30:.2f} GiB"
                            if "peak_gpu_bytes" in res
                            else ""
                        )
                        print(
                            f"{int(d):>11} {backend:>7} {threads:>3} {mode:>7} {label:>5} | "
                            f"{res['median_round_s']:>7.3f}s {res['first_round_with_setup_s']:>8.2f}s"
                            f" | {res['extra_peak_host_bytes'] / 1e9:>7.2f} GB "
                            f"{res['extra_peak_in_4d']:>5.2f} | "
                            f"{' '.join(f'{x:.1f}' for x in res['load_1min'])}{gpu}"
                            f" | cpu {' '.join(f'{x:.1f}' for x in res.get('cpu_s', []))} s",
                            flush=True,
                        )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
