"""Replay the built-in ServerApp with fixed seeds and compare two code versions bit for bit.

A refactoring of the built-in path (issue #29: the ServerApp became ``BuiltinDPFedAvg`` inside
``CanaryAuditStrategy``) must not change a number. This records, for five specs (fixed and
adaptive clipping, server momentum, three participation schemes, three injected bugs), every
value a run reports -- theta_0, each round's released vector and metadata (participants
included), theta_T and the run's result -- through
:func:`flaudit.server.simulation.run_inprocess_audit` with fixed canary and noise seeds, and
compares two recordings. It uses only names both versions have, so it runs against an older
checkout::

    git worktree add /tmp/before d720cce
    PYTHONPATH=/tmp/before .venv/bin/python benchmarks/replay_builtin.py record /tmp/before.pkl
    .venv/bin/python benchmarks/replay_builtin.py record /tmp/after.pkl
    .venv/bin/python benchmarks/replay_builtin.py compare /tmp/before.pkl /tmp/after.pkl
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import pickle
import sys

import numpy as np

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

BASE = dict(
    task="synthetic",
    task_options={"dim": 3000, "test_size": 100},
    num_rounds=5,
    num_clients=30,
    clients_per_round=5,
    participation="uniform",
    num_canaries=20,
    noise_multiplier=0.7,
    clip_norm=0.3,
    canary_repeats=2,
    data_seed=4,
)
CASES = {
    "fixed clipping": {},
    "adaptive clipping, momentum 0.9, poisson": {
        "adaptive_clipping": {"initial_clip_norm": 0.2},
        "clip_norm": None,
        "server_momentum": 0.9,
        "participation": "poisson",
    },
    "bug no_clipping x 3": {"inject_bug": {"kind": "no_clipping", "factor": 3}},
    "bug extra_participation x 2": {"inject_bug": {"kind": "extra_participation", "factor": 2}},
    "bug noise_divided_twice, shuffled": {
        "inject_bug": {"kind": "noise_divided_twice"},
        "participation": "shuffled",
    },
}
CANARY_SEED = 0xABCDEF12345
NOISE_SEED = 11


def record(path: str) -> None:
    from flaudit.auditor.spec import AuditSpec
    from flaudit.server.reporting import LocalRoundReporter
    from flaudit.server.simulation import run_inprocess_audit

    class Recorder(LocalRoundReporter):
        def report_round(self, server_round, update, metadata):
            super().report_round(server_round, update, metadata)
            self.log = getattr(self, "log", []) + [
                (server_round, np.array(update), dataclasses.asdict(metadata))
            ]

    logging.disable(logging.WARNING)  # the "bug injected" lines
    out = {}
    for name, overrides in CASES.items():
        spec = AuditSpec(**{**BASE, **overrides})
        reporter = Recorder.for_audit(canary_seed=CANARY_SEED, num_canaries=spec.num_canaries)
        result = run_inprocess_audit(
            spec, canary_seed=CANARY_SEED, reporter=reporter, noise_seed=NOISE_SEED
        )
        result = {k: v for k, v in result.items() if k != "seconds"}
        result["rounds"] = [
            {k: v for k, v in r.items() if k != "audit_wait_seconds"} for r in result["rounds"]
        ]
        out[name] = {
            "initial": reporter.initial_model,
            "rounds": reporter.log,
            "final": reporter.final_model,
            "result": result,
        }
    with open(path, "wb") as f:
        pickle.dump(out, f)
    print(f"recorded {len(out)} runs in {path} ({__import__('flaudit').__file__})")


def compare(before: str, after: str) -> int:
    with open(before, "rb") as f:
        old = pickle.load(f)
    with open(after, "rb") as f:
        new = pickle.load(f)
    differ = 0
    for name in CASES:
        o, n = old[name], new[name]
        rounds = len(o["rounds"]) == len(n["rounds"]) and all(
            to == tn and np.array_equal(uo, un) and mo == mn
            for (to, uo, mo), (tn, un, mn) in zip(o["rounds"], n["rounds"])
        )
        same = {
            "theta_0": np.array_equal(o["initial"], n["initial"]),
            "rounds": rounds,
            "theta_T": np.array_equal(o["final"], n["final"]),
            "result": o["result"] == n["result"],
        }
        differ += not all(same.values())
        print(
            f"{name:40s} {len(n['rounds'])} rounds: "
            + ", ".join(f"{k} {'identical' if v else 'DIFFERENT'}" for k, v in same.items())
        )
    print("every recorded value is bit-identical" if not differ else f"{differ} runs differ")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("record").add_argument("path")
    cmp = sub.add_parser("compare")
    cmp.add_argument("before")
    cmp.add_argument("after")
    args = parser.parse_args()
    if args.command == "record":
        record(args.path)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
