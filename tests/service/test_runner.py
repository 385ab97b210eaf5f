"""The runner in the real service (subprocess), with the light numpy engine of fake_engine.py:
concurrency limit, timeout, failure reasons (with the seed scrubbed), cleanup."""

from __future__ import annotations

import httpx
import pytest

from flaudit.service.store import Store
from tests.processes import wait_for

from .conftest import CIPHER
from .fake_engine import FAKE_ENV, FAKE_SPEC
from .service_process import ServiceProcess, tagged_processes

pytestmark = pytest.mark.slow
KEY = "runner-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
BASE = {**FAKE_SPEC, "num_rounds": 8, "task_options": {"dim": 1000, "round_seconds": 0.1}}


@pytest.mark.timeout(150)
def test_concurrency_limit_timeout_and_failure_reasons(tmp_path):
    db = f"sqlite:///{tmp_path / 'runner.db'}"
    env = {**FAKE_ENV, "FLAUDIT_TIMEOUT_GRACE_SECONDS": "0", "FLAUDIT_MAX_CONCURRENT_AUDITS": "1"}
    service = ServiceProcess(db, tmp_path / "service.log", api_key=KEY, env=env)
    try:
        with httpx.Client(base_url=service.url, timeout=30) as http:

            def submit(**patch):
                r = http.post("/audits", json={**BASE, **patch}, headers=AUTH)
                assert r.status_code == 201, r.text
                return r.json()["id"]

            ok = submit(name="ok")
            slow = submit(name="slow", num_rounds=200, timeout_seconds=1.5)
            broken = submit(name="broken", task_options={"dim": 1000, "fail_at_round": 3})
            ids = [ok, slow, broken]
            max_running = 0

            def all_done():
                nonlocal max_running
                items = http.get("/audits").json()["items"]
                max_running = max(max_running, sum(i["status"] == "running" for i in items))
                return all(i["status"] not in ("queued", "running") for i in items)

            wait_for(all_done, timeout=120, interval=0.1, what="all audits to end")
            audits = {i: http.get(f"/audits/{i}").json() for i in ids}
        assert max_running == 1
        assert audits[ok]["status"] == "succeeded" and audits[ok]["progress"]["round"] == 8
        assert audits[slow]["status"] == "failed"
        assert audits[slow]["reason"].startswith("timed out after 1.5 s")
        assert audits[broken]["status"] == "failed"
        reason = audits[broken]["reason"]
        assert "synthetic failure at round 3" in reason and reason.endswith("2 rounds were stored")
        store = Store(db, cipher=CIPHER)
        seed = store.canary_seed(broken)
        store.dispose()
        assert str(seed) not in reason and "<redacted>" in reason
        assert str(seed) not in (tmp_path / "service.log").read_text()
        for audit_id in ids:
            assert wait_for(
                lambda audit_id=audit_id: not tagged_processes(audit_id), timeout=10, what="cleanup"
            )
    finally:
        service.stop()


@pytest.mark.timeout(120)
def test_demo_submits_the_example_once(tmp_path):
    db = f"sqlite:///{tmp_path / 'demo.db'}"
    env = dict(FAKE_ENV)
    for attempt in range(2):  # the second start finds an audit and submits nothing
        service = ServiceProcess(
            db, tmp_path / f"service{attempt}.log", api_key=KEY, env=env, args=("--demo",)
        )
        try:
            with httpx.Client(base_url=service.url, timeout=30) as http:
                listing = http.get("/audits").json()
                assert listing["total"] == 1
                audit_id = listing["items"][0]["id"]
                audit = wait_for(
                    lambda audit_id=audit_id: (
                        (a := http.get(f"/audits/{audit_id}").json())["status"] != "queued" and a
                    ),
                    timeout=60,
                    what="demo audit to start",
                )
                assert audit["spec"]["task"] == "digits"
                wait_for(
                    lambda audit_id=audit_id: (
                        http.get(f"/audits/{audit_id}").json()["status"] == "succeeded"
                    ),
                    timeout=90,
                    what="demo audit to finish",
                )
        finally:
            service.stop()
