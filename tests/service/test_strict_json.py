"""Issue #40: request bodies are read strictly. A UTF-8 byte order mark, a key given twice (the
last one would win, ``engine`` included) and numbers sent as strings are refused with a 422
naming the field, with a valid key and nothing stored; ``POST /audits/design`` refuses what
``POST /audits`` refuses; an external audit is bound to the first run that names itself."""

from __future__ import annotations

import json

import numpy as np
import pytest

from .conftest import AUTH, SMALL_SPEC, make_client
from .test_external import CLAIM, EXTERNAL

JSON = {**AUTH, "Content-Type": "application/json"}


def _create(client):
    """An external audit and its run's auth header."""
    response = client.post("/audits", json=EXTERNAL, headers=AUTH)
    assert response.status_code == 201, response.text
    body = response.json()
    return body["id"], {"Authorization": f"Bearer {body['environment']['FLAUDIT_RUN_TOKEN']}"}


def _put(client, path, vector, headers):
    return client.put(
        path,
        content=np.asarray(vector, "<f4").tobytes(),
        headers={**headers, "Content-Type": "application/octet-stream"},
    )


def _locs(response) -> list[str]:
    return [".".join(map(str, e["loc"])) for e in response.json()["detail"]]


def test_a_byte_order_mark_is_refused_and_nothing_stored(client, store):
    body = json.dumps(SMALL_SPEC).encode()
    assert client.post("/audits/design", content=body, headers=JSON).status_code == 200
    for path in ("/audits", "/audits/design"):
        response = client.post(path, content=b"\xef\xbb\xbf" + body, headers=JSON)
        assert response.status_code == 422, response.text
        assert "byte order mark" in response.text and _locs(response) == ["body"]
    assert store.count_audits() == 0


@pytest.mark.parametrize(
    "key, first, last",
    [
        ("engine", '"simulation"', '"external"'),
        ("noise_multiplier", "1.0", "0.0"),
        ("name", '"a"', '"a"'),  # the same value twice is refused too: a key appears once
    ],
)
def test_a_duplicate_key_is_refused_naming_it(client, store, key, first, last):
    text = json.dumps({k: v for k, v in SMALL_SPEC.items() if k != key})
    body = f'{text[:-1]}, "{key}": {first}, "{key}": {last}}}'.encode()
    response = client.post("/audits", content=body, headers=JSON)
    assert response.status_code == 422, response.text
    assert _locs(response) == [f"body.{key}"] and "duplicate key" in response.text
    assert store.count_audits() == 0


def test_a_duplicate_key_inside_a_nested_object_is_refused(client, store):
    body = (
        json.dumps({**SMALL_SPEC, "task_options": {}})
        .replace('"task_options": {}', '"task_options": {"dim": 400, "dim": 500}')
        .encode()
    )
    response = client.post("/audits", content=body, headers=JSON)
    assert response.status_code == 422 and _locs(response) == ["body.dim"], response.text
    assert store.count_audits() == 0


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_rounds", "4"),
        ("noise_multiplier", "0.5"),
        ("clip_norm", "1"),
        ("delta", "1e-5"),
        ("num_canaries", "20"),
        ("data_seed", "0"),
    ],
)
def test_a_number_sent_as_a_string_is_refused_naming_the_field(client, store, field, value):
    for path in ("/audits", "/audits/design"):
        response = client.post(path, json={**SMALL_SPEC, field: value}, headers=AUTH)
        assert response.status_code == 422, response.text
        assert f"body.{field}" in _locs(response) and "expected a number" in response.text
    assert store.count_audits() == 0


def test_numbers_keep_their_json_forms(client, store):
    """A JSON integer for a float field stays a number; "auto" stays a choice of num_canaries."""
    spec = {**SMALL_SPEC, "noise_multiplier": 1, "clip_norm": 2, "max_canary_fraction": 1}
    response = client.post("/audits", json=spec, headers=AUTH)
    assert response.status_code == 201, response.text
    stored = store.get_audit(response.json()["id"]).spec
    assert stored["noise_multiplier"] == 1.0 and stored["clip_norm"] == 2.0
    auto = client.post("/audits", json={"engine": "external", "num_canaries": "auto"}, headers=AUTH)
    assert auto.status_code == 201, auto.text


