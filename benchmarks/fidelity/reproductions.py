"""Reproductions of Andrew et al. (2023) on the simulated DP-FedAvg (flaudit.server.simulated_audit).

* ``table34``: the Table 3/4 pattern -- noise multipliers with analytic epsilon ~300, 100, 30
  (known-rounds Gaussian mechanism, one participation, dp-accounting) and clipping only:
  eps_est-all close to the analytic epsilon under moderate noise, eps_est-final far lower.
  The real-Flower version of this table is ``benchmarks/table34.py``.
* ``figure2``: eps_est and eps_lo rise with canary repeats 1/2/4/8.
* ``table5``: one run with 1000 canaries vs ten runs with 100 canaries each (final-model
  estimate over the pooled cosines): 0.1/0.3/0.5/0.7/0.9 quantiles over experiments.

Table 2 (Gaussian mechanism) is ``benchmarks/table2.py``.

    .venv/bin/python -m benchmarks.fidelity.reproductions --only table34 figure2 table5
"""

from __future__ import annotations

import argparse
import os
import sys

# Runnable by path too; one BLAS thread per process (shared machine). Before numpy is imported.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
import math  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.fidelity._common import dump, fmt  # noqa: E402
from flaudit.auditor.estimators import final_model_epsilon  # noqa: E402
from flaudit.auditor.estimators.analytic import analytic_epsilon, gaussian_sigma_for_epsilon
from flaudit.server.simulated_audit import FedAvgSimulation, audit_epsilons, simulate_dpfedavg_audit

TARGETS = (math.inf, 300.0, 100.0, 30.0)


def noise_for(target: float, delta: float) -> float:
    """z with known-rounds analytic epsilon ``target`` for one participation (0 for inf)."""
    return 0.0 if math.isinf(target) else gaussian_sigma_for_epsilon(target, delta)


def known_rounds(z: float, repeats: int, delta: float) -> float:
    if z == 0:
        return math.inf
    return analytic_epsilon(z, 1.0, 1, delta, participations=repeats, accountants=())[0].epsilon


def _median(values):
    return float(np.median(np.asarray(values, dtype=float)))


def table34(base: FedAvgSimulation, reps: int, seed: int) -> list[dict]:
    rows = []
    print(
        f"{'noise':>7} {'analytic':>9} | {'eps_lo-all':>10} {'eps_est-all':>11} | "
        f"{'eps_lo-final':>12} {'eps_est-final':>13} (medians over {reps} runs)",
        flush=True,
    )
    for i, target in enumerate(TARGETS):
        z = noise_for(target, base.delta)
        cfg = base.with_(noise_multiplier=z)
        runs = [
            audit_epsilons(
                simulate_dpfedavg_audit(cfg, seed=seed + 1000 * i + r),
                delta=cfg.delta,
                one_run=False,
            )
            for r in range(reps)
        ]
        row = {"noise_multiplier": z, "analytic_epsilon": known_rounds(z, 1, cfg.delta)}
        for key, name in (
            ("all_iterates/lower_bound/none", "eps_lo_all"),
            ("all_iterates/two_gaussian/fitted", "eps_est_all"),
            ("final_model/lower_bound/none", "eps_lo_final"),
            ("final_model/two_gaussian/null", "eps_est_final"),
            ("final_model/two_gaussian/fitted", "eps_est_final_fitted"),
            ("all_iterates/lower_bound/bonferroni", "eps_lo_all_bonferroni"),
            ("final_model/lower_bound/bonferroni", "eps_lo_final_bonferroni"),
        ):
            row[name] = _median([r[key] for r in runs])
        rows.append(row)
        print(
            f"{z:>7.4f} {fmt(row['analytic_epsilon'], 1):>9} | {row['eps_lo_all']:>10.2f} "
            f"{fmt(row['eps_est_all'], 1):>11} | {row['eps_lo_final']:>12.2f} "
            f"{fmt(row['eps_est_final'], 2):>13}",
            flush=True,
        )
    return rows


