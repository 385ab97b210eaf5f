"""The built-in DP-FedAvg as a strategy inside CanaryAuditStrategy (issue #29: one insertion
path): driven by Flower's own ``Strategy.start``, the canaries enter through the wrapper as the
round's sum, uncapped (no cohort slot taken), and the wrapper reports the strategy's release."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from flaudit.auditor.canaries import Canaries, resolve_canary_family
from flaudit.auditor.schedules import audit_canary_plan
from flaudit.auditor.spec import AuditSpec
from flaudit.server.builtin import BuiltinDPFedAvg
from flaudit.server.local import LocalCanaries
from flaudit.server.reporting import LocalRoundReporter
from flaudit.server.wrapper import CanaryAuditStrategy

pytestmark = pytest.mark.usefixtures("flower_task_identity")  # tests/conftest.py

SEED = 0x5EED
DIM = 400


class RecordingReporter(LocalRoundReporter):
    def report_round(self, server_round, update, metadata):
        super().report_round(server_round, update, metadata)
        self.updates = {**getattr(self, "updates", {}), server_round: np.array(update)}


class ConstantGrid:
    """Every client answers with the same delta, of norm 2 (clipped to S = 0.5)."""

    def __init__(self):
        self.sent = []
        self.delta = np.full(DIM, 2.0 / np.sqrt(DIM), dtype=np.float32)

    def get_node_ids(self):
        return [11, 12]

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        self.sent.extend(messages)
        return [
            Message(
                RecordDict(
                    {
                        "arrays": ArrayRecord([self.delta]),
                        "metrics": MetricRecord({"train-loss": 0.5}),
                    }
                ),
                reply_to=m,
            )
            for m in messages
        ]


def _spec(**overrides):
    # ~10 seen canaries over 3 rounds, twice each, against m = 2: more canaries per round
    # than cohort slots, which only an uncapped insertion can hold
    options = dict(
        task="synthetic",
        task_options={"dim": DIM},
        num_rounds=3,
        num_clients=12,
        clients_per_round=2,
        participation="uniform",
        num_canaries=20,
        noise_multiplier=0.0,
        clip_norm=0.5,
        canary_repeats=2,
    )
    options.update(overrides)
    return AuditSpec(**options)


def test_the_builtin_strategy_takes_the_canary_sum_uncapped_from_the_wrapper():
    spec = _spec()
    canaries = LocalCanaries.for_audit(SEED, spec)
    reporter = RecordingReporter.for_audit(canary_seed=SEED, num_canaries=spec.num_canaries)
    dp = BuiltinDPFedAvg(spec, num_seen_canaries=canaries.num_seen, noise_seed=0)
    strategy = CanaryAuditStrategy(
        dp,
        reporter=reporter,
        canaries=canaries,
        num_rounds=spec.num_rounds,
        round_budget_seconds=None,
    )
    grid = ConstantGrid()
    strategy.start(grid, ArrayRecord([np.zeros(DIM, np.float32)]), spec.num_rounds)

    plan = audit_canary_plan(SEED, spec)
    family = resolve_canary_family(None, num_canaries=spec.num_canaries, dim=DIM)
    vectors = Canaries(SEED, DIM, family=family)
    assert max(plan.seen(t).size for t in (1, 2, 3)) > spec.clients_per_round  # uncapped
    assert strategy.displaced == {}  # no cohort slot taken: every scheduled client was sent
    for t, (round_number, meta) in enumerate(reporter.rounds, start=1):
        assert round_number == t
        sent = [m for m in grid.sent if m.metadata.group_id == str(t)]
        assert len(sent) == dp.schedule.real_clients(t).size
        assert meta.num_canaries_inserted == plan.seen(t).size
        assert meta.cohort_size == len(sent) + plan.seen(t).size
        # the released aggregate: (clients clipped to S + S x the canaries' sum) / m, no noise
        clipped = len(sent) * 0.5 * grid.delta.astype(np.float64) / np.linalg.norm(grid.delta)
        expected = (clipped + 0.5 * vectors.sum_of(plan.seen(t)).astype(np.float64)) / 2
        np.testing.assert_allclose(reporter.updates[t], expected, atol=1e-5)
    assert reporter.final_model is not None


def test_a_strategy_that_takes_the_sum_needs_a_canary_source():
    spec = _spec()
    reporter = LocalRoundReporter.for_audit(canary_seed=SEED, num_canaries=spec.num_canaries)
    dp = BuiltinDPFedAvg(spec, num_seen_canaries=10)
    with pytest.raises(ValueError, match="round_sum"):
        CanaryAuditStrategy(dp, reporter=reporter)
    # a strategy that does not take the sum gets canary replies and declares its claim
    plain = CanaryAuditStrategy(FedAvg(), reporter=reporter, clip_norm=1.0)
    assert not plain._sums_inside