def test_a_claim_with_a_number_as_a_string_or_a_duplicate_key_is_refused(client, store):
    audit_id, token = _create(client)
    refused = client.put(
        f"/audits/{audit_id}/claim", json={**CLAIM, "num_rounds": "4"}, headers=token
    )
    assert refused.status_code == 422 and "body.num_rounds" in _locs(refused), refused.text
    text = json.dumps(CLAIM)
    twice = f'{text[:-1]}, "noise_multiplier": 5.0}}'.encode()
    refused = client.put(
        f"/audits/{audit_id}/claim",
        content=twice,
        headers={**token, "Content-Type": "application/json"},
    )
    assert refused.status_code == 422 and _locs(refused) == ["body.noise_multiplier"]
    assert store.get_audit(audit_id).started_at is None  # nothing stored
    assert client.put(f"/audits/{audit_id}/claim", json=CLAIM, headers=token).status_code == 200


def test_binary_round_data_is_not_read_as_json(client, store):
    """Round data stays raw float32; bytes that happen to start like a BOM are just values."""
    audit_id, token = _create(client)
    assert client.put(f"/audits/{audit_id}/claim", json=CLAIM, headers=token).status_code == 200
    vector = np.frombuffer(b"\xef\xbb\xbf\x3f" * 300, "<f4")
    assert np.all(np.isfinite(vector))
    response = _put(client, f"/audits/{audit_id}/initial-model", vector, token)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"task": "os:system"}, "task"),
        ({"inject_bug": {"kind": "no_noise"}}, "inject_bug"),
    ],
)
def test_design_refuses_what_submit_refuses(client, store, extra, field):
    for path in ("/audits", "/audits/design"):
        response = client.post(path, json={**SMALL_SPEC, **extra}, headers=AUTH)
        assert response.status_code == 422, (path, response.text)
        assert f"body.{field}" in _locs(response)
    assert store.count_audits() == 0


def test_design_allows_what_the_operator_allows(store):
    with make_client(store, allow_bug_injection=True) as allowed:
        spec = {**SMALL_SPEC, "inject_bug": {"kind": "no_noise"}}
        assert allowed.post("/audits/design", json=spec).status_code == 200


def test_an_audit_claimed_without_a_run_id_is_bound_to_the_first_run_naming_itself(client, store):
    audit_id, token = _create(client)
    assert client.put(f"/audits/{audit_id}/claim", json=CLAIM, headers=token).status_code == 200
    assert store.get_audit(audit_id).run_id is None
    first = {**token, "X-Flaudit-Run-Id": "run-a"}
    dim = 300
    assert (
        _put(client, f"/audits/{audit_id}/initial-model", np.zeros(dim), first).status_code == 200
    )
    assert store.get_audit(audit_id).run_id == "run-a"
    # from then on another run, or a request without the header, is refused
    other = _put(
        client,
        f"/audits/{audit_id}/initial-model",
        np.zeros(dim),
        {**token, "X-Flaudit-Run-Id": "run-b"},
    )
    assert other.status_code == 409 and "another run" in other.text
    anonymous = client.put(f"/audits/{audit_id}/heartbeat", headers=token)
    assert anonymous.status_code == 409 and "X-Flaudit-Run-Id" in anonymous.text
    assert client.put(f"/audits/{audit_id}/heartbeat", headers=first).status_code == 200


def test_a_repeated_claim_with_a_run_id_binds_the_unowned_audit(client, store):
    audit_id, token = _create(client)
    assert client.put(f"/audits/{audit_id}/claim", json=CLAIM, headers=token).status_code == 200
    again = client.put(
        f"/audits/{audit_id}/claim", json=CLAIM, headers={**token, "X-Flaudit-Run-Id": "run-a"}
    )
    assert again.status_code == 200 and again.json()["stored"] is False
    assert store.get_audit(audit_id).run_id == "run-a"
    other = client.put(
        f"/audits/{audit_id}/claim", json=CLAIM, headers={**token, "X-Flaudit-Run-Id": "run-b"}
    )
    assert other.status_code == 409
