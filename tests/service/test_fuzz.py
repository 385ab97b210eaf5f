"""Fuzz the API: from its own OpenAPI schema (schemathesis), and with raw request bodies holding
what standard JSON does not (NaN, Infinity, huge integers, lone surrogates, NUL) on SQLite and
PostgreSQL with the runner on. No input may cause a 5xx, a rejected body stores nothing, every
error body is strict JSON, and the audit list stays readable."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flaudit.auditor.spec import AuditSpec
from flaudit.service.app import create_app
from flaudit.service.settings import Settings
from flaudit.service.store import Store

from .conftest import API_KEY, CIPHER, SMALL_SPEC, make_client
from .fake_engine import FAKE_ENV
from .test_hostile_input import _strict_json

_DB = Path(tempfile.mkdtemp(prefix="flaudit-fuzz-")) / "fuzz.db"
_STORE = Store(f"sqlite:///{_DB}", cipher=CIPHER)
APP = create_app(Settings(api_keys=(API_KEY,), start_runner=False), store=_STORE)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@pytest.fixture(scope="module", autouse=True)
def _lifespan():
    with TestClient(APP) as client:
        # one audit with data so that id-based routes also hit existing rows
        client.post(
            "/audits",
            json={"num_canaries": 4, "num_clients": 10, "clients_per_round": 2},
            headers={"Authorization": f"Bearer {API_KEY}"},
        )
        yield
    _STORE.dispose()


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case):
    response = case.call(headers={"Authorization": f"Bearer {API_KEY}"})
    assert response.status_code < 500, (
        case.method,
        case.path,
        response.status_code,
        response.text[:500],
    )


# -- raw, non-standard JSON -------------------------------------------------------------------
_RAW_TOKENS = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1e999",
    "-1e999",
    str(2**63),
    str(-(2**64)),
    str(10**30),
    "1" * 5000,
    '"\\ud800"',
    '"a\\u0000b"',
    '"\\udfff tail"',
    '"ok"',
    "true",
    "null",
    "[]",
    "{}",
    '{"alpha": NaN}',
    '{"dim": 1e999}',
    '{"dim": 1000000000000}',
    '{"\\ud800": 1}',
    "[NaN, Infinity]",
    '{"initial_clip_norm": Infinity}',
    "[" * 50 + "]" * 50,
    '"x"',
    "-0",
    "1e-400",
    "0.1",
]
_FIELDS = sorted(AuditSpec.model_fields) + ["bogus"]


@st.composite
def _raw_bodies(draw) -> bytes:
    """SMALL_SPEC with up to three fields replaced by raw JSON tokens (or a nested one)."""
    fields = draw(st.lists(st.sampled_from(_FIELDS), min_size=0, max_size=3, unique=True))
    raw = {f: draw(st.sampled_from(_RAW_TOKENS)) for f in fields}
    if not raw:  # some valid submissions, so the runner has audits to start
        raw = {"name": '"fuzz \\u00e9"'}
    elif draw(st.booleans()):
        token = draw(st.sampled_from(_RAW_TOKENS))
        raw["adaptive_clipping"] = f'{{"initial_clip_norm": {token}}}'
        raw["clip_norm"] = "null"
    kept = {k: v for k, v in SMALL_SPEC.items() if k not in raw}
    text = json.dumps(kept)[:-1] + ", " + ", ".join(f'"{k}": {v}' for k, v in raw.items()) + "}"
    return text.encode("utf-8", "surrogatepass")


@pytest.mark.timeout(300)
def test_raw_non_standard_json_never_5xx_and_stores_nothing_on_rejection(store):
    settings_kw = {
        "start_runner": True,
        "runner_poll_seconds": 0.05,
        "worker_target": FAKE_ENV["FLAUDIT_WORKER_TARGET"],
        "allow_custom_tasks": True,
        "public_url": "http://127.0.0.1:9",
    }  # workers cannot report: audits fail fast
    seen_statuses = set()
    with make_client(store, **settings_kw) as client:

        @settings(
            max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        @given(body=_raw_bodies())
        def check(body):
            before = store.count_audits()
            response = client.post(
                "/audits",
                content=body,
                headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
            )
            assert response.status_code < 500, (body[:300], response.text[:300])
            seen_statuses.add(response.status_code)
            _strict_json(response)
            if response.status_code != 201:
                assert store.count_audits() == before, body[:300]
            listing = client.get("/audits", params={"limit": 500})
            assert listing.status_code == 200
            for item in _strict_json(listing)["items"]:
                assert client.get(f"/audits/{item['id']}").status_code == 200

        check()
    assert {201, 422} <= seen_statuses, seen_statuses
