"""Weighted FedAvg under CanaryAuditStrategy (issue #22 item 3): error-alarm rate and weight factor.

Flower's ``DifferentialPrivacyServerSideFixedClipping`` (z = 1, C = 1) around Flower's ``FedAvg``
weighted by ``num-examples``, 10 of 20 in-process nodes sampled per round (Flower's own
``Strategy.start`` loop, no Ray), d = 1000; canaries take cohort slots at the round's largest
weight. Rows: all nodes weight 5, and node 11 weight 50 (10x). Columns: runs whose final-look
alarm (the service's own decision code) is "error", the mean and max per-round weight factor
``w_max * replies / sum(w)``.

Rerun: ``PYTHONPATH=$PWD .venv/bin/python benchmarks/weighted_fedavg_alarm.py --seeds 4
--canaries 400 --rounds 100`` (about 3 minutes on 2 shared cores).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--canaries", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()

    from flwr.app import ArrayRecord
    from flwr.common.logger import FLOWER_LOGGER
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping
    from flwr.supercore.task_identity import TaskIdentity

    from flaudit.auditor.canaries import seen_mask
    from flaudit.auditor.claims.curves import audit_claims
    from flaudit.service.live import decide, num_looks, summary_parts
    from flaudit.auditor.spec import AuditClaim, AuditSpec
    from flaudit.server.wrapper import CanaryAuditStrategy, LocalCanaries
    from tests.server.test_wrapper import ClaimRecorder, CountingFedAvg, LoopGrid

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    FLOWER_LOGGER.setLevel(logging.ERROR)
    k, rounds, nodes, n = args.canaries, args.rounds, tuple(range(11, 31)), 10

    def run(weights: dict, seed: int) -> tuple[str, float, float]:
        np.random.seed(seed)  # Flower's DP noise
        fedavg = CountingFedAvg(fraction_train=n / len(nodes), min_train_nodes=n,
                                min_available_nodes=len(nodes), fraction_evaluate=0.0)
        dp = DifferentialPrivacyServerSideFixedClipping(
            fedavg, noise_multiplier=1.0, clipping_norm=1.0, num_sampled_clients=n)
        canary_seed = 1000 + seed
        reporter = ClaimRecorder.for_audit(canary_seed=canary_seed, num_canaries=k)
        canaries = LocalCanaries(canary_seed, num_canaries=k, num_rounds=rounds,
                                 clients_per_round=n)
        strategy = CanaryAuditStrategy(dp, reporter=reporter, canaries=canaries)
        strategy.start(LoopGrid(nodes=nodes, weights=weights, seed=seed),
                       ArrayRecord([np.zeros(1000, np.float32)]), num_rounds=rounds)
        spec = AuditClaim(**reporter.claims[0]).apply(AuditSpec(
            name="weighted", engine="external", num_canaries=k, canary_repeats=1,
            max_canary_fraction=1.0, delta=1e-5))
        tracker = reporter.tracker
        tests = summary_parts(
            seen=seen_mask(canary_seed, k), dim=tracker.dim, delta=spec.delta,
            max_cosines=tracker.max_cosines, final_cosines=tracker.final_cosines,
            threat_models=["final_model", "all_iterates"], final=True,
            known_rounds_scores=reporter.known_rounds.scores,
            known_rounds_rounds=reporter.known_rounds.rounds, scale_dof=tracker.scale_dof,
            claims=audit_claims(spec), num_rounds=rounds)[3]
        factors = list(strategy.weight_factors.values())
        return (decide(spec, tests, look=num_looks(spec)).status, float(np.mean(factors)),
                float(np.max(factors)))

    print(f"k = {args.canaries}, T = {args.rounds}, {n} of {len(nodes)} nodes, z = 1, "
          f"{args.seeds} runs each")
    print("| weights | error alarms | mean weight factor | max weight factor |")
    print("|---|---|---|---|")
    cases = (("all 5", {node: 5 for node in nodes}),
             ("node 11: 50, others 5 (10x)", {11: 50, **{node: 5 for node in nodes[1:]}}))
    for label, weights in cases:
        out = [run(weights, seed) for seed in range(args.seeds)]
        errors = sum(status == "error" for status, _, _ in out)
        print(f"| {label} | {errors}/{len(out)} | {np.mean([o[1] for o in out]):.2f} | "
              f"{max(o[2] for o in out):.2f} |", flush=True)


if __name__ == "__main__":
    main()
