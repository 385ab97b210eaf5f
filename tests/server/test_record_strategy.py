"""server/record_strategy.py around Flower's own FedAvg: each node's train message gets its own
plan (none in its first round, none once it refused), FedAvg aggregates the replies as the app
sent them, every update is reported before aggregation, and a failing service stops the audit,
never training (issue #37). The nodes run a real Opacus client (tests/clients/test_record_flower.py)
on the messages an in-process grid delivers; the service is a recording stand-in (the HTTP path
is tests/integration/test_record_opacus_app.py's)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Context, RecordDict
from flwr.serverapp.strategy import FedAvg

from flaudit.clients.record_flower import CONFIG_KEY, PLAN_KEY
from flaudit.server.record_strategy import RecordAuditStrategy, flat_arrays
from tests.clients.test_record_flower import DIM_IN, D, N, client
from tests.clients.test_record_flower import task_identity as task_identity  # noqa: F401

STEPS = 4


class RecordingAudit:
    def __init__(self, *, fail_plans: bool = False) -> None:
        self.plans, self.rounds, self.ended = [], {}, False
        self.fail_plans = fail_plans

    def canary_plan(self, client, round, *, dp, dimension):
        if self.fail_plans:
            raise ConnectionError("the service is away")
        self.plans.append((client, round, dp))
        plan = np.zeros((dp.steps, dimension), dtype=np.float32)
        plan[0, int(client) % dimension] = 1.0
        return plan

    def report_round(self, round, updates, dp):
        self.rounds[round] = (updates, dp)
        return {"status": "running", "alarm": False}

    def end(self):
        self.ended = True
        return {"status": "consistent"}


class InProcessGrid:
    """Node ``i`` runs ``apps[i]`` on the message it is sent, with its own Context."""

    def __init__(self, apps) -> None:
        self.apps = apps
        self.sent = []

    def get_node_ids(self):
        return list(self.apps)

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for message in messages:
            self.sent.append(message)
            message.metadata._message_id = f"m{len(self.sent)}"
            node = message.metadata.dst_node_id
            context = Context(
                run_id=1, node_id=node, node_config={}, state=RecordDict(), run_config={}
            )
            if message.metadata.message_type.startswith("train"):
                replies.append(self.apps[node](message, context))
        return replies


def initial_arrays() -> ArrayRecord:
    torch.manual_seed(0)
    return ArrayRecord(torch.nn.Linear(DIM_IN, 2).state_dict())


def test_plans_go_to_each_node_and_updates_are_reported_before_fedavg():
    audit = RecordingAudit()
    grid = InProcessGrid({1: client(), 2: client(), 3: client(torch.optim.Adam)})
    strategy = RecordAuditStrategy(FedAvg(fraction_evaluate=0.0), audit=audit)
    result = strategy.start(grid, initial_arrays(), num_rounds=3)
    assert audit.ended and strategy.verdict == {"status": "consistent"}
    train = [m for m in grid.sent if m.metadata.message_type.startswith("train")]
    assert len(train) == 9
    planned = {
        (m.metadata.dst_node_id, i // 3 + 1) for i, m in enumerate(train) if PLAN_KEY in m.content
    }
    assert planned == {(1, 2), (2, 2), (1, 3), (2, 3)}  # not round 1, never the refusing node 3
    plan = next(m for m in train if m.metadata.dst_node_id == 2 and PLAN_KEY in m.content)
    assert plan.content[PLAN_KEY]["plan"].numpy()[0, 2] == 1.0  # its own plan, not node 1's
    assert "Adam is not supported" in strategy.refusals["3"]
    assert set(audit.rounds) == {1, 2, 3}
    for updates, dp in audit.rounds.values():
        assert set(updates) == set(dp) == {"1", "2"}
        assert all(u.shape == (D,) for u in updates.values())
        assert dp["1"].steps == STEPS == N // 16 and dp["1"].optimizer.startswith("Record")
    assert strategy.planned[2] == {"1": STEPS, "2": STEPS}
    assert set(result.train_metrics_clientapp) == {1, 2, 3}  # FedAvg aggregated every round
    assert all(
        not key.startswith("flaudit.") for m in result.train_metrics_clientapp.values() for key in m
    )


def test_the_reported_update_is_what_the_node_sent_back_minus_what_it_got():
    audit = RecordingAudit()
    replies = {}

    def remember(msg, context):
        reply = client()(msg, context)
        replies[msg.metadata.dst_node_id] = flat_arrays(reply.content["arrays"])
        assert CONFIG_KEY in reply.content  # what the wrapper takes off before FedAvg
        return reply

    grid = InProcessGrid({1: remember, 2: remember})
    strategy = RecordAuditStrategy(FedAvg(fraction_evaluate=0.0), audit=audit)
    strategy.start(grid, initial_arrays(), num_rounds=1)
    sent = flat_arrays(initial_arrays())
    for node in (1, 2):
        assert np.allclose(audit.rounds[1][0][str(node)], replies[node] - sent)


def test_a_failing_service_stops_the_audit_not_training():
    audit = RecordingAudit(fail_plans=True)
    grid = InProcessGrid({1: client(), 2: client()})
    strategy = RecordAuditStrategy(FedAvg(fraction_evaluate=0.0), audit=audit)
    result = strategy.start(grid, initial_arrays(), num_rounds=3)
    assert "the service is away" in strategy.audit_error
    assert set(result.train_metrics_clientapp) == {1, 2, 3}
    assert list(audit.rounds) == [1] and not audit.ended


def test_from_env_without_an_audit_trains_unaudited(monkeypatch):
    for name in ("FLAUDIT_URL", "FLAUDIT_AUDIT_ID", "FLAUDIT_API_KEY", "FLAUDIT_API_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    inner = FedAvg()
    assert RecordAuditStrategy.from_env(inner, run_config={}) is inner
    with pytest.raises(ValueError, match="must not be in the run config"):
        RecordAuditStrategy.from_env(inner, run_config={"flaudit-api-key": "secret"})
    wrapped = RecordAuditStrategy.from_env(
        inner,
        run_config={"flaudit-ingest-url": "http://127.0.0.1:9", "flaudit-audit-id": "a1"},
    )
    assert wrapped is inner  # no API key: unaudited, not broken
    monkeypatch.setenv("FLAUDIT_API_KEY", "k" * 20)
    wrapped = RecordAuditStrategy.from_env(
        inner,
        run_config={"flaudit-ingest-url": "http://127.0.0.1:9", "flaudit-audit-id": "a1"},
    )
    assert isinstance(wrapped, RecordAuditStrategy) and "k" * 20 not in repr(wrapped.audit)
