"""Stop on alarm in CanaryAuditStrategy (the wrapper around a user's Flower strategy): once a
round's report says the claim is refuted (``reporter.stop_reason``, set by HttpRoundReporter from
the service's ingest answer), later rounds send no messages and aggregate nothing, and the model
of the alarm's round is the one reported as final. The claim it declares asks the service to
record the stop (``stop_on_alarm``)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from flaudit.auditor.spec import AuditClaim, AuditSpec
from flaudit.server.reporting import LocalRoundReporter
from flaudit.server.wrapper import CanaryAuditStrategy, LocalCanaries
from tests.flower_rounds import dp_fedavg

SEED, K, S, ROUNDS = 4242, 10, 0.5, 5

pytestmark = pytest.mark.usefixtures("flower_task_identity")


class Grid3:
    def get_node_ids(self):
        return [1, 2, 3]


class AlarmAfter(LocalRoundReporter):
    """A local reporter whose 'service' refutes the claim at round ``fire_at``."""

    fire_at: int = 2
    stop_reason: str | None = None
    claims: list | None = None

    def declare_claim(self, claim):
        self.claims = [*(self.claims or []), claim]

    def report_round(self, server_round, update, metadata):
        super().report_round(server_round, update, metadata)
        if server_round >= self.fire_at:
            self.stop_reason = f"claim refuted at round {self.fire_at}"


def _play(stop_on_alarm: bool):
    reporter = AlarmAfter.for_audit(canary_seed=SEED, num_canaries=K)
    inner = dp_fedavg(0.0, S)
    strategy = CanaryAuditStrategy(
        inner,
        reporter=reporter,
        num_rounds=ROUNDS,
        stop_on_alarm=stop_on_alarm,
        canaries=LocalCanaries(SEED, num_canaries=K, num_rounds=ROUNDS, canary_repeats=1),
    )
    rng = np.random.default_rng(0)
    arrays = ArrayRecord([rng.standard_normal(50).astype(np.float32)])
    sent, models = [], []
    for t in range(1, ROUNDS + 1):
        messages = list(strategy.configure_train(t, arrays, ConfigRecord({}), Grid3()))
        sent.append(len(messages))
        current = arrays.to_numpy_ndarrays()[0]
        replies = []
        for msg in messages:
            u = rng.standard_normal(50).astype(np.float32)
            vec = current + u * (0.1 * S / np.linalg.norm(u))
            replies.append(
                Message(
                    content=RecordDict(
                        {"arrays": ArrayRecord([vec]), "metrics": MetricRecord({"num-examples": 1})}
                    ),
                    reply_to=msg,
                )
            )
        new, _ = strategy.aggregate_train(t, replies)
        strategy.flush()
        if new is not None:
            arrays = new
        models.append(arrays.to_numpy_ndarrays()[0].copy())
    return strategy, reporter, sent, models


def _service_spec(**fields) -> AuditSpec:
    """The service's spec of the runs here (an attached audit of K canaries, 3 clients)."""
    return AuditSpec(
        engine="external",
        num_canaries=K,
        num_clients=3,
        clients_per_round=3,
        max_canary_fraction=0.9,
        **fields,
    )


def test_the_wrapper_stops_training_after_the_alarms_round():
    strategy, reporter, sent, models = _play(stop_on_alarm=True)
    # canaries take cohort slots: messages + displaced nodes = the 3 sampled, until the alarm's
    # round; rounds after it send no messages
    assert [n + strategy.displaced.get(t, 0) for t, n in enumerate(sent[:2], 1)] == [3, 3]
    assert sent[2:] == [0, 0, 0]
    assert strategy.stopped_at_round == 2 and len(reporter.rounds) == 2
    np.testing.assert_array_equal(models[1], models[-1])  # the model stays at round 2's
    np.testing.assert_array_equal(strategy._final, models[1].reshape(-1))
    assert reporter.claims[0]["stop_on_alarm"] is True
    # the declared claim makes the service's spec ask for the stop (and record it)
    claim = AuditClaim.model_validate({k: v for k, v in reporter.claims[0].items()})
    assert claim.apply(_service_spec()).stop_on_alarm is True


def test_without_the_option_the_run_goes_on():
    strategy, reporter, sent, _ = _play(stop_on_alarm=False)
    assert [n + strategy.displaced.get(t, 0) for t, n in enumerate(sent, 1)] == [3] * ROUNDS
    assert strategy.stopped_at_round is None
    assert len(reporter.rounds) == ROUNDS and "stop_on_alarm" not in reporter.claims[0]
    spec = _service_spec(stop_on_alarm=True)
    claim = AuditClaim.model_validate(reporter.claims[0])
    assert claim.apply(spec).stop_on_alarm is True  # a claim without it keeps the spec's
