"""Fuzz the API from its own OpenAPI schema (schemathesis): no input may cause a 5xx."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings

from auditor.service.app import create_app
from auditor.service.settings import Settings
from auditor.service.store import Store

from .conftest import API_KEY

_DB = Path(tempfile.mkdtemp(prefix="flaudit-fuzz-")) / "fuzz.db"
_STORE = Store(f"sqlite:///{_DB}")
APP = create_app(Settings(api_keys=(API_KEY,), start_runner=False), store=_STORE)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@pytest.fixture(scope="module", autouse=True)
def _lifespan():
    with TestClient(APP) as client:
        # one audit with data so that id-based routes also hit existing rows
        client.post("/audits", json={"num_canaries": 4, "num_clients": 10, "clients_per_round": 2},
                    headers={"Authorization": f"Bearer {API_KEY}"})
        yield
    _STORE.dispose()


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case):
    response = case.call(headers={"Authorization": f"Bearer {API_KEY}"})
    assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:500])
