"""CanaryAuditStrategy around Flower's own DP wrapper + FedAvg (no Ray): canaries are averaged
like clipped clients, every round is reported, the seed stays private."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg

from auditor.canaries import canary_vector, seen_mask
from server.reporting import LocalRoundReporter
from server.wrapper import CanaryAuditStrategy

SEED = 77777
K = 10
S = 0.5


pytestmark = pytest.mark.usefixtures("flower_task_identity")  # tests/server/conftest.py


class Grid3:
    def get_node_ids(self):
        return [1, 2, 3]


def _wrapped(reporter, *, rounds=4, repeats=2):
    inner = DifferentialPrivacyServerSideFixedClipping(
        FedAvg(min_train_nodes=3, min_available_nodes=3, fraction_evaluate=0.0),
        noise_multiplier=0.0, clipping_norm=S, num_sampled_clients=3,
    )
    return CanaryAuditStrategy(inner, reporter=reporter, canary_seed=SEED, num_canaries=K,
                               clip_norm=S, num_rounds=rounds, canary_repeats=repeats)


def test_canaries_enter_the_average_like_clipped_clients_and_rounds_are_reported():
    shapes = [(20, 30), (30,)]
    rng = np.random.default_rng(0)
    model = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    dim = sum(int(np.prod(s)) for s in shapes)
    reporter = LocalRoundReporter.for_audit(canary_seed=SEED, num_canaries=K)
    strategy = _wrapped(reporter)
    assert str(SEED) not in repr(strategy)
    arrays = ArrayRecord(model)
    seen = np.flatnonzero(seen_mask(SEED, K))
    total_inserted = 0
    for t in range(1, 5):
        messages = list(strategy.configure_train(t, arrays, ConfigRecord({}), Grid3()))
        assert len(messages) == 3
        current = np.concatenate([a.ravel() for a in arrays.to_numpy_ndarrays()])
        updates = []
        for _ in messages:  # below the clip norm: they pass unchanged (and are non-zero)
            u = rng.standard_normal(dim).astype(np.float32)
            updates.append(u * (0.1 * S / np.linalg.norm(u)))
        replies = []
        for msg, u in zip(messages, updates):
            vec = current + u
            parts = [vec[:600].reshape(20, 30), vec[600:]]
            content = RecordDict({"arrays": ArrayRecord(parts), "metrics": MetricRecord({"num-examples": 10})})
            replies.append(Message(content=content, reply_to=msg))
        c = strategy.canaries_in_round(t)
        new_arrays, _ = strategy.aggregate_train(t, replies)
        new = np.concatenate([a.ravel() for a in new_arrays.to_numpy_ndarrays()])
        meta = reporter.rounds[-1][1]
        assert meta.num_canaries_inserted == c and meta.cohort_size == 3 + c
        assert meta.clipped_fraction == 0.0 and meta.num_failures == 0
        expected_canaries = sum((S * canary_vector(SEED, j, dim).astype(np.float64)
                                 for j in strategy._by_round.get(t, [])), np.zeros(dim))
        canary_part = (new.astype(np.float64) - current) * (3 + c) - np.sum(updates, axis=0)
        assert np.allclose(canary_part, expected_canaries, atol=2e-5)
        assert set(strategy._by_round.get(t, [])) <= set(seen.tolist())
        total_inserted += c
        arrays = new_arrays
    assert total_inserted == 2 * seen.size
    assert reporter.final_model is not None  # reported after round 4
    final = reporter.tracker.final_cosines
    mask = seen_mask(SEED, K)
    assert final[mask].min() > np.abs(final[~mask]).max()


def test_unequal_client_weights_are_refused():
    """DP-FedAvg needs uniform weights; example-count weighting would also make canaries weigh
    differently from the clients they stand beside."""
    reporter = LocalRoundReporter.for_audit(canary_seed=SEED, num_canaries=K)
    strategy = _wrapped(reporter)
    arrays = ArrayRecord([np.zeros(4, np.float32)])
    messages = list(strategy.configure_train(1, arrays, ConfigRecord({}), Grid3()))
    replies = [
        Message(content=RecordDict({"arrays": ArrayRecord([np.full(4, 0.01 * (i + 1), np.float32)]),
                                    "metrics": MetricRecord({"num-examples": n})}), reply_to=msg)
        for i, (msg, n) in enumerate(zip(messages, [10, 10, 30]))
    ]
    with pytest.raises(ValueError, match="num-examples.*uniform weights"):
        strategy.aggregate_train(1, replies)
    assert reporter.rounds == []  # nothing reported for the refused round


def test_bad_arguments_are_named():
    reporter = LocalRoundReporter.for_audit(canary_seed=SEED, num_canaries=K)
    inner = FedAvg()
    with pytest.raises(ValueError, match="clip_norm"):
        CanaryAuditStrategy(inner, reporter=reporter, canary_seed=SEED, num_canaries=K, clip_norm=0, num_rounds=2)
    with pytest.raises(ValueError, match="canary_repeats"):
        CanaryAuditStrategy(inner, reporter=reporter, canary_seed=SEED, num_canaries=K, clip_norm=1,
                            num_rounds=2, canary_repeats=4)
    with pytest.raises(ValueError, match="strategy"):
        CanaryAuditStrategy(object(), reporter=reporter, canary_seed=SEED, num_canaries=K, clip_norm=1, num_rounds=2)
