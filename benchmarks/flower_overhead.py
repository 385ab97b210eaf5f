"""Benchmark: what the audit adds to a full Flower round (simulation engine, Ray).

The same task and run (synthetic task, d >= 1M, same data and noise seeds) through the ServerApp
ServerApp (:func:`flaudit.server.app.run_audit`: the built-in DP-FedAvg inside
``CanaryAuditStrategy``, in :func:`flaudit.server.simulation.run_simulation_audit`):

* ``on``: the audit as ``flaudit run`` runs it -- seen canaries added to each round (one
  :meth:`flaudit.auditor.canaries.Canaries.sum_of`) and every round scored by a
  :class:`~flaudit.server.reporting.LocalRoundReporter` (its :class:`~flaudit.auditor.statistics.CosineTracker`),
  both on the wrapper's background threads while the clients train;
* ``off``: the same run without the audit's work: the same participation schedule (so the same
  real clients train in every round), but the round's canary sum is replaced by zeros *in this
  benchmark process only* (nothing derived, generated or inserted) and the reporter drops every
  vector (no tracker).

Per-round wall time is taken between consecutive rounds (round 1 also carries Ray's warm-up and
is left out); runs alternate ``on``/``off`` to share the box's load evenly. Two overheads:
A/B = median round time on / off - 1 (at the mercy of the box's load between runs; also per
on/off pair), and instrumented = how long the ``on`` rounds' main loop waited for the audit
thread (``audit_wait_seconds`` in the run's result) over the rest of those rounds, next to the
audit's own work (the canary sum and the tracker update, timed in place).

    .venv/bin/python benchmarks/flower_overhead.py                 # d = 1M, 4 rounds, 2 pairs
    .venv/bin/python benchmarks/flower_overhead.py --samples-per-client 1000   # real local work
    .venv/bin/python benchmarks/flower_overhead.py --dim 200000 --pairs 1 --rounds 3   # quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")


class _Dropping:
    """A RoundReporter that drops everything (the run without an auditor)."""

    def report_initial(self, initial_model) -> None: ...

    def report_round(self, server_round, delta, metadata) -> None: ...

    def report_final(self, final_model, metrics) -> None: ...


class _Stamped:
    """Wraps a reporter; records when each round's delta arrives and how long scoring took."""

    def __init__(self, inner) -> None:
        self.inner, self.stamps, self.scoring = inner, [], []

    def report_initial(self, initial_model) -> None:
        self.inner.report_initial(initial_model)

    def report_round(self, server_round, delta, metadata) -> None:
        start = time.perf_counter()
        self.inner.report_round(server_round, delta, metadata)
        end = time.perf_counter()
        self.scoring.append(end - start)
        self.stamps.append(end)

    def report_final(self, final_model, metrics) -> None:
        self.inner.report_final(final_model, metrics)


