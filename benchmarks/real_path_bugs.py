"""Deliberate DP bugs through the real ServerApp loop: does the alarm fire?

Each run is the ServerApp main loop (``flaudit.server.app.run_audit``: schedule, real ClientApp training
of the synthetic task, canary insertion, DP-FedAvg aggregation with the injected bug, reporting
of the released update and participants) against ``flaudit.server.simulation.InProcessGrid`` (no Ray),
then ``flaudit run``'s evaluation: ``summarize`` with the known-rounds scores and the audit's
claims, and the alarm (``flaudit.auditor.estimators.alarm.decide_alarm``) at the final look of
``num_rounds + 1``. The claim is always the honest spec's (z = 1, r = 1: mu = 1).

Rerun: .venv/bin/python benchmarks/real_path_bugs.py [--runs 5] [--k 400] [--dim 8000]
Prints, per bug, how many runs raised the error alarm (and any alarm), and the median
known-rounds claim-test p-value.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from flaudit.auditor.canaries import seen_mask
from flaudit.auditor.estimators import summarize
from flaudit.auditor.estimators.gdp import audit_claims
from flaudit.auditor.claims.alerts import decide, num_looks
from flaudit.auditor.spec import AuditSpec
from flaudit.server.reporting import LocalRoundReporter
from flaudit.server.simulation import run_inprocess_audit

BUGS = [None, "no_noise", "noise_scale=0.5", "no_clipping=4", "extra_participation=4"]


def one_run(base: dict, bug: str | None, seed: int) -> tuple[str, float]:
    from flaudit.auditor.bugs import InjectedBug

    spec = AuditSpec.model_validate(
        {**base, "inject_bug": InjectedBug.parse(bug) if bug else None}
    )
    canary_seed = (2**100 + 7919 * seed) | 1
    reporter = LocalRoundReporter.for_audit(canary_seed=canary_seed, num_canaries=spec.num_canaries)
    run_inprocess_audit(spec, canary_seed=canary_seed, reporter=reporter, noise_seed=seed)
    tracker = reporter.tracker
    summary = summarize(
        seen=seen_mask(canary_seed, spec.num_canaries), dim=tracker.dim, delta=spec.delta,
        max_cosines=tracker.max_cosines, final_cosines=tracker.final_cosines,
        known_rounds_scores=reporter.known_rounds.scores, claims=audit_claims(spec),
    )
    alarm = decide(spec, summary.claim_tests, look=num_looks(spec))
    known = [t.p_value for t in summary.claim_tests if t.threat_model == "known_rounds"]
    return alarm.status, known[0] if known else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--k", type=int, default=400)
    parser.add_argument("--dim", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    base = dict(
        name="bugs", task="synthetic", num_rounds=args.rounds, num_clients=max(60, args.k // 2 + 50),
        clients_per_round=6, participation="uniform", num_canaries=args.k, canary_repeats=1,
        noise_multiplier=1.0, clip_norm=1.0, delta=1e-5, data_seed=1,
        task_options={"dim": args.dim, "test_size": 100},
    )
    print(f"ServerApp loop (InProcessGrid), synthetic d={args.dim}, k={args.k}, T={args.rounds}, "
          f"z=1, r=1 (claim mu=1), uniform participation, {args.runs} runs per row; alarm at the "
          f"final look of {args.rounds + 1} (level 0.025 over the tests of that look)")
    print(f"{'bug':<24} {'error':>7} {'any alarm':>10} {'median p (known rounds)':>24} {'s/run':>6}")
    for bug in BUGS:
        started = time.monotonic()
        results = [one_run(base, bug, seed) for seed in range(args.runs)]
        seconds = (time.monotonic() - started) / args.runs
        errors = sum(status == "error" for status, _ in results)
        alarms = sum(status in ("error", "warning") for status, _ in results)
        median_p = float(np.median([p for _, p in results]))
        print(f"{bug or 'none (correct)':<24} {errors:>3}/{args.runs:<3} {alarms:>6}/{args.runs:<3} "
              f"{median_p:>24.3g} {seconds:>6.1f}")


if __name__ == "__main__":
    main()
