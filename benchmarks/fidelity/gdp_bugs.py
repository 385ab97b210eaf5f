"""DP-bug injection with the Gaussian-DP claim tests and the alarm at every look, beside today's
bounds, on the same simulated runs.

Simulated DP-FedAvg (:func:`flaudit.server.simulated_audit.simulate_dpfedavg_audit`: the server's own schedule
and aggregation code, numpy clients), k = 1000 canaries, claim z = 1 with one known round per
seen canary (known-rounds claim mu = 1, i.e. epsilon 4.38 at delta = 1e-6), server momentum 0.9.
Per run, the alarm (:func:`flaudit.auditor.claims.decide_alarm`) is evaluated at every one of the
``T + 1`` looks exactly as the service would: after each round on ``summarize(max_cosines,
known_rounds_scores, claims)``, and at the end with the final-model cosines too.

Columns (share of runs):

* ``error``: the alarm as shipped (:func:`decide_alarm` defaults: the known-rounds claim tests,
  alpha = 5% over all looks and tests) fires at any look;
* ``poisson_warning``: with ``poisson_warning=True`` (the Poisson-subsampled claim's tests
  alarming too, as warnings, sharing the level) a warning or error fires at any look;
* ``mu_lo > mu``: the known-rounds Gaussian-DP lower bound (end) above the claimed mu;
* ``f-DP 1-run``: the one-run f-DP audit's p-value for the known-rounds claim <= 5% (end);
* ``ε_lo > claim`` / ``Steinke > claim``: today's valid bounds (eps_lo Bonferroni for final
  model and all iterates; the Steinke one-run bound) above the known-rounds epsilon claim (end);
* ``sequential``: the sequential test by betting (González et al.) of the known-rounds
  (epsilon, delta) claim on the final-model cosine pairs rejects.

    .venv/bin/python -m benchmarks.fidelity.gdp_bugs --reps 200
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
import math  # noqa: E402
import time  # noqa: E402

from benchmarks.fidelity._common import (  # noqa: E402
    clopper_pearson,
    end_statistics,
    look_summaries,
)
from flaudit.auditor.claims import decide_alarm  # noqa: E402
from flaudit.auditor.estimators import SequentialDPTest  # noqa: E402
from flaudit.server.simulated_audit import (
    DPBug,
    FedAvgSimulation,
    claimed_epsilons,
    simulate_dpfedavg_audit,
    simulation_claims,
)

#: The simulated run. Clients send S (0.1 u + g / sqrt(d)) (mostly their own direction), so the
#: real clients' projections onto a canary stay small beside the DP noise.
BASE = FedAvgSimulation(
    dim=10_000,
    num_clients=2000,
    clients_per_round=100,
    num_rounds=10,
    num_canaries=1000,
    canary_repeats=1,
    noise_multiplier=1.0,
    clip_norm=1.0,
    momentum=0.9,
    client_signal=0.1,
    client_noise=1.0,
    delta=1e-6,
)

ROWS = [
    ("correct, fixed clipping", dict()),
    ("correct, adaptive clipping", dict(adaptive_clipping=True)),
    ("no noise", dict(bug=DPBug.no_noise)),
    ("noise × 0.5", dict(bug=DPBug.noise_scale, bug_factor=0.5)),
    ("no clipping ×4", dict(bug=DPBug.no_clipping, bug_factor=4.0)),
    ("4× participations", dict(bug=DPBug.extra_participation, bug_factor=4.0)),
]

COLUMNS = [
    "error",
    "poisson_warning",
    "error_final_only",
    "mu_lo",
    "fdp_one_run",
    "eps_lo",
    "steinke",
    "sequential",
]


def one_run(config: FedAvgSimulation, claims, eps_claim: float, seed: int) -> dict[str, bool]:
    result = simulate_dpfedavg_audit(config, seed=seed)
    looks = config.num_rounds + 1
    seen, d, delta = result.seen, result.dim, config.delta
    summaries = list(
        look_summaries(
            result,
            delta,
            config.num_rounds,
            at_round=lambda t: dict(
                threat_models=("all_iterates",),
                max_cosines=result.max_cosines_history[t - 1],
                known_rounds_scores=result.known_rounds_history[t - 1],
                known_rounds_rounds=result.rounds_at(t),
            ),
            at_end=dict(end_statistics(result), one_run=True),
            scale_dof=result.scale_dof,
            claims=claims,
        )
    )
    statuses = [
        decide_alarm(summary.claim_tests, look=t, num_looks=looks).status
        for t, summary in summaries
    ]
    with_poisson = [
        decide_alarm(summary.claim_tests, look=t, num_looks=looks, poisson_warning=True).status
        for t, summary in summaries
    ]
    final, final_status = summaries[-1][1], statuses[-1]
    est = {(e.threat_model, e.estimator.value, e.correction.value): e for e in final.estimates}
    mu_claim = claims[0].mu
    valid_eps_lo = [
        est[(tm, "lower_bound", "bonferroni")].epsilon
        for tm in ("final_model", "all_iterates")
        if (tm, "lower_bound", "bonferroni") in est
    ]
    steinke = [e.epsilon for e in final.estimates if e.estimator.value == "one_run"]
    fdp = est.get(("final_model", "fdp_one_run", "bonferroni"))
    known = est.get(("known_rounds", "gdp_lower_bound", "bonferroni"))
    seq = SequentialDPTest(eps_claim, delta)
    s, u = result.final_cosines[seen] * math.sqrt(d), result.final_cosines[~seen] * math.sqrt(d)
    n = min(s.size, u.size)
    seq.update_many(s[:n, None], u[:n, None])
    return {
        "error": "error" in statuses,
        "poisson_warning": any(x in ("error", "warning") for x in with_poisson),
        "error_final_only": final_status == "error",
        "mu_lo": bool(known is not None and known.mu > mu_claim),
        "fdp_one_run": bool(fdp is not None and fdp.details.get("claim_p_value", 1.0) <= 0.05),
        "eps_lo": any(v > eps_claim for v in valid_eps_lo),
        "steinke": any(v > eps_claim for v in steinke),
        "sequential": bool(seq.rejected),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=200, help="runs per correct row")
    parser.add_argument(
        "--bug-reps", type=int, default=None, help="runs per bug row (default --reps)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rows", default=None, help="comma-separated row numbers (0-based)")
    args = parser.parse_args()
    rows = ROWS if args.rows is None else [ROWS[int(i)] for i in args.rows.split(",")]
    eps_claim = claimed_epsilons(BASE)["known_rounds"]
    print(
        f"k={BASE.num_canaries}, d={BASE.dim}, T={BASE.num_rounds}, m={BASE.clients_per_round}, "
        f"N={BASE.num_clients}, z=1, momentum {BASE.momentum}, known-rounds claim mu=1 "
        f"(eps={eps_claim:.2f} at delta={BASE.delta:g}); alarm alpha=5% over {BASE.num_rounds + 1} "
        "looks"
    )
    header = "| run | runs | " + " | ".join(COLUMNS) + " |"
    print(header)
    print("|" + "---|" * (len(COLUMNS) + 2))
    t0 = time.time()
    for name, changes in rows:
        config = BASE.with_(**changes)
        claims = simulation_claims(config.with_(bug=DPBug.none, bug_factor=4.0))  # honest claim
        eps_claim = claims[0].epsilon(BASE.delta)  # known-rounds epsilon (z_total if adaptive)
        reps = args.reps if "bug" not in changes else (args.bug_reps or args.reps)
        counts = dict.fromkeys(COLUMNS, 0)
        for rep in range(reps):
            out = one_run(config, claims, eps_claim, seed=args.seed * 1_000_003 + rep)
            for key in COLUMNS:
                counts[key] += out[key]
        cells = []
        for key in COLUMNS:
            lo, hi = clopper_pearson(counts[key], reps)
            cells.append(f"{counts[key] / reps:.1%} ({lo:.0%}–{hi:.0%})")
        print(f"| {name} | {reps} | " + " | ".join(cells) + " |", flush=True)
    print(f"wall time {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
