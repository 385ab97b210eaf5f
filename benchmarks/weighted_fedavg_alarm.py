"""Weighted FedAvg under CanaryAuditStrategy (issue #28 item 1): which cause the verdict names.

Flower's ``DifferentialPrivacyServerSideFixedClipping`` (z = 1, C = 1) around Flower's
``FedAvg`` weighted by ``num-examples``, 10 of 20 in-process nodes sampled per round (Flower's
own ``Strategy.start`` loop, no Ray), d = 1000; canaries from the real service app (in process,
SQLite) through the real ``HttpRoundReporter``, at the running largest weight. The service runs
its claim tests after every round and at the end, at the heaviest influence the canaries
carried; the verdict is the one ``GET /audits/{id}`` returns.

Rows: weights (all 5; node 11 weighs 8, i.e. up to 1.6x C/n; node 11 weighs 50, up to 10x) x
noise (as claimed; x 0.5, a planted bug behind the claim's back). Columns: how many runs ended
with each verdict status and cause, and the largest weight factor.

Rerun: ``PYTHONPATH=$PWD .venv/bin/python benchmarks/weighted_fedavg_alarm.py --seeds 5``
(6.2 minutes on 2 shared cores, 2026-11-27).
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--canaries", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()

    from flwr.app import ArrayRecord
    from flwr.common.logger import FLOWER_LOGGER
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping
    from flwr.supercore.task_identity import TaskIdentity

    from benchmarks._service import in_process_reporter
    from flaudit.server.wrapper import CanaryAuditStrategy
    from flaudit.service.store import Store
    from tests.integration.flower_weighted.pytorch_example.planted_bug import (
        ShortNoise as HalfNoise,  # the worked example's: half the noise
    )
    from tests.server.test_wrapper import CountingFedAvg, LoopGrid
    from tests.service.conftest import AUTH, CIPHER, make_client

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    FLOWER_LOGGER.setLevel(logging.ERROR)
    logging.getLogger("flaudit").setLevel(logging.ERROR)
    k, rounds, nodes, n = args.canaries, args.rounds, tuple(range(11, 31)), 10
    spec = {
        "name": "weighted",
        "engine": "external",
        "num_canaries": k,
        "max_canary_fraction": 1.0,
        "delta": 1e-5,
    }

    def run(client, dp_class, weights: dict, seed: int) -> tuple[str, str | None, float]:
        body = client.post("/audits", json=spec, headers=AUTH).json()
        env = body["environment"]
        reporter = in_process_reporter(client, env)
        np.random.seed(seed)  # Flower's DP noise
        fedavg = CountingFedAvg(
            fraction_train=n / len(nodes),
            min_train_nodes=n,
            min_available_nodes=len(nodes),
            fraction_evaluate=0.0,
        )
        dp = dp_class(fedavg, noise_multiplier=1.0, clipping_norm=1.0, num_sampled_clients=n)
        strategy = CanaryAuditStrategy(dp, reporter=reporter, num_rounds=rounds)
        # reproducible: Flower samples nodes with Python's random, the wrapper picks the nodes the
        # canaries displace with its own generator
        random.seed(seed)
        strategy.audit._slot_rng = np.random.default_rng(seed)
        strategy.start(
            LoopGrid(nodes=nodes, weights=weights, seed=seed),
            ArrayRecord([np.zeros(1000, np.float32)]),
            num_rounds=rounds,
        )
        reporter.close()
        audit = client.get(f"/audits/{env['FLAUDIT_AUDIT_ID']}").json()
        verdict = audit["verdict"]
        return verdict["status"], verdict.get("cause"), float(audit["max_weight_factor"] or 1)

    print(
        f"k = {k}, T = {rounds}, {n} of {len(nodes)} nodes, z = 1, d = 1000, {args.seeds} runs each"
    )
    print("| weights | noise | verdicts (status / cause) | max weight factor |")
    print("|---|---|---|---|")
    cases = (
        ("all 5 (1x)", {node: 5 for node in nodes}),
        ("node 11: 8, others 5 (1.6x)", {11: 8, **{node: 5 for node in nodes[1:]}}),
        ("node 11: 50, others 5 (10x)", {11: 50, **{node: 5 for node in nodes[1:]}}),
    )
    noises = (
        ("as claimed", DifferentialPrivacyServerSideFixedClipping),
        ("x 0.5 (bug)", HalfNoise),
    )
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{tmp}/bench.db", cipher=CIPHER)
        with make_client(store) as client:
            for label, weights in cases:
                for noise, dp_class in noises:
                    out = [run(client, dp_class, weights, seed) for seed in range(args.seeds)]
                    counts = Counter(f"{s} / {c or '-'}" for s, c, _ in out)
                    shown = ", ".join(f"{v}× {key}" for key, v in sorted(counts.items()))
                    print(
                        f"| {label} | {noise} | {shown} | {max(o[2] for o in out):.2f} |",
                        flush=True,
                    )
        store.dispose()


if __name__ == "__main__":
    main()
