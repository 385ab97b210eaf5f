"""Every audit ends (issue #21), with real processes: an external run that dies (kill -9) is
ended after its silence limit (here the spec's short ``timeout_seconds``) with a reason and the missing
rounds as gaps, while a live run that is only slow is kept alive by the wrapper's heartbeat;
a restarted service fails the built-in audits its previous process was running at once (not
after the lease) and does not count its own downtime as an external run's silence."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import httpx
import pytest

from flaudit.service.store import Store, utcnow
from tests.processes import ROOT, wait_for

from .conftest import BACKENDS, POSTGRES_URL
from .fake_engine import FAKE_ENV, FAKE_TASK
from .service_process import ServiceProcess

pytestmark = pytest.mark.slow

KEY = "audits-end-key-" + "k" * 12
AUTH = {"Authorization": f"Bearer {KEY}"}
SILENCE = 4.0  # timeout_seconds of the external audits here
CHECK = 0.5  # FLAUDIT_SILENCE_CHECK_SECONDS
CLAIM = {
    "noise_multiplier": 1.0,
    "clip_norm": 0.5,
    "num_rounds": 5,
    "num_clients": 3,
    "clients_per_round": 3,
}

RUN = textwrap.dedent("""
    import sys, time
    import numpy as np
    from flaudit.server.reporting import RoundMetadata
    from flaudit.server.http_reporter import HttpRoundReporter
    url, audit_id, token, claim = sys.argv[1], sys.argv[2], sys.argv[3], eval(sys.argv[4])
    reporter = HttpRoundReporter(url, audit_id, token, run_id="the-run")
    reporter.declare_claim(claim)
    reporter.report_initial(np.zeros(500, dtype=np.float32))
    reporter.report_round(1, np.full(500, 0.01, dtype=np.float32), RoundMetadata(
        0.5, 3, 0, 0, 0.0, 0.5, train_loss=1.0), )
    print("round 1 reported", flush=True)
    time.sleep(600)  # a slow round 2: only the heartbeat speaks for the run