def run_once(mode: str, args) -> dict:
    import numpy as np

    import flaudit.server.local
    from flaudit.auditor.canaries import new_master_seed
    from flaudit.auditor.spec import AuditSpec
    from flaudit.server.reporting import LocalRoundReporter
    from flaudit.server.simulation import run_simulation_audit

    spec = AuditSpec(
        task="synthetic",
        task_options={
            "dim": args.dim,
            "test_size": 200,
            "samples_per_client": args.samples_per_client,
        },
        num_rounds=args.rounds,
        num_clients=args.clients,
        clients_per_round=args.clients_per_round,
        participation="uniform",
        num_canaries=args.canaries,
        noise_multiplier=1.0,
        clip_norm=1.0,
        local_epochs=1,
        data_seed=1,
    )
    seed = new_master_seed()
    original = flaudit.server.local.Canaries
    insertion: list[float] = []

    class TimedCanaries(original):
        def sum_of(self, indices):
            start = time.perf_counter()
            out = super().sum_of(indices)
            insertion.append(time.perf_counter() - start)
            return out

    class NoCanaries:  # benchmark only: nothing derived, generated or inserted
        def __init__(self, seed, dim, **kw) -> None:
            self.dim = dim

        def sum_of(self, indices):
            insertion.append(0.0)
            return np.zeros(self.dim)

    if mode == "on":
        flaudit.server.local.Canaries = TimedCanaries
        inner = LocalRoundReporter.for_audit(
            canary_seed=seed, num_canaries=spec.num_canaries, canary_family=spec.canary_family
        )
    else:
        flaudit.server.local.Canaries = NoCanaries
        inner = _Dropping()
    reporter = _Stamped(inner)
    started = time.perf_counter()
    try:
        result = run_simulation_audit(
            spec, canary_seed=seed, reporter=reporter, max_supernodes=2, num_cpus=2, noise_seed=7
        )
    finally:
        flaudit.server.local.Canaries = original
    rounds = [b - a for a, b in zip(reporter.stamps, reporter.stamps[1:])]
    # the audit's own work in rounds 2..T (on its background thread): canary sum + scoring
    audit = [i + s for i, s in zip(insertion[1:], reporter.scoring[1:])]
    # how long the main loop waited for it (the part on the round's critical path)
    waited = [r["audit_wait_seconds"] for r in result["rounds"][1:]]
    return {
        "mode": mode,
        "dim": result["dim"],
        "seconds_total": time.perf_counter() - started,
        "round_seconds": rounds,
        "median_round_seconds": statistics.median(rounds),
        "audit_seconds": audit,
        "audit_wait_seconds": waited,
        "insertion_seconds": insertion,
        "scoring_seconds": reporter.scoring,
        "canaries_inserted": result["num_seen_canaries_inserted"] if mode == "on" else 0,
        "samples_per_client": args.samples_per_client,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--dim", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--pairs", type=int, default=2, help="on/off pairs, alternating")
    p.add_argument("--clients", type=int, default=1000)
    p.add_argument("--clients-per-round", type=int, default=10)
    p.add_argument(
        "--canaries",
        type=int,
        default=16,
        help="k; the ~k/2 seen ones share the cohort with the real clients",
    )
    p.add_argument(
        "--samples-per-client",
        type=int,
        default=40,
        help="local data per client (the synthetic task's default is 40)",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(run_once(args.child, args)))
        return 0
    import subprocess

    results = []
    for _ in range(args.pairs):
        for mode in ("on", "off"):
            cmd = [
                sys.executable,
                __file__,
                "--child",
                mode,
                "--dim",
                str(args.dim),
                "--rounds",
                str(args.rounds),
                "--clients",
                str(args.clients),
                "--clients-per-round",
                str(args.clients_per_round),
                "--canaries",
                str(args.canaries),
                "--samples-per-client",
                str(args.samples_per_client),
            ]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode:
                print(f"{mode}: failed: {out.stderr[-2000:]}")
                return 1
            res = json.loads(out.stdout.strip().splitlines()[-1])
            results.append(res)
            print(
                f"{mode:>3}: d = {res['dim']}, rounds 2..T {[round(t, 3) for t in res['round_seconds']]} s, "
                f"median {res['median_round_seconds']:.3f} s, whole run {res['seconds_total']:.1f} s, "
                f"canaries inserted {res['canaries_inserted']}; audit work per round "
                f"{[round(t, 3) for t in res['audit_seconds']]} s, main loop waited "
                f"{[round(t, 3) for t in res['audit_wait_seconds']]} s",
                flush=True,
            )
    on = statistics.median(t for r in results if r["mode"] == "on" for t in r["round_seconds"])
    off = statistics.median(t for r in results if r["mode"] == "off" for t in r["round_seconds"])
    print(f"A/B: median round on {on:.3f} s, off {off:.3f} s, overhead {on / off - 1:+.1%}")
    import numpy as np  # a 95% bootstrap interval over rounds for the A/B overhead

    rng = np.random.default_rng(0)
    on_rounds = np.array([t for r in results if r["mode"] == "on" for t in r["round_seconds"]])
    off_rounds = np.array([t for r in results if r["mode"] == "off" for t in r["round_seconds"]])
    boot = [
        np.median(rng.choice(on_rounds, on_rounds.size))
        / np.median(rng.choice(off_rounds, off_rounds.size))
        - 1
        for _ in range(2000)
    ]
    low, high = np.percentile(boot, [2.5, 97.5])
    print(f"A/B 95% bootstrap interval over rounds: [{low:+.1%}, {high:+.1%}]")
    ratios = [
        a["median_round_seconds"] / b["median_round_seconds"] - 1
        for a, b in zip(results[::2], results[1::2])
    ]
    print(f"A/B per pair (on run / the off run after it): {[f'{r:+.1%}' for r in ratios]}")
    # instrumented: the audit's work (background thread) and the main loop's wait for it
    pairs = [
        (a, w, t)
        for r in results
        if r["mode"] == "on"
        for a, w, t in zip(r["audit_seconds"], r["audit_wait_seconds"], r["round_seconds"])
    ]
    audit = statistics.median(a for a, _, _ in pairs)
    wait = statistics.median(w for _, w, _ in pairs)
    rest = statistics.median(t - w for _, w, t in pairs)
    print(
        f"instrumented: audit work {audit:.3f} s per round (canary sum + tracker update, on the "
        f"audit thread while the clients train), main loop waited {wait:.3f} s, rest of the "
        f"round {rest:.3f} s: on the critical path {wait / rest:+.1%} (work if it were serial "
        f"{audit / rest:+.1%})"
    )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
