"""LegacyCanaryAuditStrategy around Flower's legacy FedAvg and DP wrapper (issue #22 item 2), as
``LegacyContext`` + ``DefaultWorkflow`` drive it, with and without SecAgg+'s view of the
replies (every result carries the securely aggregated parameters, each with its own weight):
canaries take cohort slots, enter at the round's largest weight, and give the same model in
both views (FedAvg is linear)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import DifferentialPrivacyClientSideFixedClipping, FedAvg
from flwr.server.strategy import DifferentialPrivacyServerSideFixedClipping as LegacyServerSideDP
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping
from flwr.serverapp.strategy import FedAvg as MessageFedAvg

from flaudit.auditor.canaries import canary_vector, resolve_canary_family
from flaudit.server.reporting import RoundMetadata
from flaudit.server.wrapper import (
    CanaryAuditStrategy,
    LegacyCanaryAuditStrategy,
    LocalCanaries,
    read_claim,
)
from tests.server.test_wrapper import ClaimRecorder

SEED = 4242
K = 12
S = 0.5
N = 4  # clients, all sampled each round
#: The round metadata every engine reports (clip norm, cohort, canaries inserted, failures,
#: clipped fraction, noise std): the legacy and message APIs must report them identically.
REQUIRED_ROUND_FIELDS = tuple(
    f.name for f in dataclasses.fields(RoundMetadata) if f.default is dataclasses.MISSING
)


class Proxy(ClientProxy):
    def get_properties(self, *a, **k):
        raise NotImplementedError

    def get_parameters(self, *a, **k):
        raise NotImplementedError

    def fit(self, *a, **k):
        raise NotImplementedError

    def evaluate(self, *a, **k):
        raise NotImplementedError

    def reconnect(self, *a, **k):
        raise NotImplementedError


def client_manager(n: int = N) -> SimpleClientManager:
    """A legacy client manager holding ``n`` :class:`Proxy` clients."""
    manager = SimpleClientManager()
    for i in range(n):
        manager.register(Proxy(str(i)))
    return manager


def all_sampled(strategy_class=FedAvg, n: int = N, **options):
    """A legacy ``strategy_class`` (FedAvg) that trains all ``n`` clients each round and
    evaluates none; ``options`` go to it."""
    return strategy_class(
        fraction_fit=1.0,
        min_fit_clients=n,
        min_available_clients=n,
        fraction_evaluate=0.0,
        **options,
    )


class Counting(FedAvg):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seen: list[list[int]] = []

    def aggregate_fit(self, server_round, results, failures):
        self.seen.append([res.num_examples for _, res in results])
        return super().aggregate_fit(server_round, results, failures)


def _run(weights, *, secagg, rounds=3):
    manager = client_manager()
    fedavg = all_sampled(
        Counting, initial_parameters=ndarrays_to_parameters([np.zeros((10, 30), np.float32)])
    )
    dp = DifferentialPrivacyClientSideFixedClipping(
        fedavg, noise_multiplier=0.0, clipping_norm=S, num_sampled_clients=N
    )
    reporter = ClaimRecorder.for_audit(canary_seed=SEED, num_canaries=K)
    canaries = LocalCanaries(SEED, num_canaries=K, num_rounds=rounds, clients_per_round=N)
    strategy = LegacyCanaryAuditStrategy(
        dp, num_rounds=rounds, reporter=reporter, canaries=canaries
    )
    parameters = strategy.initialize_parameters(manager)
    rng = np.random.default_rng(0)
    for t in range(1, rounds + 1):
        pairs = strategy.configure_fit(t, parameters, manager)
        c = len(canaries.by_round[t])
        assert len(pairs) == N - c and strategy.displaced[t] == c
        current = parameters_to_ndarrays(parameters)[0]
        updates = [0.01 * rng.standard_normal(current.shape).astype(np.float32) for _ in pairs]
        w = [weights[int(proxy.cid)] for proxy, _ in pairs]
        if secagg:  # what SecAggPlusWorkflow hands aggregate_fit: the weighted average, per result
            mean = current + sum(wi * u for wi, u in zip(w, updates)) / sum(w) if pairs else current
            models = [mean] * len(pairs)
        else:
            models = [current + u for u in updates]
        results = [
            (proxy, FitRes(Status(Code.OK, ""), ndarrays_to_parameters([m]), wi, {}))
            for (proxy, _), m, wi in zip(pairs, models, w)
        ]
        parameters, _ = strategy.aggregate_fit(t, results, [])
        assert len(fedavg.seen[-1]) == N  # exactly num_sampled_clients results
        if c and pairs:
            assert fedavg.seen[-1][-c:] == [max(max(s) for s in fedavg.seen)] * c  # heaviest so far
    return parameters_to_ndarrays(parameters)[0], strategy, reporter


@pytest.mark.parametrize("secagg", [False, True])
def test_legacy_fedavg_with_dp_and_secagg_view_is_audited_like_the_message_api(secagg):
    final, strategy, reporter = _run({i: 5 for i in range(N)}, secagg=secagg)
    assert reporter.claims[0]["noise_multiplier"] == 0.0 and reporter.claims[0]["clip_norm"] == S
    assert reporter.claims[0]["clients_per_round"] == N and reporter.claims[0]["num_rounds"] == 3
    assert [m.num_canaries_inserted for _, m in reporter.rounds] == [
        strategy.displaced[t] for t in (1, 2, 3)
    ]
    assert all(f == pytest.approx(1.0) for f in strategy.weight_factors.values())
    assert reporter.final_model is not None
    # every seen canary's direction is in the final model with S / N per insertion
    dim = final.size
    family = resolve_canary_family(None, num_canaries=K, dim=dim)
    seen = np.concatenate([strategy._canaries.by_round[t] for t in (1, 2, 3)])
    for j in seen:
        c_j = canary_vector(SEED, int(j), dim, family=family).astype(np.float64)
        assert float(final.ravel() @ c_j) == pytest.approx(S / N, abs=0.02)


def test_one_client_weighted_ten_times_is_flagged_as_the_weighting():
    """Under SecAgg+ too: the weights stay visible, so the round records that the heaviest
    client (10x the others) gets more than the C/n the noise is calibrated for."""
    weights = {0: 50, 1: 5, 2: 5, 3: 5}
    _, strategy, reporter = _run(weights, secagg=True, rounds=6)
    fedavg = strategy.strategy.strategy
    heavy = [t for t in range(1, 7) if 50 in fedavg.seen[t - 1][: N - strategy.displaced[t]]]
    assert heavy  # client 0 trained in some round (it is displaced with probability c / N)
    assert max(strategy.weight_factors.values()) > 1.2
    for t in range(1, 7):
        expected = max(fedavg.seen[t - 1]) * N / sum(fedavg.seen[t - 1])
        assert strategy.weight_factors[t] == pytest.approx(expected)
        # above 1 exactly when the round mixes weights (client 0 with a lighter client)
        assert (expected > 1 + 1e-9) == (len(set(fedavg.seen[t - 1])) > 1)
    assert [m.weight_factor for _, m in reporter.rounds] == pytest.approx(
        [strategy.weight_factors[t] for t in range(1, 7)]
    )
    _, equal, _ = _run({i: 5 for i in range(N)}, secagg=True, rounds=6)
    assert all(f == pytest.approx(1.0) for f in equal.weight_factors.values())


def test_the_claim_is_read_from_legacy_dp_wrappers():
    dp = DifferentialPrivacyClientSideFixedClipping(
        FedAvg(min_available_clients=5), 1.2, 3.0, num_sampled_clients=4
    )
    claim = read_claim(dp, num_rounds=3, num_nodes=2)
    assert (
        claim["noise_multiplier"],
        claim["clip_norm"],
        claim["clients_per_round"],
        claim["num_clients"],
    ) == (1.2, 3.0, 4, 5)


class UpdateRecorder(ClaimRecorder):
    """Keeps each round's reported update too."""

    def report_round(self, server_round, update, metadata):
        self.updates = [*getattr(self, "updates", []), np.array(update, dtype=np.float64)]
        super().report_round(server_round, update, metadata)