def figure2(base: FedAvgSimulation, reps: int, seed: int) -> list[dict]:
    rows = []
    print(
        f"{'noise':>7} {'repeats':>7} {'analytic':>9} | {'eps_est-all':>11} {'eps_lo-all':>10} | "
        f"{'eps_est-final':>13} {'eps_lo-final':>12}",
        flush=True,
    )
    for i, target in enumerate(TARGETS):
        z = noise_for(target, base.delta)
        for repeats in (1, 2, 4, 8):
            cfg = base.with_(noise_multiplier=z, canary_repeats=repeats)
            runs = [
                audit_epsilons(
                    simulate_dpfedavg_audit(cfg, seed=seed + 10_000 * i + 100 * repeats + r),
                    delta=cfg.delta,
                    one_run=False,
                )
                for r in range(reps)
            ]
            row = {
                "noise_multiplier": z,
                "repeats": repeats,
                "analytic_epsilon": known_rounds(z, repeats, cfg.delta),
                "eps_est_all": _median([r["all_iterates/two_gaussian/fitted"] for r in runs]),
                "eps_lo_all": _median([r["all_iterates/lower_bound/none"] for r in runs]),
                "eps_est_final": _median([r["final_model/two_gaussian/null"] for r in runs]),
                "eps_lo_final": _median([r["final_model/lower_bound/none"] for r in runs]),
            }
            rows.append(row)
            print(
                f"{z:>7.4f} {repeats:>7} {fmt(row['analytic_epsilon'], 1):>9} | "
                f"{fmt(row['eps_est_all'], 1):>11} {row['eps_lo_all']:>10.2f} | "
                f"{fmt(row['eps_est_final'], 2):>13} {row['eps_lo_final']:>12.2f}",
                flush=True,
            )
    return rows


def table5(base: FedAvgSimulation, experiments: int, seed: int) -> list[dict]:
    rows = []
    qs = (0.1, 0.3, 0.5, 0.7, 0.9)
    print(f"{'noise':>7} {'runs/canaries':>13} | " + " ".join(f"{q:>6}" for q in qs), flush=True)
    for i, target in enumerate((300.0, 100.0)):
        z = noise_for(target, base.delta)
        # same real-client cohort in both arms: fix q at the 1000-canary value (the service's
        # q = m / (N + k/2) would otherwise give the 100-canary runs more real clients)
        q = base.clients_per_round / (base.num_clients + 1000 / 2)
        arm = base.with_(noise_multiplier=z, sampling_probability=q)
        one, ten = [], []
        for e in range(experiments):
            s0 = seed + 10**6 * i + 1000 * e
            big = simulate_dpfedavg_audit(arm.with_(num_canaries=1000), seed=s0)
            one.append(
                final_model_epsilon(big.final_cosines[big.seen], big.dim, base.delta).epsilon
            )
            pooled = []
            for r in range(10):
                small = simulate_dpfedavg_audit(arm.with_(num_canaries=100), seed=s0 + 1 + r)
                pooled.append(small.final_cosines[small.seen])
            ten.append(final_model_epsilon(np.concatenate(pooled), base.dim, base.delta).epsilon)
        for label, values in (("1/1000", one), ("10/100", ten)):
            quant = [float(np.quantile(values, q)) for q in qs]
            rows.append(
                {
                    "noise_multiplier": z,
                    "runs_canaries": label,
                    "quantiles": dict(zip(qs, quant)),
                    "experiments": experiments,
                }
            )
            print(f"{z:>7.4f} {label:>13} | " + " ".join(f"{v:>6.2f}" for v in quant), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--only",
        nargs="+",
        default=["table34", "figure2", "table5"],
        choices=["table34", "figure2", "table5"],
    )
    p.add_argument("--reps", type=int, default=5, help="runs per cell (table34, figure2)")
    p.add_argument("--experiments", type=int, default=20, help="experiments per noise (table5)")
    p.add_argument("--dim", type=int, default=20_000)
    p.add_argument("--num-rounds", type=int, default=50)
    p.add_argument("--num-canaries", type=int, default=1000)
    p.add_argument("--clients-per-round", type=int, default=20)
    p.add_argument("--client-signal", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=34)
    args = p.parse_args(argv)
    base = FedAvgSimulation(
        dim=args.dim,
        num_rounds=args.num_rounds,
        num_canaries=args.num_canaries,
        clients_per_round=args.clients_per_round,
        client_signal=args.client_signal,
    )
    print(f"config: {base}", flush=True)
    out = {"config": str(base)}
    for name in args.only:
        t0 = time.perf_counter()
        print(f"== {name}", flush=True)
        if name == "table34":
            out[name] = table34(base, args.reps, args.seed)
        elif name == "figure2":
            out[name] = figure2(base, args.reps, args.seed)
        else:
            out[name] = table5(base, args.experiments, args.seed)
        print(f"({time.perf_counter() - t0:.0f} s)", flush=True)
    print(dump(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
