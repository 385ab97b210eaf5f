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

``--ramp N`` (issue #38): a late-heavy weighting instead, N runs per row. Every node weighs 5
until round 17 of T = 20; from round 17 on one reply a round weighs 15 (about 2x C/n with the
canaries at that weight). Before, every round was retested at the running maximum weight and a
x 0.5 bug was named in 70.0% of 150 runs here (87.5% in the issue's simulation); now each round
is tested at its own weight: 150 of 150, correct noise alarming in 5 of 150 (docs/fidelity.md
section 10, 2026-12-06). k is the smallest canary count whose design (the one ``POST /audits`` answers)
catches noise x 0.5. Columns: the share of runs whose alarm blamed the noise (``cause`` noise
or noise_and_weighting) with its 95% Clopper-Pearson interval, and the other verdicts.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/weighted_fedavg_alarm.py --ramp 200

(``--noise claimed|half`` runs one row, e.g. the two rows in two processes.)
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


def _setup():
    """Flower's task identity for an in-process ServerApp and quiet loggers."""
    from flwr.common.logger import FLOWER_LOGGER
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    FLOWER_LOGGER.setLevel(logging.ERROR)
    logging.getLogger("flaudit").setLevel(logging.ERROR)


def _run(client, spec: dict, dp_class, grid, *, rounds: int, n: int, seed: int):
    """One audited run: Flower's DP wrapper ``dp_class`` (z = 1, C = 1) around a FedAvg
    weighted by num-examples, ``n`` of ``grid``'s nodes a round, inside CanaryAuditStrategy
    reporting to the in-process service. Returns the verdict's status and cause and the
    audit's largest weight factor."""
    from flwr.app import ArrayRecord

    from benchmarks._service import in_process_reporter
    from flaudit.server.wrapper import CanaryAuditStrategy
    from tests.server.test_wrapper import CountingFedAvg
    from tests.service.conftest import AUTH

    body = client.post("/audits", json=spec, headers=AUTH).json()
    env = body["environment"]
    reporter = in_process_reporter(client, env)
    np.random.seed(seed)  # Flower's DP noise
    nodes = grid.get_node_ids()
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
    strategy.start(grid, ArrayRecord([np.zeros(1000, np.float32)]), num_rounds=rounds)
    reporter.close()
    audit = client.get(f"/audits/{env['FLAUDIT_AUDIT_ID']}").json()
    verdict = audit["verdict"]
    return verdict["status"], verdict.get("cause"), float(audit["max_weight_factor"] or 1)


def _verdicts(out) -> str:
    counts = Counter(f"{s} / {c or '-'}" for s, c, _ in out)
    return ", ".join(f"{v}× {key}" for key, v in sorted(counts.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--canaries", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument(
        "--ramp", type=int, default=0, help="runs per row of the late-heavy ramp (0: the table)"
    )
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument(
        "--noise", choices=("claimed", "half"), help="--ramp: only this row (both by default)"
    )
    args = parser.parse_args()
    if args.ramp:
        ramp(args.ramp, args.first_seed, only=args.noise)
        return

    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping

    from flaudit.service.store import Store
    from tests.integration.flower_weighted.pytorch_example.planted_bug import (
        ShortNoise as HalfNoise,  # the worked example's: half the noise
    )
    from tests.server.test_wrapper import LoopGrid
    from tests.service.conftest import CIPHER, make_client

    _setup()
    k, rounds, nodes, n = args.canaries, args.rounds, tuple(range(11, 31)), 10
    spec = {
        "name": "weighted",
        "engine": "external",
        "num_canaries": k,
        "max_canary_fraction": 1.0,
        "delta": 1e-5,
    }
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
                    out = [
                        _run(
                            client,
                            spec,
                            dp_class,
                            LoopGrid(nodes=nodes, weights=weights, seed=seed),
                            rounds=rounds,
                            n=n,
                            seed=seed,
                        )
                        for seed in range(args.seeds)
                    ]
                    print(
                        f"| {label} | {noise} | {_verdicts(out)} | {max(o[2] for o in out):.2f} |",
                        flush=True,
                    )
        store.dispose()


def ramp(reps: int, first_seed: int = 0, only: str | None = None) -> None:
    """The late-heavy weighting (module docstring), through the same path as the table."""
    import time

    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping

    from benchmarks.fidelity._common import clopper_pearson
    from flaudit.service.store import Store
    from tests.integration.flower_weighted.pytorch_example.planted_bug import (
        ShortNoise as HalfNoise,  # the worked example's: half the noise
    )
    from tests.server.test_wrapper import LoopGrid
    from tests.service.conftest import AUTH, CIPHER, make_client

    class RampGrid(LoopGrid):
        """Every reply weighs 5 until round ``late``; from then on the first reply of each
        round weighs ``heavy`` (the heaviest client appears late)."""

        late, heavy = 17, 15

        def send_and_receive(self, messages, timeout=None):
            messages = list(messages)
            train = [m for m in messages if m.metadata.message_type == "train"]
            round_now = sum(1 for n in self.sent if n) + 1 if train else 0
            self.weights = {}
            if train and round_now >= self.late:
                self.weights = {train[0].metadata.dst_node_id: self.heavy}
            return super().send_and_receive(messages, timeout)

    _setup()
    rounds, nodes, n = 20, tuple(range(11, 31)), 10

    def spec(k: int) -> dict:
        return {
            "name": "ramp",
            "engine": "external",
            "num_canaries": k,
            "num_rounds": rounds,
            "max_canary_fraction": 1.0,
            "delta": 1e-5,
        }

    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{tmp}/bench.db", cipher=CIPHER)
        with make_client(store) as client:
            k, design = None, None
            for candidate in range(10, 400):
                answer = client.post("/audits", json=spec(candidate), headers=AUTH).json()
                design = answer["design"]
                if (design.get("detectable_noise_scale") or 0) >= 0.5:
                    k = candidate
                    break
            print(
                f"late-heavy ramp: T = {rounds}, {n} of {len(nodes)} nodes, z = 1, d = 1000, "
                f"weight 5, one reply of 15 a round from round {RampGrid.late}; k = {k}: "
                f"{design.get('summary')}; {reps} runs a row (seeds {first_seed}-"
                f"{first_seed + reps - 1})"
            )
            print("| noise | alarm blamed the noise | verdicts (status / cause) | weight factor |")
            print("|---|---|---|---|")
            for key, noise, dp_class in (
                ("claimed", "as claimed", DifferentialPrivacyServerSideFixedClipping),
                ("half", "x 0.5 (bug)", HalfNoise),
            ):
                if only not in (None, key):
                    continue
                start = time.perf_counter()
                out = [
                    _run(
                        client,
                        spec(k),
                        dp_class,
                        RampGrid(nodes=nodes, seed=first_seed + i),
                        rounds=rounds,
                        n=n,
                        seed=first_seed + i,
                    )
                    for i in range(reps)
                ]
                named = sum(c in ("noise", "noise_and_weighting") for _, c, _ in out)
                lo, hi = clopper_pearson(named, reps)
                factors = [o[2] for o in out]
                print(
                    f"| {noise} | {named}/{reps} = {named / reps:.1%} [{lo:.1%}, {hi:.1%}] | "
                    f"{_verdicts(out)} | {min(factors):.2f}-{max(factors):.2f} |",
                    flush=True,
                )
                print(f"  ({time.perf_counter() - start:.0f} s)", flush=True)
        store.dispose()


if __name__ == "__main__":
    main()
