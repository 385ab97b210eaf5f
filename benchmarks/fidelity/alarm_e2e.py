"""The DP alarm end to end on the simulator (issue #19 validity cells): false alarms over every
look and test on correct runs, and when a clear bug fires.

Simulated DP-FedAvg (:func:`flaudit.server.simulated_audit.simulate_dpfedavg_audit`: the server's own
schedules and aggregation code, numpy clients), claim z = 1, r = 1, T = 10. Per run the alarm is
evaluated at every one of the ``T + 1`` looks exactly as the service does it: after each round
``summarize(known_rounds_scores, known_rounds_participations, claims)`` and
:func:`flaudit.auditor.claims.decide_alarm`; at the end with the final-model cosines too.

Rerun (the default sizes take a few minutes on one core; ``--runs 1000`` for the full count)::

    PYTHONPATH=. python -m benchmarks.fidelity.alarm_e2e --runs 200 --bug-runs 40 --seed 1
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from flaudit.auditor.claims import decide_alarm
from flaudit.server.simulated_audit import (
    DPBug,
    FedAvgSimulation,
    simulate_dpfedavg_audit,
    simulation_claims,
)

from ._common import clopper_pearson, look_summaries

#: Small enough to run here: d = 1000, k = 400 orthogonal canaries, 200 clients, cohort 20,
#: T = 10, z = 1, one known round per seen canary (about 1 CPU s per run with the alarm at
#: every look).
BASE = FedAvgSimulation(
    dim=1000,
    num_clients=200,
    clients_per_round=20,
    num_rounds=10,
    num_canaries=400,
    canary_repeats=1,
    noise_multiplier=1.0,
    clip_norm=1.0,
    momentum=0.0,
    client_signal=0.1,
    client_noise=1.0,
    delta=1e-6,
)

ROWS = [
    ("correct, fixed clipping, Poisson", dict()),
    ("correct, adaptive clipping", dict(adaptive_clipping=True)),
    ("correct, server momentum 0.9", dict(momentum=0.9)),
    ("correct, uniform schedule", dict(participation="uniform")),
    ("correct, shuffled schedule", dict(participation="shuffled")),
    ("correct, 4 canary repeats", dict(canary_repeats=4, num_rounds=12)),
    ("bug: noise × 0.5", dict(bug=DPBug.noise_scale, bug_factor=0.5)),
    ("bug: noise × 0.8", dict(bug=DPBug.noise_scale, bug_factor=0.8)),
]


def first_alarm(config: FedAvgSimulation, claims, seed: int) -> tuple[int | None, str | None]:
    """(first look at which the alarm fires, the refuting test's tier) or (None, None)."""
    result = simulate_dpfedavg_audit(config, seed=seed)
    looks = config.num_rounds + 1
    delta = config.delta
    summaries = look_summaries(
        result,
        delta,
        config.num_rounds,
        at_round=lambda t: dict(
            threat_models=(),
            known_rounds_scores=result.known_rounds_history[t - 1],
            known_rounds_participations=result.known_rounds_counts_history[t - 1],
            known_rounds_rounds=result.rounds_at(t),
        ),
        at_end=dict(
            threat_models=("final_model",),
            final_cosines=result.final_cosines,
            known_rounds_scores=result.known_rounds_scores,
            known_rounds_participations=result.known_rounds_counts_history[-1],
            known_rounds_rounds=result.known_rounds_rounds,
        ),
        scale_dof=result.scale_dof,
        canary_repeats=config.canary_repeats,
        claims=claims,
    )
    for look, summary in summaries:
        alarm = decide_alarm(
            summary.claim_tests, look=look, num_looks=looks, claims=claims, delta=delta
        )
        if alarm.status == "error":
            return look, alarm.refuted_by["tier"]
    return None, None


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--bug-runs", type=int, default=None)
    parser.add_argument("--rows", default=None, help="comma-separated row numbers (0-based)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rows = ROWS if args.rows is None else [ROWS[int(i)] for i in args.rows.split(",")]
    print(
        f"# simulator: d={BASE.dim}, k={BASE.num_canaries}, N={BASE.num_clients}, "
        f"m={BASE.clients_per_round}, T={BASE.num_rounds}, z=1, r=1 unless said; alarm alpha = 5%"
    )
    print(
        "| run | runs | alarm fired (any look, any test) | 95% CI | median first look (fired runs) |"
    )
    print("|---|---|---|---|---|")
    start = time.time()
    for name, changes in rows:
        config = BASE.with_(**changes)
        claims = simulation_claims(config.with_(bug=DPBug.none, bug_factor=4.0))  # honest claim
        runs = args.runs if "bug" not in changes else (args.bug_runs or args.runs)
        fired, looks = 0, []
        for rep in range(runs):
            look, _tier = first_alarm(config, claims, seed=args.seed * 1_000_003 + rep)
            if look is not None:
                fired += 1
                looks.append(look)
        lo, hi = clopper_pearson(fired, runs)
        median = f"{np.median(looks):g} of {config.num_rounds + 1}" if looks else "-"
        print(
            f"| {name} | {runs} | {fired / runs:.1%} | {lo:.1%}-{hi:.1%} | {median} |", flush=True
        )
    print(f"# {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
