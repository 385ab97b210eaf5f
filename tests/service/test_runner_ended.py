"""The runner's lease loop with an audit that ended while its worker runs: a cancelled audit's
worker gets SIGTERM (for a deployment worker: ``flwr stop``), but the worker of a succeeded
deployment audit is left to watch its Flower run complete. Stopping it there turned a
completing run into a stopped one (seen in a clean-clone run of tests/deployment/test_topology.py:
the final model was in, the lease tick came before the ServerApp exited, the run ended
``stopped``)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from flaudit.service.runner import Runner, _Worker
from flaudit.service.settings import Settings
from tests.processes import wait_for

DEPLOYMENT = {
    "num_rounds": 3,
    "num_canaries": 4,
    "delta": 1e-5,
    "engine": "deployment",
    "superlink_address": "superlink:9093",
}


def _worker_body(marker: str) -> None:
    """A stand-in worker: its own process group (as the runner's workers), writes ``marker``
    on SIGTERM (where a deployment worker asks the SuperLink to stop the run) and exits."""
    os.setpgrp()

    def on_term(signum, frame):
        Path(marker).write_text("SIGTERM")
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture
def runner(sqlite_store):
    runner = Runner(sqlite_store, Settings(instance_id="instance-a", cancel_grace_seconds=5))
    yield runner
    for worker in list(runner._workers.values()):
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(timeout=5)


def _running_deployment_audit(runner: Runner, tmp_path: Path, name: str):
    store = runner.store
    audit = store.create_audit(name=name, spec=DEPLOYMENT, canary_seed=1)
    assert store.mark_running(audit.id, run_token="tok", owner="instance-a")
    assert store.set_flower_run(audit.id, 4242)
    marker = tmp_path / f"{name}.sigterm"
    process = multiprocessing.get_context("spawn").Process(target=_worker_body, args=(str(marker),))
    process.start()
    receiver, sender = multiprocessing.get_context("spawn").Pipe(duplex=False)
    sender.close()
    worker = _Worker(audit.id, process, receiver, time.monotonic(), 60.0)
    worker.extra["flower_run_id"] = "4242"
    runner._workers[audit.id] = worker
    wait_for(
        lambda: process.pid and os.getpgid(process.pid) == process.pid,
        timeout=30,
        what="the stand-in worker's process group",
    )
    return audit.id, worker, marker


def test_a_succeeded_deployment_audit_keeps_its_worker_until_the_run_ends(runner, tmp_path):
    audit_id, worker, marker = _running_deployment_audit(runner, tmp_path, "done")
    assert runner.store.finish(audit_id, status="succeeded", reason=None, only_if=("running",))
    runner._keep_leases()
    runner._next_heartbeat = 0.0
    runner._keep_leases()  # a second tick: still left alone, logged once
    time.sleep(0.5)
    assert not marker.exists(), "the worker of a succeeded audit was sent SIGTERM (flwr stop)"
    assert worker.process.is_alive() and audit_id in runner._workers
    assert worker.extra["finishing"]
    # the run completes: the worker exits by itself and is reaped, the audit stays succeeded
    worker.process.kill()
    worker.process.join(timeout=5)
    runner._reap()
    assert audit_id not in runner._workers
    assert runner.store.get_audit(audit_id).status == "succeeded"


def test_a_cancelled_deployment_audit_still_stops_its_worker(runner, tmp_path):
    audit_id, worker, marker = _running_deployment_audit(runner, tmp_path, "cancelled")
    assert runner.store.finish(
        audit_id, status="cancelled", reason="cancelled", only_if=("running",)
    )
    runner._keep_leases()
    assert marker.read_text() == "SIGTERM"  # the worker turns this into a stop request
    assert audit_id not in runner._workers and not worker.process.is_alive()


@pytest.mark.parametrize(
    ("status", "expected", "unexpected"),
    [
        ("succeeded", "ended with its final model", "outside this instance"),
        ("cancelled", "ended outside this instance (cancelled)", "final model"),
    ],
)
def test_the_log_says_how_a_simulation_audit_ended(
    runner, tmp_path, caplog, status, expected, unexpected
):
    """A simulation audit whose worker stored the final model ended normally: the lease tick
    that stops its worker says so, and keeps "outside this instance" for an end made elsewhere."""
    audit_id, worker, _ = _running_deployment_audit(runner, tmp_path, status)
    worker.extra.pop("flower_run_id")  # a simulation worker: no Flower run to watch
    assert runner.store.finish(audit_id, status=status, reason=None, only_if=("running",))
    with caplog.at_level("INFO", logger="flaudit.runner"):
        runner._keep_leases()
    lines = [r.getMessage() for r in caplog.records if audit_id in r.getMessage()]
    assert any(expected in line for line in lines), lines
    assert not any(unexpected in line for line in lines), lines
    assert audit_id not in runner._workers