""")


def _database_url(kind: str, tmp_path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'end.db'}"
    schema = "flaudit_end_" + os.urandom(4).hex()
    Store(POSTGRES_URL, schema=schema).dispose()  # create the schema
    return f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", BACKENDS)
def test_a_dead_external_run_is_ended_after_its_silence_limit(kind, tmp_path):
    url = _database_url(kind, tmp_path)
    service = ServiceProcess(
        url,
        tmp_path / "service.log",
        api_key=KEY,
        env={"FLAUDIT_SILENCE_CHECK_SECONDS": str(CHECK)},
    )
    run = None
    try:
        http = httpx.Client(base_url=service.url, timeout=30)
        body = http.post(
            "/audits",
            json={
                "engine": "external",
                "num_canaries": 8,
                "max_canary_fraction": 1.0,
                "timeout_seconds": SILENCE,
            },
            headers=AUTH,
        ).json()
        audit_id, token = body["id"], body["environment"]["FLAUDIT_RUN_TOKEN"]
        run = subprocess.Popen(
            [sys.executable, "-c", RUN, service.url, audit_id, token, repr(CLAIM)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert run.stdout.readline().strip() == "round 1 reported"
        # slow, not dead: the heartbeat (every SILENCE/4 s) keeps the audit running
        time.sleep(2.5 * SILENCE)
        assert http.get(f"/audits/{audit_id}").json()["status"] == "running"
        os.kill(run.pid, signal.SIGKILL)  # the ServerApp dies
        run.wait(timeout=10)
        killed = time.monotonic()
        audit = wait_for(
            lambda: (a := http.get(f"/audits/{audit_id}").json())["status"] != "running" and a,
            timeout=5 * SILENCE,
            interval=0.1,
            what="the silent audit to end",
        )
        took = time.monotonic() - killed
        # within the limit after the last heartbeat (at most SILENCE/4 before the kill) plus
        # one check period and polling
        assert took <= SILENCE + CHECK + 1.5, took
        assert audit["status"] == "failed"
        assert audit["reason"].startswith(
            f"the run stopped making progress: no sign of it for more than {SILENCE:g} s "
            f"(timeout_seconds = {SILENCE:g} s; last sign "
        )
        assert (
            "after 1 of 5 rounds; rounds 2-5 and the final model were never reported"
            in (audit["reason"])
        )
        assert [(g["round"], g["kind"]) for g in audit["gaps"]] == [
            (t, "not_reported") for t in range(2, 6)
        ]
        assert audit["progress"]["round"] == 1
        assert [r["round"] for r in http.get(f"/audits/{audit_id}/rounds").json()["items"]] == [1]
    finally:
        if run is not None and run.poll() is None:
            os.kill(run.pid, signal.SIGKILL)
        service.stop()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", BACKENDS)
def test_a_restart_fails_interrupted_audits_at_once_and_keeps_external_ones(kind, tmp_path):
    """Default lease (30 s): the restarted service fails the built-in audit its killed process
    ran as soon as it is up; the external audit's silence starts again at the restart."""
    url = _database_url(kind, tmp_path)
    acks = tmp_path / "acks.jsonl"
    env = {
        **FAKE_ENV,
        "FLAUDIT_SILENCE_CHECK_SECONDS": str(CHECK),
        "FLAUDIT_INSTANCE_ID": "",
        "FLAUDIT_TEST_ACK_LOG": str(acks),
    }
    service = ServiceProcess(url, tmp_path / "service.log", api_key=KEY, env=env)
    http = httpx.Client(base_url=service.url, timeout=30)
    spec = {
        "name": "built-in",
        "task": FAKE_TASK,
        "num_rounds": 200,
        "num_clients": 10,
        "clients_per_round": 4,
        "num_canaries": 8,
        "noise_multiplier": 1.0,
        "clip_norm": 1.0,
        "task_options": {"dim": 500, "round_seconds": 0.2},
    }
    built_in = http.post("/audits", json=spec, headers=AUTH).json()["id"]
    external = http.post(
        "/audits",
        json={
            "engine": "external",
            "num_canaries": 8,
            "max_canary_fraction": 1.0,
            "timeout_seconds": 20,
        },
        headers=AUTH,
    ).json()
    token = external["environment"]["FLAUDIT_RUN_TOKEN"]
    claim = http.put(
        f"/audits/{external['id']}/claim", json=CLAIM, headers={"Authorization": f"Bearer {token}"}
    )
    assert claim.status_code == 200, claim.text
    wait_for(
        lambda: http.get(f"/audits/{built_in}").json()["progress"]["round"] >= 3,
        timeout=60,
        interval=0.1,
        what="3 rounds of the built-in audit",
    )
    service.kill9()
    time.sleep(2 * CHECK)
    service = ServiceProcess(url, tmp_path / "service2.log", api_key=KEY, env=env)
    ready = time.monotonic()
    try:
        http = httpx.Client(base_url=service.url, timeout=30)
        audit = http.get(f"/audits/{built_in}").json()
        waited = time.monotonic() - ready
        assert audit["status"] == "failed" and waited < 5, (audit["status"], waited)
        assert audit["reason"].startswith("service restarted during the run; ")
        assert audit["progress"]["eta_seconds"] is None
        assert http.get(f"/audits/{external['id']}").json()["status"] == "running"
        # kill -9 lost no acknowledged round
        acked = {
            int(json.loads(x)["path"].split("/")[1])
            for x in acks.read_text().splitlines()
            if x.strip() and json.loads(x)["path"].startswith("rounds/")
        }
        stored = [r["round"] for r in http.get(f"/audits/{built_in}/rounds").json()["items"]]
        assert acked and acked <= set(stored) and stored == list(range(1, len(stored) + 1))
        assert (
            audit["reason"] == f"service restarted during the run; {len(stored)} rounds were stored"
        )
    finally:
        service.stop()


def test_silence_counts_from_the_last_contact_or_the_service_start(sqlite_store):
    store = sqlite_store
    spec = {
        "engine": "external",
        "num_rounds": 3,
        "timeout_seconds": 10,
        "num_canaries": 8,
        "start_timeout_seconds": 10,
    }
    waiting = store.create_audit(name="w", spec=spec, canary_seed=1, run_token="w")
    assert store.end_silent_external(since=utcnow(), now=utcnow() + timedelta(seconds=9)) == []
    assert store.end_silent_external(since=utcnow(), now=utcnow() + timedelta(seconds=11)) == [
        waiting.id
    ]  # no claim within timeout_seconds of its creation
    assert store.get_audit(waiting.id).reason.startswith(
        "the run never started: no Flower run declared its claim within 10 s"
    )
    audit = store.create_audit(name="x", spec=spec, canary_seed=1, run_token="t")
    assert store.declare_claim(audit.id, spec=spec, run_id="r")  # the run starts
    started = utcnow()
    assert store.end_silent_external(since=started, now=started + timedelta(seconds=9)) == []
    # a service that came up 5 s ago does not count its own downtime
    assert (
        store.end_silent_external(
            since=started + timedelta(seconds=8), now=started + timedelta(seconds=15)
        )
        == []
    )
    assert store.touch(audit.id)
    later = utcnow() + timedelta(seconds=10.5)
    assert store.end_silent_external(since=started, now=later) == [audit.id]
    ended = store.get_audit(audit.id)
    assert ended.status == "failed" and "after 0 of 3 rounds; rounds 1-3" in ended.reason
    assert [g["round"] for g in ended.gaps] == [1, 2, 3]
    assert store.run_token_hash(audit.id) is None
