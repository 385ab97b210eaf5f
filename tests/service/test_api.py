"""REST API with FastAPI's TestClient: validation, 404, auth, ingest errors, idempotency,
restart behaviour, and the estimates being consistent with the library."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from flaudit.auditor.canaries import seen_mask
from flaudit.auditor.claims import AuditLook, summarize
from flaudit.auditor.spec import AuditSpec
from flaudit.service.auth import NO_KEY_CONFIGURED
from flaudit.service.schemas import AuditList, AuditOut, CosinesOut
from tests.canary_reference import expected_statistics

from .conftest import AUTH, SMALL_SPEC, f32, make_client, start_run, submit
from .fake_engine import synthetic_run


def _locs(response) -> list[str]:
    return [".".join(str(p) for p in err["loc"]) for err in response.json()["detail"]]


# -- submission and validation ---------------------------------------------------------------
def test_post_returns_201_with_id_and_get_shows_the_agreed_shape(client):
    audit_id = submit(client)
    body = client.get(f"/audits/{audit_id}").json()
    assert body["id"] == audit_id and body["status"] == "queued"
    for key in (
        "name",
        "reason",
        "spec",
        "created_at",
        "started_at",
        "finished_at",
        "progress",
        "dim",
        "estimates",
        "diagnostics",
        "alerts",
        "histograms",
        "metrics",
        "links",
    ):
        assert key in body
    assert body["progress"] == {
        "round": 0,
        "num_rounds": 4,
        "fraction": 0.0,
        "eta_seconds": None,
        "waiting_for": "waiting for the runner to start it (max_concurrent_audits run at once)",
    }
    assert body["links"]["rounds"] == f"/audits/{audit_id}/rounds"
    assert body["spec"]["num_canaries"] == 20
    assert "canary_seed" not in str(body)


@pytest.mark.parametrize(
    "patch, field",
    [
        ({"num_rounds": 0}, "num_rounds"),
        ({"delta": 2.0}, "delta"),
        ({"num_canaries": "many"}, "num_canaries"),
        ({"canary_repeats": 3}, "canary_repeats"),
        ({"bogus_option": 1}, "bogus_option"),
        ({"participation": "random"}, "participation"),
    ],
)
def test_invalid_spec_is_422_naming_the_field_and_nothing_is_stored(client, store, patch, field):
    response = client.post("/audits", json={**SMALL_SPEC, **patch}, headers=AUTH)
    assert response.status_code == 422
    assert any(field in loc for loc in _locs(response)), response.text
    assert store.count_audits() == 0


def test_inconsistent_spec_names_the_problem(client, store):
    response = client.post("/audits", json={**SMALL_SPEC, "adaptive_clipping": {}}, headers=AUTH)
    assert response.status_code == 422
    assert "clip_norm" in response.text
    assert store.count_audits() == 0


def test_custom_tasks_need_to_be_allowed(client, store):
    response = client.post("/audits", json={**SMALL_SPEC, "task": "os:system"}, headers=AUTH)
    assert response.status_code == 422 and "FLAUDIT_ALLOW_CUSTOM_TASKS" in response.text
    assert any("task" in loc for loc in _locs(response))
    assert store.count_audits() == 0
    with make_client(store, allow_custom_tasks=True) as c:
        assert (
            c.post(
                "/audits",
                json={**SMALL_SPEC, "task": "flaudit.clients.tasks:synthetic_task"},
                headers=AUTH,
            ).status_code
            == 201
        )


def test_deleted_audit_is_not_resurrected_by_a_late_cache_refresh(client, store):
    audit_id = submit(client)
    client.get(f"/audits/{audit_id}")
    cache = client.app.state.read_cache
    assert client.delete(f"/audits/{audit_id}", headers=AUTH).status_code == 204
    cache.put(audit_id, {"id": audit_id})  # what a refresh racing with DELETE would do
    assert client.get(f"/audits/{audit_id}").status_code == 404


def test_unknown_audit_is_404_everywhere(client):
    for path in ("/audits/nope", "/audits/nope/rounds", "/audits/nope/cosines"):
        response = client.get(path)
        assert response.status_code == 404 and "nope" in response.json()["detail"]
    assert client.post("/audits/nope/cancel", headers=AUTH).status_code == 404
    assert client.delete("/audits/nope", headers=AUTH).status_code == 404


def test_list_pages_and_filters(client, store):
    ids = [submit(client, {**SMALL_SPEC, "name": f"a{i}"}) for i in range(3)]
    client.post(f"/audits/{ids[0]}/cancel", headers=AUTH)
    page = client.get("/audits", params={"limit": 2}).json()
    assert page["total"] == 3 and len(page["items"]) == 2
    rest = client.get("/audits", params={"limit": 2, "offset": 2}).json()
    assert len(rest["items"]) == 1
    seen_ids = {i["id"] for i in page["items"]} | {i["id"] for i in rest["items"]}
    assert seen_ids == set(ids)
    cancelled = client.get("/audits", params={"status": "cancelled"}).json()
    assert [i["id"] for i in cancelled["items"]] == [ids[0]] and cancelled["total"] == 1
    assert client.get("/audits", params={"status": "weird"}).status_code == 422
    assert client.get("/audits", params={"limit": 0}).status_code == 422


# -- auth ------------------------------------------------------------------------------------
def test_mutating_routes_need_the_api_key(client):
    assert client.post("/audits", json=SMALL_SPEC).status_code == 401
    bad = client.post("/audits", json=SMALL_SPEC, headers={"Authorization": "Bearer wrong"})
    assert bad.status_code == 401 and "invalid API key" in bad.text
    audit_id = submit(client)
    assert client.post(f"/audits/{audit_id}/cancel").status_code == 401
    assert client.delete(f"/audits/{audit_id}").status_code == 401
    assert client.get(f"/audits/{audit_id}").status_code == 200  # reads open by default


def test_no_key_configured_refuses_with_instructions(store):
    with make_client(store, api_keys=()) as c:
        response = c.post("/audits", json=SMALL_SPEC, headers=AUTH)
        assert response.status_code == 503
        assert response.json()["detail"] == NO_KEY_CONFIGURED
        assert "FLAUDIT_API_KEY" in NO_KEY_CONFIGURED
    assert store.count_audits() == 0


def test_reads_can_require_the_key(store):
    with make_client(store, require_key_for_reads=True) as c:
        assert c.get("/audits").status_code == 401
        assert c.get("/audits", headers=AUTH).status_code == 200
        assert c.get("/healthz").status_code == 200


def test_api_key_file_with_several_keys(tmp_path, monkeypatch):
    from flaudit.service.settings import Settings, load_api_keys

    path = tmp_path / "keys"
    path.write_text("# comment\nkey-one\n\n key-two \n")
    assert load_api_keys(key_file=str(path)) == ("key-one", "key-two")
    monkeypatch.setenv("FLAUDIT_API_KEY", "key-zero")
    monkeypatch.setenv("FLAUDIT_API_KEY_FILE", str(path))
    assert Settings.from_env().api_keys == ("key-zero", "key-one", "key-two")
    assert "key-one" not in repr(Settings.from_env())
    with pytest.raises(ValueError, match="key_file"):
        load_api_keys(key_file=str(tmp_path / "missing"))


@pytest.mark.parametrize(
    "variable, value, message",
    [
        ("FLAUDIT_MAX_BODY_BYTES", "64MB", "FLAUDIT_MAX_BODY_BYTES must be an integer"),
        (
            "FLAUDIT_MAX_CONCURRENT_AUDITS",
            "two",
            "FLAUDIT_MAX_CONCURRENT_AUDITS must be an integer",
        ),
        ("FLAUDIT_CANARY_CACHE_BYTES", "1.5", "FLAUDIT_CANARY_CACHE_BYTES must be an integer"),
        ("FLAUDIT_BODY_TIMEOUT_SECONDS", "60s", "FLAUDIT_BODY_TIMEOUT_SECONDS must be a number"),
        ("FLAUDIT_BODY_TIMEOUT_SECONDS", "inf", "FLAUDIT_BODY_TIMEOUT_SECONDS\\) must be a finite"),
        ("FLAUDIT_LEASE_SECONDS", "nan", "FLAUDIT_LEASE_SECONDS\\) must be a finite"),
        (
            "FLAUDIT_TIMEOUT_GRACE_SECONDS",
            "-1",
            "FLAUDIT_TIMEOUT_GRACE_SECONDS\\) must be a finite",
        ),
    ],
)
def test_a_bad_setting_in_the_environment_is_refused_naming_the_variable(
    monkeypatch, variable, value, message
):
    from flaudit.service.settings import Settings

    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=message):
        Settings.from_env()


# -- ingest ----------------------------------------------------------------------------------
def _running(client, store, spec=None):
    audit_id = submit(client, spec)
    headers = start_run(store, audit_id)
    return audit_id, headers


def _snapshot(client, store, audit_id):
    arrays = store.cosine_arrays(audit_id)
    audit = store.get_audit(audit_id)
    return (
        audit.rounds_stored,
        audit.dim,
        audit.has_final,
        len(store.list_rounds(audit_id)),
        None if arrays["max_cosines"] is None else arrays["max_cosines"].tobytes(),
    )


def test_ingest_rejects_malformed_bodies_and_stores_nothing(client, store):
    audit_id, headers = _running(client, store)
    dim = 400
    base = f"/audits/{audit_id}"
    assert (
        client.put(f"{base}/initial-model", content=f32(np.zeros(dim)), headers=headers).status_code
        == 200
    )
    good = np.full(dim, 0.01)
    meta = {"clip_norm": 1.0, "cohort_size": 5, "num_canaries_inserted": 1, "num_failures": 0}
    before = _snapshot(client, store, audit_id)

    cases = []
    # (a complete body that is not finite or of the wrong length ends the audit:
    # tests/service/test_audits_end_promptly.py)
    cases.append(("float64", np.asarray(good, "<f8").tobytes()[: 4 * dim + 2], {}, 413, "limit"))
    cases.append(("not multiple of 4", f32(good)[:-2], {}, 400, "multiple of 4"))
    cases.append(("truncated", f32(good)[:100], {"Content-Length": str(4 * dim)}, 400, "truncated"))
    cases.append(
        ("content type", f32(good), {"Content-Type": "application/json"}, 415, "octet-stream")
    )
    cases.append(("oversized", f32(np.zeros(dim + 1)), {}, 413, "exceeds"))
    cases.append(("empty", b"", {}, 422, "empty"))
    for name, body, extra, code, needle in cases:
        response = client.put(
            f"{base}/rounds/1", params=meta, content=body, headers={**headers, **extra}
        )
        assert response.status_code == code, (name, response.text)
        assert needle in response.json()["detail"], (name, response.text)
    # invalid metadata: 422 naming the field
    response = client.put(
        f"{base}/rounds/1", params={**meta, "clip_norm": -1}, content=f32(good), headers=headers
    )
    assert response.status_code == 422 and any("clip_norm" in loc for loc in _locs(response))
    response = client.put(
        f"{base}/rounds/1",
        params={k: v for k, v in meta.items() if k != "cohort_size"},
        content=f32(good),
        headers=headers,
    )
    assert response.status_code == 422 and any("cohort_size" in loc for loc in _locs(response))
    # wrong token / no token
    wrong = {**headers, "Authorization": "Bearer not-the-token"}
    assert (
        client.put(f"{base}/rounds/1", params=meta, content=f32(good), headers=wrong).status_code
        == 401
    )
    no_auth = {"Content-Type": "application/octet-stream"}
    assert (
        client.put(f"{base}/rounds/1", params=meta, content=f32(good), headers=no_auth).status_code
        == 401
    )
    # the API key is not a run token
    api = {**headers, **AUTH}
    assert (
        client.put(f"{base}/rounds/1", params=meta, content=f32(good), headers=api).status_code
        == 401
    )
    # out of order
    response = client.put(f"{base}/rounds/3", params=meta, content=f32(good), headers=headers)
    assert response.status_code == 409 and "next round must be 1" in response.json()["detail"]
    assert _snapshot(client, store, audit_id) == before
    assert client.get(f"{base}/rounds").json() == {"items": []}


def test_round_before_initial_model_is_409(client, store):
    audit_id, headers = _running(client, store)
    meta = {"clip_norm": 1.0, "cohort_size": 5, "num_canaries_inserted": 1}
    response = client.put(
        f"/audits/{audit_id}/rounds/1", params=meta, content=f32(np.ones(400)), headers=headers
    )
    assert response.status_code == 409 and "initial model" in response.json()["detail"]


def test_ingest_for_queued_audit_is_unauthorized(client):
    audit_id = submit(client)
    headers = {"Authorization": "Bearer anything", "Content-Type": "application/octet-stream"}
    response = client.put(
        f"/audits/{audit_id}/initial-model", content=f32(np.ones(10)), headers=headers
    )
    assert response.status_code == 401


def _ingest_all(client, store, audit_id, headers, seed, spec, dim):
    theta0, deltas, meta = synthetic_run(seed, spec, dim, noise_seed=1)
    base = f"/audits/{audit_id}"
    r = client.put(f"{base}/initial-model", content=f32(theta0), headers=headers)
    assert r.status_code == 200 and r.json()["stored"] is True
    theta = theta0.astype(np.float64)
    for t, (delta, m) in enumerate(zip(deltas, meta), start=1):
        r = client.put(f"{base}/rounds/{t}", params=m, content=f32(delta), headers=headers)
        assert r.status_code == 200 and r.json()["stored"] is True, r.text
        theta += delta
    return theta0, deltas, theta.astype(np.float32)


def test_rounds_are_idempotent(client, store):
    spec = AuditSpec.model_validate(SMALL_SPEC)
    audit_id, headers = _running(client, store)
    seed = store.canary_seed(audit_id)
    theta0, deltas, _ = synthetic_run(seed, spec, 400)
    base = f"/audits/{audit_id}"
    client.put(f"{base}/initial-model", content=f32(theta0), headers=headers)
    again = client.put(f"{base}/initial-model", content=f32(theta0), headers=headers)
    assert again.status_code == 200 and again.json()["stored"] is False
    other = client.put(f"{base}/initial-model", content=f32(theta0 + 1), headers=headers)
    assert other.status_code == 409
    meta = {"clip_norm": 1.0, "cohort_size": 5, "num_canaries_inserted": 0}
    first = client.put(f"{base}/rounds/1", params=meta, content=f32(deltas[0]), headers=headers)
    snap = _snapshot(client, store, audit_id)
    second = client.put(f"{base}/rounds/1", params=meta, content=f32(deltas[1]), headers=headers)
    assert first.json()["stored"] is True and second.status_code == 200
    assert second.json()["stored"] is False
    assert _snapshot(client, store, audit_id) == snap
    assert [r["round"] for r in client.get(f"{base}/rounds").json()["items"]] == [1]


def test_live_state_and_final_estimates_match_the_library(client, store):
    spec = AuditSpec.model_validate(SMALL_SPEC)
    audit_id, headers = _running(client, store)
    seed = store.canary_seed(audit_id)
    dim = 400
    theta0, deltas, theta_t = _ingest_all(client, store, audit_id, headers, seed, spec, dim)

    running = client.get(f"/audits/{audit_id}").json()
    assert running["status"] == "running" and running["dim"] == dim
    assert running["progress"]["round"] == 4 and running["progress"]["fraction"] == 1.0
    kinds = {(e["estimator"], e["threat_model"]) for e in running["estimates"]}
    assert ("two_gaussian", "all_iterates") in kinds and ("analytic", "known_rounds") in kinds
    hist = running["histograms"]["all_iterates"]
    assert "seen" not in hist and "unseen" not in hist and sum(hist["canaries"]) == 20
    cos_running = client.get(f"/audits/{audit_id}/cosines").json()
    assert cos_running["labels_published"] is False
    assert all(item["seen"] is None for item in cos_running["items"])

    # independent route: cosines straight from the canary vectors
    expected_max = np.max(
        [expected_statistics(seed, 20, d, family=spec.canary_family) for d in deltas], axis=0
    )
    got_max = np.array([i["max_cosine"] for i in cos_running["items"]])
    np.testing.assert_allclose(got_max, expected_max, rtol=1e-5, atol=1e-6)
    rounds = client.get(f"/audits/{audit_id}/rounds").json()["items"]
    assert [r["round"] for r in rounds] == [1, 2, 3, 4]
    assert all(r["estimates"] for r in rounds)
    # how many seen canaries went in is withheld while the audit runs (it would count the seen)
    assert all(r["num_canaries_inserted"] is None for r in rounds)

    r = client.put(
        f"/audits/{audit_id}/final-model",
        params={"accuracy": 0.75, "loss": 0.4},
        content=f32(theta_t),
        headers=headers,
    )
    assert r.status_code == 200, r.text
    done = client.get(f"/audits/{audit_id}").json()
    assert done["status"] == "succeeded" and done["finished_at"] is not None
    assert done["metrics"] == {"accuracy": 0.75, "loss": 0.4}
    assert set(done["histograms"]["final_model"]) >= {"bin_edges", "seen", "unseen", "null"}
    cos = client.get(f"/audits/{audit_id}/cosines").json()
    # the routes that return pre-serialized bodies still match their documented schemas
    AuditOut.model_validate(done)
    AuditOut.model_validate(running)
    CosinesOut.model_validate(cos)
    AuditList.model_validate(client.get("/audits").json())
    assert cos["labels_published"] is True
    published = client.get(f"/audits/{audit_id}/rounds").json()["items"]
    assert [r["num_canaries_inserted"] for r in published] == [
        m["num_canaries_inserted"] for m in synthetic_run(seed, spec, dim, noise_seed=1)[2]
    ]
    labels = np.array([i["seen"] for i in cos["items"]])
    np.testing.assert_array_equal(labels, seen_mask(seed, 20))
    final = np.array([i["final_cosine"] for i in cos["items"]])
    diff = (theta_t.astype(np.float64) - theta0.astype(np.float64)).astype(np.float32)
    expected_final = expected_statistics(seed, 20, diff, family=spec.canary_family)
    np.testing.assert_allclose(final, expected_final, rtol=1e-4, atol=1e-5)

    # recompute with the library from the published statistics: same numbers
    recomputed = summarize(
        AuditLook(
            seen=labels,
            dim=cos["dim"],
            delta=cos["delta"],
            max_cosines=np.array([i["max_cosine"] for i in cos["items"]]),
            final_cosines=final,
            threat_models=["final_model", "all_iterates"],
            one_run=True,
            num_rounds=cos["num_rounds"],
            scale_dof=cos["scale_dof"],
        )
    )
    assert cos["scale_dof"] == dim - 20  # orthogonal canaries: the d - k unused coordinates
    service = {
        (e["estimator"], e["threat_model"], e["variance"], e["correction"]): e["epsilon"]
        for e in done["estimates"]
        if e["estimator"] != "analytic"
    }
    for est in recomputed.estimates:
        key = (est.estimator.value, est.threat_model, est.variance.value, est.correction.value)
        value = service[key]
        if math.isinf(est.epsilon):
            assert value == "inf"
        else:
            assert value == pytest.approx(est.epsilon, rel=1e-9, abs=1e-12), key
    csv_text = client.get(f"/audits/{audit_id}/cosines", params={"format": "csv"}).text
    assert (
        csv_text.splitlines()[0].startswith("index,max_cosine") and len(csv_text.splitlines()) == 21
    )

    # nothing more after the final model: the run token is revoked when the audit ends
    again = client.put(f"/audits/{audit_id}/final-model", content=f32(theta_t), headers=headers)
    assert again.status_code == 401
    assert client.get(f"/audits/{audit_id}").json()["finished_at"] == done["finished_at"]

    # the secret never appears
    texts = [
        client.get(p).text
        for p in (
            f"/audits/{audit_id}",
            f"/audits/{audit_id}/rounds",
            f"/audits/{audit_id}/cosines",
            "/audits",
            "/openapi.json",
        )
    ]
    for text in texts:
        assert str(seed) not in text and format(seed, "x") not in text.lower()


# -- per-canary cosines: decoded once per change, not once per page ------------------------------
def _count_decodes(store, monkeypatch) -> list[str]:
    """Record every call of ``store.cosine_arrays`` (the decode of all k canaries' arrays)."""
    calls, real = [], store.cosine_arrays

    def counted(audit_id):
        calls.append(audit_id)
        return real(audit_id)

    monkeypatch.setattr(store, "cosine_arrays", counted)
    return calls


def _page(client, audit_id, offset, limit=7) -> dict:
    response = client.get(f"/audits/{audit_id}/cosines", params={"offset": offset, "limit": limit})
    assert response.status_code == 200, response.text
    return response.json()


def _column(page: dict, name: str) -> list:
    return [item[name] for item in page["items"]]


def test_cosine_pages_decode_the_arrays_once_per_round_and_see_each_new_round(
    client, store, monkeypatch
):
    spec = AuditSpec.model_validate(SMALL_SPEC)
    audit_id, headers = _running(client, store)
    seed = store.canary_seed(audit_id)
    theta0, deltas, meta = synthetic_run(seed, spec, 400, noise_seed=1)
    base = f"/audits/{audit_id}"
    stored_arrays = store.cosine_arrays  # read without counting
    decodes = _count_decodes(store, monkeypatch)
    assert (
        client.put(f"{base}/initial-model", content=f32(theta0), headers=headers).status_code == 200
    )
    assert (
        client.put(
            f"{base}/rounds/1", params=meta[0], content=f32(deltas[0]), headers=headers
        ).status_code
        == 200
    )

    first, second = _page(client, audit_id, 0), _page(client, audit_id, 7)
    assert len(decodes) == 1
    stored = stored_arrays(audit_id)
    assert _column(first, "last_cosine") + _column(second, "last_cosine") == pytest.approx(
        stored["last_cosines"][:14].tolist()
    )
    assert first["num_rounds"] == 1 and not first["labels_published"]
    assert _column(first, "seen") == [None] * 7 and _column(second, "seen") == [None] * 7

    # a new round: the next page decodes again and shows it; the page after does not decode
    assert (
        client.put(
            f"{base}/rounds/2", params=meta[1], content=f32(deltas[1]), headers=headers
        ).status_code
        == 200
    )
    after = _page(client, audit_id, 0)
    assert len(decodes) == 2 and after["num_rounds"] == 2
    _page(client, audit_id, 14)
    csv_text = client.get(f"{base}/cosines", params={"format": "csv"}).text
    assert len(decodes) == 2 and len(csv_text.splitlines()) == 21
    stored = stored_arrays(audit_id)
    assert _column(after, "last_cosine") == pytest.approx(stored["last_cosines"][:7].tolist())
    assert _column(after, "last_cosine") != _column(first, "last_cosine")
    assert (
        _column(after, "seen") == [None] * 7 and "True" not in csv_text and "False" not in csv_text
    )

    # the final model ends the audit: fresh arrays and, now, the labels
    for t in range(3, spec.num_rounds + 1):
        client.put(
            f"{base}/rounds/{t}", params=meta[t - 1], content=f32(deltas[t - 1]), headers=headers
        )
    theta_t = (theta0.astype(np.float64) + np.sum(deltas, axis=0)).astype(np.float32)
    assert (
        client.put(f"{base}/final-model", content=f32(theta_t), headers=headers).status_code == 200
    )
    done = _page(client, audit_id, 7)
    assert len(decodes) == 3 and done["labels_published"] and done["status"] == "succeeded"
    assert _column(done, "seen") == seen_mask(seed, 20)[7:14].tolist()
    assert all(value is not None for value in _column(done, "final_cosine"))
    _page(client, audit_id, 0)
    assert len(decodes) == 3
    for offset in (0, 7, 14):
        text = client.get(f"{base}/cosines", params={"offset": offset, "limit": 7}).text
        assert str(seed) not in text and format(seed, "x") not in text.lower()


def test_cosine_labels_appear_when_the_audit_ends_elsewhere(client, store, monkeypatch):
    """A write this process did not make (another instance cancels the audit) is seen by the
    next page: the decoded arrays are kept per version of the audit's row."""
    audit_id, headers = _running(client, store)
    decodes = _count_decodes(store, monkeypatch)
    running = _page(client, audit_id, 0, limit=20)
    assert _page(client, audit_id, 0, limit=20) == running and len(decodes) == 1
    assert not running["labels_published"] and _column(running, "seen") == [None] * 20
    assert store.finish(audit_id, status="cancelled", reason="elsewhere", only_if=("running",))
    ended = _page(client, audit_id, 0, limit=20)
    assert len(decodes) == 2 and ended["labels_published"] and ended["status"] == "cancelled"
    assert _column(ended, "seen") == seen_mask(store.canary_seed(audit_id), 20).tolist()


def test_deleted_audit_drops_its_cosines(client, store, monkeypatch):
    audit_id, _ = _running(client, store)
    _page(client, audit_id, 0)
    cache = client.app.state.read_cache
    assert cache._cosines.get(audit_id) is not None
    assert client.delete(f"/audits/{audit_id}", headers=AUTH).status_code == 204
    assert audit_id not in cache._cosines
    assert client.get(f"/audits/{audit_id}/cosines").status_code == 404


class _Sized:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


def test_read_cache_keeps_cosines_within_its_byte_budget_and_audit_count():
    from flaudit.service.app import ReadCache

    cache = ReadCache(cosine_bytes=100, cosine_audits=2)
    loads = []

    def get(audit_id, version, nbytes):
        return cache.cosines(audit_id, version, lambda: loads.append(audit_id) or _Sized(nbytes))

    a = get("a", 1, 40)
    assert get("a", 1, 40) is a and loads == ["a"]
    get("b", 1, 40)
    get("a", 1, 40)  # a read last: b is the one to go
    get("c", 1, 40)  # two audits at most
    assert set(cache._cosines) == {"a", "c"} and cache._cosine_bytes_used == 80
    get("d", 1, 70)  # over the byte budget with either: both go
    assert set(cache._cosines) == {"d"} and cache._cosine_bytes_used == 70
    get("e", 1, 101)  # larger than the budget: served, not kept
    assert "e" not in cache._cosines and cache._cosine_bytes_used == 70
    get("d", 2, 70)  # a new version replaces the old one
    assert loads[-1] == "d" and cache._cosine_bytes_used == 70
    cache.invalidate("d", deleted=True)
    get("d", 2, 70)  # a late load must not resurrect a deleted audit
    assert cache._cosines == {} and cache._cosine_bytes_used == 0


def test_read_cache_decodes_once_for_concurrent_readers():
    import threading
    import time

    from flaudit.service.app import ReadCache

    cache = ReadCache()
    loads = []

    def load():
        loads.append(1)
        time.sleep(0.05)
        return _Sized(8)

    results = []
    threads = [
        threading.Thread(target=lambda: results.append(cache.cosines("a", 1, load)))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(loads) == 1 and len(results) == 8 and all(r is results[0] for r in results)


def test_restart_marks_running_audits_failed_with_reason(store):
    spec = AuditSpec.model_validate(SMALL_SPEC)
    with make_client(store) as c:
        audit_id, headers = _running(c, store)
        queued_id = submit(c)
        seed = store.canary_seed(audit_id)
        theta0, deltas, meta = synthetic_run(seed, spec, 400)
        c.put(f"/audits/{audit_id}/initial-model", content=f32(theta0), headers=headers)
        for t in (1, 2):
            c.put(
                f"/audits/{audit_id}/rounds/{t}",
                params=meta[t - 1],
                content=f32(deltas[t - 1]),
                headers=headers,
            )
    with make_client(store) as c:  # a new service process on the same database
        body = c.get(f"/audits/{audit_id}").json()
        assert body["status"] == "failed"
        assert body["reason"] == "service restarted during the run; 2 rounds were stored"
        assert len(c.get(f"/audits/{audit_id}/rounds").json()["items"]) == 2
        assert c.get(f"/audits/{queued_id}").json()["status"] == "queued"
        # the old run's token no longer works
        r = c.put(
            f"/audits/{audit_id}/rounds/3", params=meta[2], content=f32(deltas[2]), headers=headers
        )
        assert r.status_code in (401, 409)


def test_cancel_and_delete(client, store):
    audit_id = submit(client)
    r = client.post(f"/audits/{audit_id}/cancel", headers=AUTH)
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert r.json()["reason"] == "cancelled by the user"
    assert client.post(f"/audits/{audit_id}/cancel", headers=AUTH).status_code == 409
    assert client.delete(f"/audits/{audit_id}", headers=AUTH).status_code == 204
    assert client.get(f"/audits/{audit_id}").status_code == 404


def test_health_and_root_redirect(client):
    assert client.get("/healthz").json()["status"] == "ok"
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["detail"]["database"] == "ok"
    root = client.get("/", follow_redirects=False)
    assert root.status_code in (302, 307) and root.headers["location"] == "/ui/"


def test_eta_counts_round_times_not_the_start_up(client, store):
    """A run whose Flower/Ray start-up took ten minutes, then quick rounds: the ETA follows the
    rounds (the old mean over (last round - start) / t predicted minutes)."""
    import time
    from datetime import timedelta

    from sqlalchemy import update

    from flaudit.service.store import Audit, utcnow

    audit_id, headers = _running(client, store)
    with store.session() as s, s.begin():
        s.execute(
            update(Audit)
            .where(Audit.id == audit_id)
            .values(started_at=utcnow() - timedelta(minutes=10))
        )
    base = f"/audits/{audit_id}"
    assert (
        client.put(f"{base}/initial-model", content=f32(np.zeros(400)), headers=headers).status_code
        == 200
    )
    meta = {"clip_norm": 1.0, "cohort_size": 5, "num_canaries_inserted": 1, "num_failures": 0}
    rng = np.random.default_rng(0)
    etas = []
    for t in (1, 2, 3):
        if t > 1:
            time.sleep(0.2)
        response = client.put(
            f"{base}/rounds/{t}", params=meta, content=f32(rng.normal(size=400)), headers=headers
        )
        assert response.status_code == 200, response.text
        etas.append(client.get(base).json()["progress"]["eta_seconds"])
    assert etas[0] is None  # one round: no interval measured yet
    assert 0.1 < etas[1] < 20 and 0.1 < etas[2] < 10  # 2 and 1 rounds left at ~0.2 s each
    listed = client.get("/audits").json()["items"][0]["progress"]
    assert listed["round"] == 3 and listed["eta_seconds"] is None


def test_progress_says_what_the_run_waits_for_and_a_stall_raises_the_eta(client, store):
    """Issue #40: a demo sat at "round 4 of 10" for a minute with an ETA of 2 s (rounds 1-4 had
    arrived within a second). The page now says it waits for round 5's updates, for how long,
    beside the earlier rounds' pace, and the ETA counts the wait."""
    from datetime import timedelta

    from sqlalchemy import update

    from flaudit.service.store import AuditRound, utcnow

    audit_id, headers = _running(client, store, {**SMALL_SPEC, "num_rounds": 10})
    base = f"/audits/{audit_id}"
    progress = client.get(base).json()["progress"]
    assert progress["waiting_for"].startswith("starting Flower and Ray, then round 1 (")
    assert progress["eta_seconds"] is None
    assert (
        client.put(f"{base}/initial-model", content=f32(np.zeros(400)), headers=headers).status_code
        == 200
    )
    meta = {"clip_norm": 1.0, "cohort_size": 5, "num_canaries_inserted": 1, "num_failures": 0}
    rng = np.random.default_rng(0)
    for t in (1, 2, 3):
        response = client.put(
            f"{base}/rounds/{t}", params=meta, content=f32(rng.normal(size=400)), headers=headers
        )
        assert response.status_code == 200, response.text
    quick = client.get(base).json()["progress"]
    assert quick["waiting_for"].startswith("waiting for round 4's updates (")
    assert "this one is slower" not in quick["waiting_for"]
    # the three rounds arrived 0.1 s apart; round 4 has not come in the 45 s since
    last = utcnow() - timedelta(seconds=45)
    with store.session() as s, s.begin():
        for t in (1, 2, 3):
            s.execute(
                update(AuditRound)
                .where(AuditRound.audit_id == audit_id, AuditRound.round == t)
                .values(received_at=last - timedelta(seconds=0.1 * (3 - t)))
            )
    client.app.state.read_cache.invalidate(audit_id)
    stalled = client.get(base).json()["progress"]
    assert stalled["round"] == 3 and stalled["num_rounds"] == 10
    assert re.fullmatch(
        r"waiting for round 4's updates \((45|46) s so far; rounds 1-3 came 0\.1 s apart: this "
        r"one is slower\)",
        stalled["waiting_for"],
    ), stalled["waiting_for"]
    # round 4 and six more to come, each at least the average since round 1 counting the wait
    # (45.2 s / 3): the median alone (0.1 s) said under a second
    assert 6 * 15 < stalled["eta_seconds"] < 6 * 16, stalled


def test_final_model_estimate_is_live_every_round_on_theta_t_minus_theta_0(client, store):
    """After each round the final-model estimates are computed on cos(c_j, theta_t - theta_0),
    labelled "so far", with the same estimator as at the end; the final model replaces them."""
    from flaudit.auditor.estimators import final_model_estimates

    spec = AuditSpec.model_validate(SMALL_SPEC)
    audit_id, headers = _running(client, store)
    seed = store.canary_seed(audit_id)
    dim = 400
    theta0, deltas, meta = synthetic_run(seed, spec, dim)
    base = f"/audits/{audit_id}"
    assert (
        client.put(f"{base}/initial-model", content=f32(theta0), headers=headers).status_code == 200
    )
    seen = seen_mask(seed, spec.num_canaries)
    for t, (delta, m) in enumerate(zip(deltas, meta), start=1):
        params = {k: v for k, v in m.items() if v is not None}
        assert (
            client.put(
                f"{base}/rounds/{t}", params=params, content=f32(delta), headers=headers
            ).status_code
            == 200
        )
        body = client.get(base).json()
        so_far = [
            e
            for e in body["estimates"]
            if e["estimator"] == "two_gaussian" and e["threat_model"] == "final_model"
        ]
        assert len(so_far) == 2, body["estimates"]
        assert all(e["details"]["so_far"] is True and e["details"]["round"] == t for e in so_far)
        assert all(e["method"].startswith(f"so far (round {t} of 4") for e in so_far)
        # independent route: the statistic straight from the canary vectors and the summed deltas
        change = np.sum([d.astype(np.float64) for d in deltas[:t]], axis=0).astype(np.float32)
        expected = final_model_estimates(
            expected_statistics(seed, 20, change, family=spec.canary_family)[seen], dim, spec.delta
        )
        for got, want in zip(so_far, expected):
            assert got["variance"] == want.variance.value
            assert got["epsilon"] == pytest.approx(want.epsilon, rel=1e-4, abs=1e-6)
    theta_t = theta0 + np.sum(deltas, axis=0)
    assert (
        client.put(f"{base}/final-model", content=f32(theta_t), headers=headers).status_code == 200
    )
    final = [
        e
        for e in client.get(base).json()["estimates"]
        if e["estimator"] == "two_gaussian" and e["threat_model"] == "final_model"
    ]
    assert len(final) == 2 and not any(e["details"].get("so_far") for e in final)
