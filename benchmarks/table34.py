"""Andrew et al. Tables 3/4, qualitatively, on a built-in task.

For each noise multiplier z and canary repeats r, run one audited DP-FedAvg training and print
eps_est-final (null and fitted variance), eps_est-all and the 95% eps_lo bounds. The expected
pattern: eps_est-all >= eps_est-final, both fall as z grows, both rise with r.

    .venv/bin/python benchmarks/table34.py                 # default grid, in-process engine
    .venv/bin/python benchmarks/table34.py --engine simulation   # through Flower + Ray (slower)
    .venv/bin/python benchmarks/table34.py --z 0.5 1 2 --repeats 1 4 --runs 2 --json out.json

The in-process engine runs the same ServerApp loop (flaudit.server.app.run_audit) and ClientApp handler
without the Flower runtime; the math is identical.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from flaudit.auditor.canaries import seen_mask  # noqa: E402
from flaudit.auditor.claims import AuditLook, summarize  # noqa: E402
from flaudit.auditor.spec import AuditSpec  # noqa: E402
from flaudit.server.reporting import LocalRoundReporter  # noqa: E402


def pick(estimates, *, estimator, threat_model, variance=None, correction=None):
    for e in estimates:
        if (
            e.estimator.value == estimator
            and e.threat_model == threat_model
            and (variance is None or e.variance.value == variance)
            and (correction is None or e.correction.value == correction)
        ):
            return e.epsilon
    return math.nan


def run_one(args, z: float, repeats: int, run: int) -> dict:
    spec = AuditSpec(
        name=f"table34-z{z}-r{repeats}",
        task=args.task,
        task_options={"dim": args.dim, "test_size": 500} if args.task == "synthetic" else {},
        num_rounds=args.rounds,
        num_clients=args.clients,
        clients_per_round=args.cohort,
        participation="uniform",
        num_canaries=args.canaries,
        canary_repeats=repeats,
        clip_norm=1.0,
        noise_multiplier=z,
        server_learning_rate=1.0,
        client_learning_rate=0.1,
        batch_size=16,
        delta=args.delta,
        data_seed=run,
        max_canary_fraction=0.5,
        timeout_seconds=3600,
    )
    seed = 10_000 * run + 17  # benchmark seeds are not secret
    reporter = LocalRoundReporter.for_audit(
        canary_seed=seed, num_canaries=spec.num_canaries, canary_family=spec.canary_family
    )
    started = time.monotonic()
    if args.engine == "simulation":
        from flaudit.server.simulation import run_simulation_audit

        result = run_simulation_audit(
            spec, canary_seed=seed, reporter=reporter, noise_seed=run, max_supernodes=2
        )
    else:
        from flaudit.server.simulation import run_inprocess_audit

        result = run_inprocess_audit(spec, canary_seed=seed, reporter=reporter, noise_seed=run)
    tracker = reporter.tracker
    summary = summarize(
        AuditLook(
            seen=seen_mask(seed, spec.num_canaries),
            dim=tracker.dim,
            delta=spec.delta,
            max_cosines=tracker.max_cosines,
            final_cosines=tracker.final_cosines,
            num_rounds=tracker.num_rounds,
        )
    )
    est = summary.estimates
    return {
        "z": z,
        "repeats": repeats,
        "run": run,
        "eps_final_null": pick(
            est, estimator="two_gaussian", threat_model="final_model", variance="null"
        ),
        "eps_final_fitted": pick(
            est, estimator="two_gaussian", threat_model="final_model", variance="fitted"
        ),
        "eps_all": pick(est, estimator="two_gaussian", threat_model="all_iterates"),
        "eps_lo_final": pick(
            est, estimator="lower_bound", threat_model="final_model", correction="none"
        ),
        "eps_lo_all": pick(
            est, estimator="lower_bound", threat_model="all_iterates", correction="none"
        ),
        "accuracy": result["metrics"]["accuracy"],
        "dim": tracker.dim,
        "seconds": time.monotonic() - started,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", default="synthetic", choices=["synthetic", "digits"])
    parser.add_argument("--dim", type=int, default=10_000, help="synthetic model size d")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--clients", type=int, default=300)
    parser.add_argument(
        "--cohort", type=int, default=30, help="clients_per_round m (real + canaries)"
    )
    parser.add_argument("--canaries", type=int, default=100)
    parser.add_argument("--z", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0])
    parser.add_argument("--repeats", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--runs", type=int, default=1, help="independent runs per cell (median)")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--engine", choices=["inprocess", "simulation"], default="inprocess")
    parser.add_argument("--json", default=None, help="also write all rows to this file")
    args = parser.parse_args(argv)

    rows = []
    for z in args.z:
        for r in args.repeats:
            for run in range(args.runs):
                row = run_one(args, z, r, run)
                rows.append(row)
                print(
                    f"  z={z:<5g} r={r} run={run}: all {row['eps_all']:.3g}, final {row['eps_final_null']:.3g}"
                    f" ({row['seconds']:.1f} s)",
                    file=sys.stderr,
                )

    def med(z, r, key):
        return float(np.median([x[key] for x in rows if x["z"] == z and x["repeats"] == r]))

    print(
        f"\ntask={args.task} d={rows[0]['dim']} T={args.rounds} N={args.clients} m={args.cohort} "
        f"k={args.canaries} delta={args.delta:g} engine={args.engine} runs/cell={args.runs} (median)"
    )
    head = (
        f"{'z':>5} {'r':>2} | {'eps_est-all':>11} {'eps_lo-all':>10} | {'eps_est-final':>13} "
        f"{'(fitted var)':>12} {'eps_lo-final':>12} | {'acc':>5}"
    )
    print(head)
    print("-" * len(head))
    for z in args.z:
        for r in args.repeats:
            print(
                f"{z:>5g} {r:>2} | {med(z, r, 'eps_all'):>11.3g} {med(z, r, 'eps_lo_all'):>10.3g} | "
                f"{med(z, r, 'eps_final_null'):>13.3g} {med(z, r, 'eps_final_fitted'):>12.3g} "
                f"{med(z, r, 'eps_lo_final'):>12.3g} | {med(z, r, 'accuracy'):>5.3f}"
            )
    checks = {
        "all >= final (null var) in every cell": all(
            med(z, r, "eps_all") >= med(z, r, "eps_final_null")
            for z in args.z
            for r in args.repeats
        ),
        "eps_est-all falls with z (each r)": all(
            all(np.diff([med(z, r, "eps_all") for z in args.z]) <= 0) for r in args.repeats
        ),
        "eps_est-final falls with z (each r)": all(
            all(np.diff([med(z, r, "eps_final_null") for z in args.z]) <= 0) for r in args.repeats
        ),
        "eps_est-all rises with r (each z)": all(
            all(np.diff([med(z, r, "eps_all") for r in args.repeats]) >= 0) for z in args.z
        ),
        "eps_est-final rises with r (each z)": all(
            all(np.diff([med(z, r, "eps_final_null") for r in args.repeats]) >= 0) for z in args.z
        ),
    }
    for name, ok in checks.items():
        print(f"  [{'x' if ok else ' '}] {name}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "rows": rows, "checks": checks}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
