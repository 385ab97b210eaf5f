"""Never stall a round (issue #28, item 4): with the real service frozen (SIGSTOP: its port
still accepts connections, nothing answers), a CanaryAuditStrategy around Flower's DP wrapper
keeps its pace: the time the wrapper adds to each round (configure_train + aggregate_train,
all its waits together) stays within its round budget plus a margin computed from the budget;
rounds whose canaries did not arrive train without them (stated gaps), and once the service
is thawed every round and the final model are delivered and the audit ends succeeded.

The measured effect (budget off vs on) is benchmarks/frozen_service.py (docs/flower.md)."""

from __future__ import annotations

import os
import signal
import time

import httpx
import numpy as np
import pytest
from flwr.app import ConfigRecord

from tests.flower_rounds import (
    DIM,
    Grid3,
    attached_strategy,
    initial_arrays,
    small_steps,
)
from tests.processes import wait_for

from .service_process import ServiceProcess

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("flower_task_identity")]

KEY = "frozen-service-key-" + "k" * 12
AUTH = {"Authorization": f"Bearer {KEY}"}
BUDGET = 1.0  # seconds per round the audit may add (the default is 5 s)
MARGIN = 1.0 * BUDGET  # the wrapper's own work on a 630-value model is milliseconds
ROUNDS = 10
FROZEN = range(3, 9)  # rounds trained while the service is stopped


def _rounds(strategy, on_round, rounds: int = ROUNDS) -> list[float]:
    """Drive Flower's round loop by hand (the clients answer at once); the seconds the wrapper
    took in each round (configure_train + aggregate_train)."""
    rng = np.random.default_rng(0)
    arrays = initial_arrays(rng)
    # what start() does before round 1: the claim and theta_0 (outside the round budget)
    strategy.declare(Grid3(), rounds)
    strategy._report_initial(arrays)
    spent = []
    for t in range(1, rounds + 1):
        on_round(t)
        began = time.monotonic()
        messages = list(strategy.configure_train(t, arrays, ConfigRecord({}), Grid3()))
        took = time.monotonic() - began
        replies = small_steps(messages, arrays, rng)
        began = time.monotonic()
        if t == rounds:  # the last round also sends the final model: not a round's pace
            strategy.flush()
            began = time.monotonic()
            strategy.num_rounds = rounds + 1  # measure the round alone, then finish below
            arrays, _ = strategy.aggregate_train(t, replies)
            spent.append(took + time.monotonic() - began)
            return spent
        arrays, _ = strategy.aggregate_train(t, replies)
        spent.append(took + time.monotonic() - began)
    return spent


def _audit(http, service, num_canaries=16, **options):
    return attached_strategy(
        http, service.url, AUTH, num_canaries=num_canaries, fetch_timeout=BUDGET, **options
    )


def _warm_up(http, service) -> None:
    """A first audit of two rounds, waited for: the service's first ingest loads the
    estimators (seconds on a busy machine), which is not what this test measures."""
    audit_id, reporter, strategy = _audit(
        http, service, num_canaries=4, num_rounds=2, round_budget_seconds=None
    )
    _rounds(strategy, lambda t: None, rounds=2)
    strategy.flush()
    reporter.report_final(np.zeros(DIM, np.float32), {})
    reporter.close()
    assert http.get(f"/audits/{audit_id}").json()["status"] == "succeeded"


@pytest.mark.timeout(240)
def test_rounds_keep_their_pace_while_the_service_is_frozen(tmp_path):
    service = ServiceProcess(
        f"sqlite:///{tmp_path / 'frozen.db'}", tmp_path / "service.log", api_key=KEY
    )
    frozen = False
    reporter = None
    try:
        http = httpx.Client(base_url=service.url, timeout=30)
        _warm_up(http, service)
        audit_id, reporter, strategy = _audit(
            http, service, num_rounds=ROUNDS, round_budget_seconds=BUDGET
        )

        def freeze_or_thaw(t):
            nonlocal frozen
            if t in FROZEN and not frozen:
                os.kill(service.process.pid, signal.SIGSTOP)
                frozen = True
            elif t not in FROZEN and frozen:
                os.kill(service.process.pid, signal.SIGCONT)
                frozen = False

        spent = _rounds(strategy, freeze_or_thaw)
        # every round within the budget plus the margin, the frozen ones included
        assert max(spent) <= BUDGET + MARGIN, [round(s, 2) for s in spent]
        # the frozen rounds did wait on the audit, up to the budget; none after the service
        # is back (the round after the thaw may still wait for the reports held up)
        exceeded = set(strategy.round_budget.exceeded)
        assert exceeded & set(FROZEN), "the service was frozen: some wait ran out"
        assert max(exceeded) <= max(FROZEN) + 1, strategy.round_budget.exceeded

        # thawed: everything handed over is delivered, then the final model
        strategy.flush()
        reporter.report_final(np.zeros(DIM, np.float32), {})
        audit = wait_for(
            lambda: (a := http.get(f"/audits/{audit_id}").json())["status"] != "running" and a,
            timeout=60,
            interval=0.2,
            what="the audit to end",
        )
        assert audit["status"] == "succeeded", audit["reason"]
        stored = [r["round"] for r in http.get(f"/audits/{audit_id}/rounds").json()["items"]]
        assert stored == list(range(1, ROUNDS + 1))  # nothing acknowledged was dropped
        gaps = {g["round"] for g in audit["gaps"]}
        assert gaps <= set(FROZEN) | {max(FROZEN) + 1}, audit["gaps"]
        for gap in audit["gaps"]:
            assert gap["kind"] == "no_canaries"
    finally:
        if frozen:
            os.kill(service.process.pid, signal.SIGCONT)
        if reporter is not None:
            reporter.close()
        service.stop()
