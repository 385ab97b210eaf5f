"""The round budget (issue #28, "never stall a round"): every wait of one round draws on the
same seconds; past them the wrapper goes on without what it waited for. The real service
frozen with SIGSTOP: tests/service/test_frozen_service.py."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from flaudit.server.budget import DEFAULT_ROUND_BUDGET, RoundBudget
from flaudit.server.reporting import LocalRoundReporter
from flaudit.server.wrapper import CanaryAuditStrategy
from flaudit.service.metrics import BUDGET_OVERRUN_MARK
from tests.flower_rounds import dp_fedavg

BUDGET = 0.4


def test_waits_of_one_round_share_its_budget_and_a_new_round_has_it_again():
    budget = RoundBudget(BUDGET)
    assert DEFAULT_ROUND_BUDGET == 5.0
    with ThreadPoolExecutor(2) as pool:
        release = threading.Event()
        slow = pool.submit(release.wait, 30)
        budget.start(1)
        assert budget.wait(pool.submit(lambda: 7), "fast") == (True, 7)
        began = time.monotonic()
        assert budget.wait(slow, "slow") == (False, None)
        assert budget.wait(slow, "slow again") == (False, None)  # nothing left this round
        took = time.monotonic() - began
        # waited out the budget (a wait ends no sooner than its timeout), then gave up on the
        # slow future rather than waiting for it (30 s: a deadline no loaded machine reaches)
        assert BUDGET * 0.9 <= took < 15
        assert budget.exceeded == {1: ["slow", "slow again"]} and budget.left() == 0
        budget.start(1)  # the same round again: no new budget
        assert budget.left() == 0
        budget.start(2)
        assert budget.left() == BUDGET
        release.set()
        assert budget.wait(slow, "slow") == (True, True)
        with pytest.raises(ZeroDivisionError):  # a finished future's own error
            budget.wait(pool.submit(lambda: 1 / 0), "error")


@pytest.mark.parametrize("seconds", [0, -1, float("nan")])
def test_the_budget_is_validated_naming_the_argument(seconds):
    with pytest.raises(ValueError, match="round_budget_seconds"):
        RoundBudget(seconds)
    dp = dp_fedavg(1.0, 0.5)
    with pytest.raises(ValueError, match="round_budget_seconds"):
        CanaryAuditStrategy(dp, reporter=LocalRoundReporter(), round_budget_seconds=seconds)


class HungService(LocalRoundReporter):
    """A fail-open reporter whose canary fetches and reports hang until ``release``."""

    on_service_error = "continue"

    def __init__(self):
        super().__init__()
        self.release = threading.Event()
        self.given_up: dict[int, str] = {}
        self.reported: list[int] = []

    def declare_claim(self, claim):
        pass

    def report_initial(self, initial_model):
        pass

    def round_canaries(self, server_round):
        self.release.wait(30)
        return np.empty((0, 0), np.float32)

    def without_canaries(self, server_round, reason):
        self.given_up[server_round] = reason

    def report_round(self, server_round, update, metadata):
        self.release.wait(30)
        self.reported.append(server_round)


class Grid3:
    def get_node_ids(self):
        return [1, 2, 3]


@pytest.mark.usefixtures("flower_task_identity")
def test_a_hung_service_costs_each_round_at_most_its_budget():
    reporter = HungService()
    dp = dp_fedavg(1.0, 0.5)
    strategy = CanaryAuditStrategy(dp, reporter=reporter, num_rounds=5, round_budget_seconds=BUDGET)
    model = np.zeros(630, np.float32)
    arrays = ArrayRecord([model[:600].reshape(20, 30), model[600:]])
    try:
        for t in (1, 2, 3):
            began = time.monotonic()
            messages = list(strategy.configure_train(t, arrays, ConfigRecord({}), Grid3()))
            replies = [
                Message(
                    content=RecordDict(
                        {
                            "arrays": ArrayRecord(
                                [model[:600].reshape(20, 30), model[600:] + 1e-3]
                            ),
                            "metrics": MetricRecord({"num-examples": 5}),
                        }
                    ),
                    reply_to=m,
                )
                for m in messages
            ]
            arrays, _ = strategy.aggregate_train(t, replies)
            # the round went on without the hung service (which holds each call 30 s)
            assert time.monotonic() - began < 15, t
            assert len(messages) == 3  # no canary took a slot: none arrived
            assert set(reporter.given_up) == set(range(1, t + 1))  # this round's budget ran out
        assert set(reporter.given_up) == {1, 2, 3}
        assert "within the round budget (0.4 s)" in reporter.given_up[1]
        assert BUDGET_OVERRUN_MARK in reporter.given_up[1]  # the service counts it (GET /metrics)
        assert reporter.reported == []  # still held: nothing waited for them
    finally:
        reporter.release.set()
    strategy.flush()  # then delivered, in order
    assert reporter.reported == [1, 2, 3]
