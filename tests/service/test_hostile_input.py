"""Hostile or unlucky input (issue #12): every probe gets a 4xx naming the problem, the error body
is strict JSON, nothing is stored, and the audit list stays readable. Both databases."""

from __future__ import annotations

import json

import numpy as np
import pytest

from .conftest import AUTH, SMALL_SPEC, f32, start_run, submit


def _strict_json(response):
    """The body parsed as standard JSON (NaN/Infinity tokens refused) from strict UTF-8."""

    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(response.content.decode("utf-8"), parse_constant=refuse)


def _raw_spec(**raw_fields: str) -> bytes:
    """SMALL_SPEC as JSON text with some fields replaced by raw (possibly non-standard) JSON."""
    text = json.dumps({k: v for k, v in SMALL_SPEC.items() if k not in raw_fields})
    extra = ", ".join(f'"{k}": {v}' for k, v in raw_fields.items())
    return (text[:-1] + ", " + extra + "}").encode("utf-8", "surrogatepass")


RAW_PROBES = [
    ({"noise_multiplier": "NaN"}, "noise_multiplier"),
    ({"noise_multiplier": "Infinity"}, "noise_multiplier"),
    ({"clip_norm": "-Infinity"}, "clip_norm"),
    ({"server_learning_rate": "1e999"}, "server_learning_rate"),
    (
        {"clip_norm": "null", "adaptive_clipping": '{"initial_clip_norm": Infinity}'},
        "adaptive_clipping",
    ),
    ({"task_options": '{"alpha": NaN}'}, "task_options"),
    ({"name": '"\\ud800"'}, "name"),
    ({"name": '"a\\u0000b"'}, "name"),
    ({"data_seed": str(2**200)}, "data_seed"),
    ({"batch_size": str(10**18)}, "batch_size"),
    ({"max_participations": str(10**30)}, "max_participations"),
    ({"task_options": '{"dim": 1000000000000}'}, "task_options"),
    ({"superlink_address": '"not-an-address"'}, "superlink_address"),
    ({"task": '"antigravity"'}, "task"),
    ({"task": '" synthetic"'}, "task"),
    ({"task": '"SYNTHETIC"'}, "task"),
    ({"task": '"nosuchtask"'}, "task"),
]


@pytest.mark.parametrize("raw, field", RAW_PROBES)
def test_raw_probe_is_422_naming_the_field_nothing_stored(client, store, raw, field):
    response = client.post(
        "/audits", content=_raw_spec(**raw), headers={**AUTH, "Content-Type": "application/json"}
    )
    assert response.status_code == 422, response.text
    body = _strict_json(response)
    locs = [".".join(str(p) for p in err["loc"]) for err in body["detail"]]
    assert any(field in loc for loc in locs), body
    assert store.count_audits() == 0
    listing = client.get("/audits")
    assert listing.status_code == 200 and _strict_json(listing)["total"] == 0


def test_lone_surrogate_in_raw_utf8_is_a_4xx(client, store):
    body = _raw_spec(name='"\ud800"')  # the surrogate's (invalid) UTF-8 bytes, not an escape
    response = client.post(
        "/audits", content=body, headers={**AUTH, "Content-Type": "application/json"}
    )
    assert 400 <= response.status_code < 500, response.text
    _strict_json(response)
    assert store.count_audits() == 0


def test_a_custom_task_must_be_findable(store):
    from .conftest import make_client

    with make_client(store, allow_custom_tasks=True) as c:
        bad = c.post(
            "/audits", json={**SMALL_SPEC, "task": "no_such_pkg_xyz.tasks:make"}, headers=AUTH
        )
        assert bad.status_code == 422 and "no_such_pkg_xyz" in bad.text
        good = c.post(
            "/audits",
            json={**SMALL_SPEC, "task": "flaudit.clients.tasks:synthetic_task"},
            headers=AUTH,
        )
        assert good.status_code == 201, good.text
    assert store.count_audits() == 1


# -- ingest ----------------------------------------------------------------------------------
def _running_audit(client, store, dim=64):
    audit_id = submit(client)
    headers = start_run(store, audit_id)
    initial = client.put(
        f"/audits/{audit_id}/initial-model", content=f32(np.zeros(dim)), headers=headers
    )
    assert initial.status_code == 200, initial.text
    return audit_id, headers


META = {"clip_norm": 1.0, "cohort_size": 5, "num_canaries_inserted": 1}


@pytest.mark.parametrize(
    "patch, field",
    [
        ({"cohort_size": 9223372036854775808}, "cohort_size"),
        ({"num_canaries_inserted": 10**20}, "num_canaries_inserted"),
        ({"num_failures": -1}, "num_failures"),
        ({"clip_norm": "inf"}, "clip_norm"),
        ({"train_loss": "nan"}, "train_loss"),
    ],
)
def test_out_of_range_round_metadata_is_422(client, store, patch, field):
    audit_id, headers = _running_audit(client, store)
    response = client.put(
        f"/audits/{audit_id}/rounds/1",
        params={**META, **patch},
        content=f32(np.ones(64)),
        headers=headers,
    )
    assert response.status_code == 422 and field in response.text, response.text
    assert client.get(f"/audits/{audit_id}").json()["status"] == "running"
    assert client.get(f"/audits/{audit_id}").json()["progress"]["round"] == 0


def test_a_delta_whose_norm_overflows_float32_is_handled(client, store):
    audit_id, headers = _running_audit(client, store)
    delta = np.full(64, 3e38, dtype=np.float32)
    delta[::2] *= -1
    response = client.put(
        f"/audits/{audit_id}/rounds/1", params=META, content=f32(delta), headers=headers
    )
    assert response.status_code == 200, response.text
    audit = client.get(f"/audits/{audit_id}").json()
    assert audit["status"] == "running" and audit["progress"]["round"] == 1
    cosines = [
        item["max_cosine"] for item in client.get(f"/audits/{audit_id}/cosines").json()["items"]
    ]
    assert all(c is not None and -1 <= c <= 1 for c in cosines)
    final = client.put(f"/audits/{audit_id}/final-model", content=f32(-delta), headers=headers)
    assert final.status_code == 200, final.text
    assert client.get(f"/audits/{audit_id}").json()["status"] == "succeeded"


# -- response size ---------------------------------------------------------------------------
def test_cosines_json_is_paged_and_csv_has_every_canary(client, store):
    audit_id = submit(client, {**SMALL_SPEC, "num_canaries": 20})
    page = client.get(f"/audits/{audit_id}/cosines", params={"limit": 7, "offset": 14}).json()
    assert page["total"] == 20 and [i["index"] for i in page["items"]] == list(range(14, 20))
    assert client.get(f"/audits/{audit_id}/cosines", params={"limit": 10**6}).status_code == 422
    csv_text = client.get(f"/audits/{audit_id}/cosines", params={"format": "csv"}).text
    assert len(csv_text.strip().splitlines()) == 1 + 20


# -- body limits, before authentication -------------------------------------------------------
def test_a_large_declared_body_is_refused_before_auth(client, store):
    response = client.post(
        "/audits",
        content=b"{" + b" " * (70 << 10) + b"}",
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 413 and "limit" in response.json()["detail"]
    assert store.count_audits() == 0


def test_a_large_chunked_body_is_cut_while_streaming(client, store):
    def chunks():
        yield b'{"name": "'
        for _ in range(200):
            yield b"x" * 1024
        yield b'"}'

    response = client.post(
        "/audits", content=chunks(), headers={**AUTH, "Content-Type": "application/json"}
    )
    assert response.status_code == 413, response.text
    assert store.count_audits() == 0
