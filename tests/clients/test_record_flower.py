"""clients/record_flower.py: the plan in a real Flower train Message reaches Opacus's optimizer,
the reply carries the DP parameters, and every case the audit cannot read trains on unchanged
with a refusal in the reply (issue #37)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from opacus import PrivacyEngine
from torch.utils.data import DataLoader, TensorDataset

from flaudit.clients.record_audit import SECURE_AGGREGATION_REFUSAL
from flaudit.clients.record_flower import (
    CONFIG_KEY,
    PLAN_KEY,
    PlanCanaries,
    record_canaries,
    record_config,
    record_metrics,
    record_reply,
)

N, BATCH, DIM_IN = 64, 16, 5
D = DIM_IN * 2 + 2  # Linear(5, 2)


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    """A Message needs Flower's task identity (a SuperNode sets it)."""
    from flwr.supercore.task_identity import TaskIdentity

    for private in ("_task_id", "_run_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, private, getattr(TaskIdentity, private), raising=False)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0


def train_message(plan: np.ndarray | None) -> Message:
    torch.manual_seed(0)
    content = RecordDict({"arrays": ArrayRecord(torch.nn.Linear(DIM_IN, 2).state_dict())})
    if plan is not None:
        content[PLAN_KEY] = ArrayRecord({"plan": Array(plan.astype(np.float32))})
    message = Message(content=content, dst_node_id=0, message_type="train")
    message.metadata._message_id = "delivered"  # as a SuperNode receives it
    return message


def client(optimizer_class=torch.optim.SGD, *, call=True, steps_seen=None):
    """A ClientApp train function shaped like examples/opacus's, with the documented lines."""

    @record_reply
    def train(msg: Message, context: Context) -> Message:
        torch.manual_seed(1)
        model = torch.nn.Linear(DIM_IN, 2)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        data = TensorDataset(torch.randn(N, DIM_IN), torch.randint(0, 2, (N,)))
        optimizer = optimizer_class(model.parameters(), lr=0.1)
        model, optimizer, loader = PrivacyEngine().make_private(
            module=model,
            optimizer=optimizer,
            data_loader=DataLoader(data, batch_size=BATCH),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
        )
        if call:
            optimizer = record_canaries(optimizer, msg)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        if steps_seen is not None:
            steps_seen.append(getattr(optimizer, "canary_step", None))
        return Message(
            content=RecordDict(
                {
                    "arrays": ArrayRecord(model._module.state_dict()),
                    "metrics": MetricRecord({"num-examples": N}),
                }
            ),
            reply_to=msg,
        )

    return train


def context(state: RecordDict | None = None) -> Context:
    return Context(run_id=1, node_id=0, node_config={}, state=state or RecordDict(), run_config={})


def test_plan_reaches_the_optimizer_and_the_reply_carries_the_dp_parameters():
    steps = N // BATCH
    plan = np.zeros((steps, D))
    plan[1, 3] = 1.0
    seen = []
    reply = client(steps_seen=seen)(train_message(plan), context())
    metrics = reply.content["metrics"]
    assert metrics["num-examples"] == N  # the app's own metrics untouched
    assert metrics["flaudit.steps"] == seen[0] == steps
    assert metrics["flaudit.noise_multiplier"] == 1.0 and metrics["flaudit.max_grad_norm"] == 1.0
    assert metrics["flaudit.sample_rate"] == pytest.approx(BATCH / N)
    assert metrics["flaudit.dimension"] == D and metrics["flaudit.lr"] == 0.1
    config = reply.content[CONFIG_KEY]
    assert config["flaudit.optimizer"] == "RecordCanaryDPOptimizer(SGD)"
    assert "flaudit.refusal" not in config


def test_the_canaries_move_the_update():
    """Same seeds, one canary at step 0: the updates differ (by the canary's clipped size)."""
    steps = N // BATCH
    plans = [np.zeros((steps, D)), np.zeros((steps, D))]
    plans[1][0, 0] = 1.0
    finals = []
    for plan in plans:
        reply = client()(train_message(plan), context())
        finals.append(reply.content["arrays"]["weight"].numpy().ravel())
    moved = finals[1] - finals[0]
    assert abs(moved[0]) > 1e-4  # lr * C / B = 0.1 / 16
    assert abs(moved[0]) > 10 * np.abs(moved[1:]).max()


def test_a_first_round_without_a_plan_counts_its_steps():
    reply = client()(train_message(None), context())
    assert reply.content["metrics"]["flaudit.steps"] == N // BATCH


def test_an_unsupported_optimizer_is_refused_and_trains():
    reply = client(torch.optim.Adam)(train_message(np.zeros((4, D))), context())
    config = reply.content[CONFIG_KEY]
    assert "Adam is not supported" in config["flaudit.refusal"]
    assert config["flaudit.optimizer"] == "DPOptimizer(Adam)"
    assert "flaudit.steps" not in reply.content["metrics"]  # not counted: not audited
    assert np.all(np.isfinite(reply.content["arrays"]["weight"].numpy()))


def test_secure_aggregation_is_refused():
    state = RecordDict({"secaggplus_state": ConfigRecord({"current_stage": "setup"})})
    reply = client()(train_message(np.zeros((4, D))), context(state))
    assert reply.content[CONFIG_KEY]["flaudit.refusal"] == SECURE_AGGREGATION_REFUSAL


def test_a_plan_of_the_wrong_dimension_stops_the_canaries_not_training():
    reply = client()(train_message(np.ones((4, D + 1))), context())
    refusal = reply.content[CONFIG_KEY]["flaudit.refusal"]
    assert refusal.startswith("record canaries stopped at step 0") and "d = 13" in refusal
    assert reply.content["metrics"]["flaudit.steps"] == N // BATCH


def test_forgetting_record_canaries_is_said():
    reply = client(call=False)(train_message(None), context())
    assert "was not called" in reply.content[CONFIG_KEY]["flaudit.refusal"]


def test_the_explicit_pieces_never_raise():
    assert record_metrics(object()) == {}
    assert record_config(object())["flaudit.optimizer"] == "object"
    source = PlanCanaries(np.eye(3))
    assert np.array_equal(source.step_canary_sum(1, 3), [0, 1, 0])
    assert np.array_equal(source.step_canary_sum(7, 3), np.zeros(3))
