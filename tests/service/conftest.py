"""Fixtures for the service tests: stores on SQLite (always) and PostgreSQL (when
``FLAUDIT_TEST_POSTGRES_URL`` is set; each test gets a fresh schema that is dropped after)."""

from __future__ import annotations

import os
import secrets

import numpy as np
import pytest
from fastapi.testclient import TestClient

from flaudit.service.app import create_app
from flaudit.service.sealing import SeedCipher
from flaudit.service.settings import Settings
from flaudit.service.store import Store
from tests.processes import TEST_SECRET_KEY

API_KEY = "test-key-" + "x" * 16
POSTGRES_URL = os.environ.get("FLAUDIT_TEST_POSTGRES_URL")

BACKENDS = [
    "sqlite",
    pytest.param(
        "postgresql",
        marks=[
            pytest.mark.postgres,
            pytest.mark.skipif(not POSTGRES_URL, reason="FLAUDIT_TEST_POSTGRES_URL not set"),
        ],
    ),
]


CIPHER = SeedCipher([TEST_SECRET_KEY])


def _make_store(kind: str, tmp_path):
    """A store as the service opens it: seeds encrypted with the test secret key."""
    if kind == "sqlite":
        return Store(f"sqlite:///{tmp_path / 'flaudit.db'}", cipher=CIPHER), None
    schema = "flaudit_test_" + secrets.token_hex(6)
    return Store(POSTGRES_URL, schema=schema, cipher=CIPHER), schema


def _drop(store: Store, schema: str | None) -> None:
    if schema:
        with store.engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    store.dispose()


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path):
    store, schema = _make_store(request.param, tmp_path)
    yield store
    _drop(store, schema)


@pytest.fixture
def sqlite_store(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'flaudit.db'}", cipher=CIPHER)
    yield store
    store.dispose()


def make_client(store: Store, **overrides) -> TestClient:
    options = {
        "api_keys": (API_KEY,),
        "secret_keys": (TEST_SECRET_KEY,),
        "start_runner": False,
        **overrides,
    }
    settings = Settings(database_url="sqlite://", **options)  # the store is passed in
    return TestClient(create_app(settings, store=store))


@pytest.fixture
def client(store):
    with make_client(store) as c:
        yield c


AUTH = {"Authorization": f"Bearer {API_KEY}"}

SMALL_SPEC = {
    "name": "unit",
    "task": "synthetic",
    "task_options": {"dim": 400},
    "num_rounds": 4,
    "num_clients": 50,
    "clients_per_round": 5,
    "num_canaries": 20,
    "noise_multiplier": 0.5,
    "clip_norm": 1.0,
    "delta": 1e-5,
}


def submit(client: TestClient, spec: dict | None = None) -> str:
    response = client.post("/audits", json=spec or SMALL_SPEC, headers=AUTH)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def start_run(store: Store, audit_id: str) -> dict:
    """Do what the runner does when it launches a worker; return the run's auth header."""
    token = secrets.token_urlsafe(16)
    assert store.mark_running(audit_id, run_token=token)
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"}


def f32(array) -> bytes:
    return np.asarray(array, dtype="<f4").tobytes()


def put_gap(
    client: TestClient,
    audit_id: str,
    headers: dict,
    t: int,
    reason: str = "the canary fetch failed: connection refused",
):
    """Round ``t`` of a ``SMALL_SPEC`` audit, trained without canaries (``reason``)."""
    return client.put(
        f"/audits/{audit_id}/rounds/{t}",
        content=f32(np.zeros(SMALL_SPEC["task_options"]["dim"])),
        headers=headers,
        params={
            "clip_norm": 1.0,
            "cohort_size": 5,
            "num_canaries_inserted": 0,
            "canaries_missing": reason,
        },
    )
