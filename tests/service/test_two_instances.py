"""Two service instances on one database (a rolling restart, or two replicas): each runs its own
audits under an owner lease; a second instance leaves the first one's running audit alone, and
an audit whose instance died is failed once its lease expired. SQLite and PostgreSQL."""

from __future__ import annotations

import secrets

import httpx
import pytest

from flaudit.service.store import Store
from tests.processes import wait_for

from .conftest import BACKENDS, POSTGRES_URL, _drop
from .fake_engine import FAKE_ENV, FAKE_SPEC
from .service_process import ServiceProcess

pytestmark = pytest.mark.slow
KEY = "two-instances-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
LEASE = 3  # seconds: the audit runs for several leases, so only heartbeats keep it alive
SPEC = {
    **FAKE_SPEC,
    "name": "long",
    "task_options": {"dim": 1000, "round_seconds": 0.25},
    "num_rounds": 36,
    "timeout_seconds": 120,
}


@pytest.fixture(params=BACKENDS)
def database_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared.db'}"
        return
    schema = "flaudit_two_" + secrets.token_hex(6)
    store = Store(POSTGRES_URL, schema=schema)  # creates the schema and tables
    yield f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
    _drop(store, schema)


def _status(http: httpx.Client, audit_id: str) -> dict:
    return http.get(f"/audits/{audit_id}").json()


@pytest.mark.timeout(240)
def test_two_instances_share_a_database(database_url, tmp_path):
    """A second instance leaves the first one's running audit alone (it runs to success, for
    several leases) while running its own; when the first dies, its running audit fails once
    the lease expired."""
    env = {**FAKE_ENV, "FLAUDIT_LEASE_SECONDS": str(LEASE)}
    first = ServiceProcess(database_url, tmp_path / "first.log", api_key=KEY, env=env)
    second = None
    try:
        with httpx.Client(base_url=first.url, timeout=30) as http_first:
            audit_id = http_first.post("/audits", json=SPEC, headers=AUTH).json()["id"]
            wait_for(
                lambda: _status(http_first, audit_id)["progress"]["round"] >= 2,
                timeout=60,
                interval=0.1,
                what="two rounds on the first instance",
            )
            second = ServiceProcess(database_url, tmp_path / "second.log", api_key=KEY, env=env)
            with httpx.Client(base_url=second.url, timeout=30) as http_second:
                assert _status(http_second, audit_id)["status"] == "running"
                # the second instance runs audits of its own meanwhile
                other = http_second.post(
                    "/audits", json={**SPEC, "name": "other", "num_rounds": 4}, headers=AUTH
                ).json()["id"]
                wait_for(
                    lambda: _status(http_second, audit_id)["status"] != "running",
                    timeout=90,
                    interval=0.2,
                    what="the first audit to end",
                )
                final = _status(http_second, audit_id)
                assert final["status"] == "succeeded", final["reason"]
                assert final["progress"]["round"] == SPEC["num_rounds"]
                wait_for(
                    lambda: _status(http_second, other)["status"] not in ("queued", "running"),
                    timeout=60,
                    interval=0.2,
                    what="the second audit to end",
                )
                assert _status(http_second, other)["status"] == "succeeded"
                assert "stopped during the run" not in (tmp_path / "second.log").read_text()

        # the instance that runs the next audit dies mid-run: the other fails the audit once
        # the lease expired (whichever runner picked it up)
        with httpx.Client(base_url=first.url, timeout=30) as http:
            orphan = http.post("/audits", json={**SPEC, "name": "orphan"}, headers=AUTH).json()[
                "id"
            ]
            wait_for(
                lambda: _status(http, orphan)["progress"]["round"] >= 1,
                timeout=60,
                interval=0.1,
                what="the orphan's first round",
            )
        owner = _owner(database_url, orphan)
        dead, alive = (first, second) if f":{first.process.pid}:" in owner else (second, first)
        assert f":{dead.process.pid}:" in owner, owner
        dead.kill9()
        with httpx.Client(base_url=alive.url, timeout=30) as http:
            wait_for(
                lambda: _status(http, orphan)["status"] == "failed",
                timeout=5 * LEASE,
                interval=0.2,
                what="the orphaned audit to fail",
            )
            assert _status(http, orphan)["reason"].startswith("service restarted during the run")
        alive.stop()
    finally:
        for service in (first, second):
            if service is not None and service.process.poll() is None:
                service.stop()


def _owner(database_url: str, audit_id: str) -> str:
    store = Store(database_url)
    try:
        return store.get_audit(audit_id).owner_id
    finally:
        store.dispose()
