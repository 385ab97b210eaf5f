"""Deliberate DP bugs through the real ServerApp loop: does the alarm fire, and how often does a
correct run of the same spec raise it?

Each run is the ServerApp main loop (``flaudit.server.app.run_audit``: schedule, real ClientApp
training of the built-in task, canary insertion, DP-FedAvg aggregation with the injected bug,
reporting of the released update and participants) against
``flaudit.server.simulation.InProcessGrid`` -- the same loop and client code as ``flaudit run``,
without Ray's processes (which change no number) -- evaluated exactly as ``flaudit run`` does
(``flaudit.commands.run.AlarmWatch``: the alarm at every per-round look and at the
final look, then the verdict). The claim is always the honest spec's.

Rerun (the README's bug demo, 20 runs per row):
    .venv/bin/python benchmarks/real_path_bugs.py --spec examples/audit.toml --runs 20 \\
        --bugs none,noise_scale=0.5
A k = 1000 spec against noise x 0.8:
    .venv/bin/python benchmarks/real_path_bugs.py --spec examples/audit.toml --k 1000 \\
        --clients 600 --runs 10 --bugs none,noise_scale=0.8
Prints, per bug: runs whose verdict is "claim refuted", the median round where the alarm first
fired, and the verdicts' counts.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from pathlib import Path

from flaudit.auditor.bugs import InjectedBug
from flaudit.auditor.canaries import seen_mask
from flaudit.auditor.spec import AuditSpec
from flaudit.commands.run import AlarmWatch, load_spec
from flaudit.server.reporting import LocalRoundReporter
from flaudit.server.simulation import run_inprocess_audit


def one_run(spec: AuditSpec, seed: int):
    """One audited run; returns its verdict."""
    canary_seed = (2**100 + 7919 * seed) | 1
    reporter = AlarmWatch(
        spec,
        LocalRoundReporter.for_audit(
            canary_seed=canary_seed,
            num_canaries=spec.num_canaries,
            canary_family=spec.canary_family,
        ),
        seen=seen_mask(canary_seed, spec.num_canaries),
    )
    run_inprocess_audit(spec, canary_seed=canary_seed, reporter=reporter, noise_seed=seed)
    return reporter.evaluate()[-1]


def main() -> None:
    import logging

    logging.getLogger("flaudit").setLevel(logging.ERROR)  # the per-run "bug injected" warning
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--spec",
        type=Path,
        default=Path("examples/audit.toml"),
        help="audit TOML (flaudit run) or JSON (POST /audits body)",
    )
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument(
        "--bugs",
        default="none,noise_scale=0.5",
        help="comma-separated --inject-bug values; 'none' is the correct run",
    )
    parser.add_argument("--k", type=int, default=None, help="override num_canaries")
    parser.add_argument("--clients", type=int, default=None, help="override num_clients")
    parser.add_argument("--rounds", type=int, default=None, help="override num_rounds")
    parser.add_argument("--first-seed", type=int, default=0)
    args = parser.parse_args()
    if args.spec.suffix == ".json":  # a POST /audits body, e.g. examples/quick-audit.json
        base = AuditSpec.model_validate_json(args.spec.read_text()).model_dump()
    else:
        base = load_spec(args.spec).model_dump()
    for key, value in (
        ("num_canaries", args.k),
        ("num_clients", args.clients),
        ("num_rounds", args.rounds),
    ):
        if value is not None:
            base[key] = value
    spec0 = AuditSpec.model_validate(base)
    from flaudit.auditor.claims import audit_design

    print(
        f"{args.spec}: task {spec0.task}, d={spec0.task_options.get('dim', '?')}, "
        f"T={spec0.num_rounds}, k={spec0.num_canaries}, z={spec0.noise_multiplier:g}, "
        f"r={spec0.canary_repeats}, {spec0.participation.value}; {args.runs} runs per row "
        "(ServerApp loop on InProcessGrid, flaudit run's evaluation)"
    )
    print(f"design: {audit_design(spec0).summary}")
    print(f"{'bug':<24} {'refuted':>9} {'median first round':>19} {'verdicts':<40} {'s/run':>6}")
    for bug in args.bugs.split(","):
        bug = bug.strip()
        spec = AuditSpec.model_validate(
            {**base, "inject_bug": None if bug == "none" else InjectedBug.parse(bug)}
        )
        started = time.monotonic()
        verdicts = [
            one_run(spec, seed) for seed in range(args.first_seed, args.first_seed + args.runs)
        ]
        seconds = (time.monotonic() - started) / args.runs
        refuted = [v for v in verdicts if v.status.value == "claim_refuted"]
        rounds = [v.round if v.round is not None else spec.num_rounds + 1 for v in refuted]
        median = f"{statistics.median(rounds):g}" if rounds else "-"
        counts = collections.Counter(v.status.value for v in verdicts)
        label = "none (correct)" if bug == "none" else bug
        print(
            f"{label:<24} {len(refuted):>4}/{args.runs:<4} {median:>19} "
            f"{dict(counts)!s:<40} {seconds:>6.1f}",
            flush=True,
        )
        fired = collections.Counter((v.refuted_by or {}).get("test") for v in refuted)
        if fired:
            print(f"{'':<24} refuting tests: {dict(fired)}", flush=True)
    print(f"(first round {spec0.num_rounds + 1} = the final look, after training)")


if __name__ == "__main__":
    main()
