"""DP-bug injection: does the audit raise the alarm when DP-FedAvg is implemented wrongly?

Simulated DP-FedAvg (flaudit.server.simulated_audit: the server's own schedule and aggregation code, numpy
clients) with one injected bug per row. The *claim* is what the service shows for the configured
(z, q, T, canary_repeats) via dp-accounting (flaudit.server.simulated_audit.claimed_epsilons, same call as
flaudit.service.live.analytic_results). The alarm is raised when any valid 95% lower bound the
service computes (eps_lo with Bonferroni for final model and all iterates, the one-run bound for
both statistics) exceeds the known-rounds claim -- the bound that applies to a canary inserted in
exactly ``canary_repeats`` rounds. Alarm rates against the Poisson-subsampled claim and the share
of runs where the all-iterates point estimate exceeds the claim are reported beside it.

    .venv/bin/python -m benchmarks.fidelity.bugs --reps 40 --null-reps 100
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

from benchmarks.fidelity._common import clopper_pearson, dump, fmt  # noqa: E402
from flaudit.auditor.estimators.analytic import analytic_epsilon  # noqa: E402
from flaudit.server.simulated_audit import (
    VALID_LOWER_BOUNDS,
    DPBug,
    FedAvgSimulation,
    audit_epsilons,
    claimed_epsilons,
    claimed_sampling_probability,
    simulate_dpfedavg_audit,
)

CASES = [
    (DPBug.none, 1.0),
    (DPBug.no_noise, 1.0),
    (DPBug.noise_divided_twice, 1.0),
    (DPBug.no_clipping, 4.0),
    (DPBug.no_clipping, 16.0),
    (DPBug.cohort_larger, 4.0),
    (DPBug.batch_then_shuffle, 1.0),
    (DPBug.extra_participation, 4.0),
]


def true_epsilons(config: FedAvgSimulation) -> dict[str, float]:
    """What the bug does to epsilon (dp-accounting): for a canary (known rounds) and for a real
    client under Poisson sampling. ``nan`` where no accountant applies."""
    z, r, t, delta = config.noise_multiplier, config.canary_repeats, config.num_rounds, config.delta
    q = claimed_sampling_probability(config)
    bug, f = config.bug, config.bug_factor

    def known(z_eff: float, parts: int) -> float:
        if z_eff == 0:
            return math.inf
        return analytic_epsilon(z_eff, 1.0, 1, delta, participations=parts, accountants=())[
            0
        ].epsilon

    def poisson(z_eff: float, q_eff: float) -> float:
        if z_eff == 0:
            return math.inf
        return analytic_epsilon(z_eff, min(1.0, q_eff), t, delta, accountants=("pld",))[0].epsilon

    if bug is DPBug.no_noise:
        return {"canary": math.inf, "client": math.inf}
    if bug is DPBug.noise_divided_twice:
        z_eff = z / config.clients_per_round
        return {"canary": known(z_eff, r), "client": poisson(z_eff, q)}
    if bug is DPBug.no_clipping:  # a client whose update has norm f * S
        return {"canary": known(z / f, r), "client": poisson(z / f, q)}
    if bug is DPBug.cohort_larger:
        return {"canary": known(z, r), "client": poisson(z, q * f)}
    if bug is DPBug.batch_then_shuffle:
        return {"canary": known(z, r), "client": math.nan}
    if bug is DPBug.extra_participation:
        return {"canary": known(z, int(round(r * f))), "client": poisson(z, q * f)}
    return {"canary": known(z, r), "client": poisson(z, q)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--reps", type=int, default=40, help="runs per bug")
    p.add_argument("--null-reps", type=int, default=100, help="runs of the correct implementation")
    p.add_argument("--dim", type=int, default=10_000)
    p.add_argument("--num-canaries", type=int, default=1000)
    p.add_argument("--num-rounds", type=int, default=10)
    p.add_argument("--noise-multiplier", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=66)
    p.add_argument(
        "--cases",
        nargs="+",
        default=None,
        help="subset of bug:factor cases, e.g. none:1 no_clipping:4 (default: all)",
    )
    args = p.parse_args(argv)
    base = FedAvgSimulation(
        dim=args.dim,
        num_canaries=args.num_canaries,
        num_rounds=args.num_rounds,
        noise_multiplier=args.noise_multiplier,
    )
    claims = claimed_epsilons(base)
    claim = claims["known_rounds"]
    print(f"config: {base}")
    print(
        f"claimed (service, dp-accounting): known_rounds {claim:.3f}, poisson pld "
        f"{claims['poisson_pld']:.3f}, poisson rdp {claims['poisson_rdp']:.3f}",
        flush=True,
    )
    cases = CASES
    if args.cases:
        wanted = {
            (DPBug(c.split(":")[0]), float(c.split(":")[1]) if ":" in c else 1.0)
            for c in args.cases
        }
        cases = [c for c in CASES if c in wanted]
    rows = []
    for bug, factor in cases:
        case_index = CASES.index((bug, factor))
        cfg = base.with_(bug=bug, bug_factor=factor)
        reps = args.null_reps if bug is DPBug.none else args.reps
        truth = true_epsilons(cfg)
        t0 = time.perf_counter()
        alarms = alarms_poisson = alarms_uncorrected = est_above = 0
        per_bound = {b: 0 for b in VALID_LOWER_BOUNDS}
        best = []
        for r in range(reps):
            res = simulate_dpfedavg_audit(cfg, seed=args.seed * 10**6 + case_index * 10**4 + r)
            e = audit_epsilons(res, delta=cfg.delta)
            valid = max(e[b] for b in VALID_LOWER_BOUNDS)
            best.append(valid)
            alarms += valid > claim
            alarms_poisson += valid > claims["poisson_pld"]
            alarms_uncorrected += (
                max(e["final_model/lower_bound/none"], e["all_iterates/lower_bound/none"]) > claim
            )
            est_above += e["all_iterates/two_gaussian/fitted"] > claim
            for b in VALID_LOWER_BOUNDS:
                per_bound[b] += e[b] > claim
        row = {
            "bug": bug.value,
            "bug_factor": factor,
            "reps": reps,
            "true_epsilon_canary": truth["canary"],
            "true_epsilon_client": truth["client"],
            "ratio_canary": truth["canary"] / claim,
            "alarm_rate": alarms / reps,
            "alarm_ci95": clopper_pearson(alarms, reps),
            "alarm_rate_vs_poisson_claim": alarms_poisson / reps,
            "uncorrected_alarm_rate": alarms_uncorrected / reps,
            "estimate_above_claim_rate": est_above / reps,
            "per_bound_rate": {b: v / reps for b, v in per_bound.items()},
            "median_best_valid_bound": float(np.median(best)),
            "seconds_per_run": (time.perf_counter() - t0) / reps,
        }
        rows.append(row)
        lo, hi = row["alarm_ci95"]
        print(
            f"{bug.value:>20} x{factor:<4g} true eps canary {fmt(truth['canary']):>7} "
            f"(x{fmt(row['ratio_canary'])}) client {fmt(truth['client']):>7} | alarm "
            f"{row['alarm_rate']:.3f} [{lo:.3f}, {hi:.3f}] | vs poisson claim "
            f"{row['alarm_rate_vs_poisson_claim']:.3f} | uncorrected {row['uncorrected_alarm_rate']:.3f}"
            f" | eps_est-all > claim {row['estimate_above_claim_rate']:.3f} | median best bound "
            f"{row['median_best_valid_bound']:.2f} | {row['seconds_per_run']:.2f} s/run",
            flush=True,
        )
    print(dump({"config": str(base), "claims": claims, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