class NodeGrid:
    def get_node_ids(self):
        return list(range(1, N + 1))


def _same_inputs(rounds):
    """Per round, one update and one weight per reply slot: half the updates above the clip norm
    (the DP wrapper clips them), half below."""
    rng = np.random.default_rng(11)
    updates = {}
    for t in range(1, rounds + 1):
        block = rng.standard_normal((N, 300))
        scale = np.array([2.0, 0.4, 3.0, 0.7]) * S / np.linalg.norm(block, axis=1)
        updates[t] = (block * scale[:, None]).astype(np.float32)
    return updates, [8, 5, 6, 5]


def _loss_mean(fit_metrics):
    total = sum(n for n, _ in fit_metrics)
    return {"train_loss": sum(n * m["train_loss"] for n, m in fit_metrics) / total}


@pytest.mark.usefixtures("flower_task_identity")
def test_legacy_and_message_api_wrappers_report_the_same_numbers_for_the_same_replies():
    """The canary reply arithmetic lives once (server/canary_audit.py): for the same replies,
    the same canaries and the same server-side clipping, both wrappers report the same round
    metadata (clipped fraction included: measured on the real replies in both) and the same
    released update."""
    rounds = 3
    updates, weights = _same_inputs(rounds)
    start = np.zeros((10, 30), np.float32)
    numbers = {}
    for api in ("legacy", "message"):
        reporter = UpdateRecorder.for_audit(canary_seed=SEED, num_canaries=K)
        canaries = LocalCanaries(SEED, num_canaries=K, num_rounds=rounds, clients_per_round=N)
        if api == "legacy":
            manager = client_manager()
            fedavg = all_sampled(
                fit_metrics_aggregation_fn=_loss_mean,
                initial_parameters=ndarrays_to_parameters([start]),
            )
            strategy = LegacyCanaryAuditStrategy(
                LegacyServerSideDP(
                    fedavg, noise_multiplier=0.0, clipping_norm=S, num_sampled_clients=N
                ),
                num_rounds=rounds,
                reporter=reporter,
                canaries=canaries,
            )
            parameters = strategy.initialize_parameters(manager)
            for t in range(1, rounds + 1):
                pairs = strategy.configure_fit(t, parameters, manager)
                current = parameters_to_ndarrays(parameters)[0]
                results = [
                    (
                        proxy,
                        FitRes(
                            Status(Code.OK, ""),
                            ndarrays_to_parameters([current + u.reshape(current.shape)]),
                            w,
                            {"train_loss": 1.0 + i},
                        ),
                    )
                    for i, ((proxy, _), u, w) in enumerate(zip(pairs, updates[t], weights))
                ]
                parameters, _ = strategy.aggregate_fit(t, results, [])
        else:
            inner = DifferentialPrivacyServerSideFixedClipping(
                MessageFedAvg(min_train_nodes=N, min_available_nodes=N, fraction_evaluate=0.0),
                noise_multiplier=0.0,
                clipping_norm=S,
                num_sampled_clients=N,
            )
            strategy = CanaryAuditStrategy(
                inner, reporter=reporter, canaries=canaries, num_rounds=rounds
            )
            arrays = ArrayRecord([start])
            for t in range(1, rounds + 1):
                messages = list(strategy.configure_train(t, arrays, ConfigRecord({}), NodeGrid()))
                current = arrays.to_numpy_ndarrays()[0]
                replies = [
                    Message(
                        content=RecordDict(
                            {
                                "arrays": ArrayRecord([current + u.reshape(current.shape)]),
                                "metrics": MetricRecord({"num-examples": w, "train_loss": 1.0 + i}),
                            }
                        ),
                        reply_to=msg,
                    )
                    for i, (msg, u, w) in enumerate(zip(messages, updates[t], weights))
                ]
                arrays, _ = strategy.aggregate_train(t, replies)
                strategy.flush()
        numbers[api] = reporter
    legacy, message = numbers["legacy"], numbers["message"]
    assert len(legacy.rounds) == len(message.rounds) == rounds
    clipped = []
    for (_, a), (_, b), ua, ub in zip(
        legacy.rounds, message.rounds, legacy.updates, message.updates
    ):
        for name in REQUIRED_ROUND_FIELDS:
            assert getattr(a, name) == getattr(b, name), name
        assert a.weight_factor == pytest.approx(b.weight_factor)
        assert a.train_loss == pytest.approx(b.train_loss)
        assert sorted(a.participants) == sorted(b.participants)
        assert np.allclose(ua, ub, atol=1e-6)
        # the real replies sent: the first N - c slots; updates 0 and 2 exceed the clip norm
        real = a.cohort_size - a.num_canaries_inserted
        clipped.append(a.clipped_fraction)
        expected = sum(1 for i in (0, 2) if i < real) / real if real else 0.0
        assert a.clipped_fraction == pytest.approx(expected)
    assert max(clipped) > 0  # the legacy wrapper no longer reports 0.0 whatever the replies
