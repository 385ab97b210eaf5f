"""Audits of a run flaudit does not start (``engine = "external"``): the ServerApp attaches with
a run token, declares its claim, fetches each round's canary vectors; the seed never leaves."""

from __future__ import annotations

import numpy as np
import pytest

from flaudit.auditor.canaries import canary_vectors, resolve_canary_family, seen_mask
from flaudit.auditor.schedules import participation_schedule
from flaudit.auditor.spec import AuditSpec
from flaudit.service.external import round_canaries

from .conftest import AUTH, make_client

EXTERNAL = {
    "name": "byo",
    "engine": "external",
    "num_canaries": 16,
    "canary_repeats": 2,
    "max_canary_fraction": 1.0,
    "delta": 1e-5,
}
CLAIM = {
    "noise_multiplier": 0.0,
    "clip_norm": 0.5,
    "num_rounds": 4,
    "num_clients": 8,
    "clients_per_round": 8,
    "strategy": "DifferentialPrivacyServerSideFixedClipping > FedAvg",
}
DIM = 300


def _create(client):
    response = client.post("/audits", json=EXTERNAL, headers=AUTH)
    assert response.status_code == 201, response.text
    body = response.json()
    env = body["environment"]
    assert set(env) == {"FLAUDIT_AUDIT_ID", "FLAUDIT_URL", "FLAUDIT_RUN_TOKEN"}
    assert body["status"] == "running" and env["FLAUDIT_AUDIT_ID"] == body["id"]
    return body["id"], {"Authorization": f"Bearer {env['FLAUDIT_RUN_TOKEN']}"}


def _put(client, path, vector, token, **params):
    return client.put(
        path,
        content=np.asarray(vector, "<f4").tobytes(),
        params=params,
        headers={**token, "Content-Type": "application/octet-stream"},
    )


def test_external_audit_end_to_end_without_the_seed_leaving_the_service(client, store):
    audit_id, token = _create(client)
    seed = store.canary_seed(audit_id)
    secret_forms = {str(seed), hex(seed), format(seed, "x")}
    waiting = client.get(f"/audits/{audit_id}").json()
    assert waiting["started_at"] is None and "waiting for the ServerApp" in str(waiting["alerts"])
    # nothing before the claim
    assert (
        _put(client, f"/audits/{audit_id}/initial-model", np.zeros(DIM), token).status_code == 409
    )
    bad = client.put(f"/audits/{audit_id}/claim", json={**CLAIM, "clip_norm": -1}, headers=token)
    assert bad.status_code == 422 and "clip_norm" in bad.text
    # (a claim the federation cannot satisfy ends the audit: tests/service/test_sizing.py)
    assert client.get(f"/audits/{audit_id}").json()["started_at"] is None  # nothing stored
    ack = client.put(f"/audits/{audit_id}/claim", json=CLAIM, headers=token)
    assert ack.status_code == 200 and ack.json()["stored"] is True
    assert (
        client.put(f"/audits/{audit_id}/claim", json=CLAIM, headers=token).json()["stored"] is False
    )
    other = client.put(
        f"/audits/{audit_id}/claim", json={**CLAIM, "noise_multiplier": 2.0}, headers=token
    )
    assert other.status_code == 409
    spec = AuditSpec.model_validate(client.get(f"/audits/{audit_id}").json()["spec"])
    assert spec.noise_multiplier == 0.0 and spec.clip_norm == 0.5 and spec.num_rounds == 4

    rng = np.random.default_rng(1)
    theta0 = rng.standard_normal(DIM).astype(np.float32)
    assert _put(client, f"/audits/{audit_id}/initial-model", theta0, token).status_code == 200
    analytic = [
        e
        for e in client.get(f"/audits/{audit_id}").json()["estimates"]
        if e["estimator"] == "analytic"
    ]
    assert analytic and all(e["epsilon"] == "inf" for e in analytic)  # the claim: no noise

    seen = seen_mask(seed, 16)
    schedule = participation_schedule(
        num_clients=8,
        num_seen_canaries=int(seen.sum()),
        num_rounds=4,
        participation="uniform",
        clients_per_round=8,
        canary_repeats=2,
        seed=spec.data_seed,
        max_canaries_per_round=8,
    )
    theta, total = theta0.astype(np.float64), np.zeros(DIM)
    for t in range(1, 5):
        response = client.get(f"/audits/{audit_id}/rounds/{t}/canaries", headers=token)
        assert response.status_code == 200
        count = int(response.headers["X-Canary-Count"])
        block = np.frombuffer(response.content, "<f4").reshape(count, DIM)
        expected = np.flatnonzero(seen)[schedule.canaries(t)]  # the built-in rule
        assert sorted(round_canaries(seed, spec, t).tolist()) == sorted(expected.tolist())
        family = resolve_canary_family(spec.canary_family, num_canaries=16, dim=DIM)
        np.testing.assert_array_equal(
            block, canary_vectors(seed, np.sort(expected), DIM, family=family)
        )
        delta = 0.5 * block.sum(axis=0) / (3 + count) + 0.001 * rng.standard_normal(DIM)
        meta = {"clip_norm": 0.5, "cohort_size": 3 + count, "num_failures": 0}
        wrong = _put(
            client,
            f"/audits/{audit_id}/rounds/{t}",
            delta,
            token,
            num_canaries_inserted=count + 1,
            **meta,
        )
        assert wrong.status_code == 422 and "num_canaries_inserted" in wrong.text
        ok = _put(
            client,
            f"/audits/{audit_id}/rounds/{t}",
            delta,
            token,
            num_canaries_inserted=count,
            **meta,
        )
        assert ok.status_code == 200, ok.text
        theta += delta
        total += delta
        for form in secret_forms:
            assert form not in response.headers.get("X-Canary-Count", "")
    final = _put(client, f"/audits/{audit_id}/final-model", theta, token, accuracy=0.5, loss=1.2)
    assert final.status_code == 200
    audit = client.get(f"/audits/{audit_id}").json()
    assert audit["status"] == "succeeded" and audit["metrics"] == {"accuracy": 0.5, "loss": 1.2}
    two_gaussian = [e for e in audit["estimates"] if e["estimator"] == "two_gaussian"]
    assert two_gaussian
    for path in (
        f"/audits/{audit_id}",
        f"/audits/{audit_id}/rounds",
        f"/audits/{audit_id}/cosines",
    ):
        text = client.get(path).text
        assert not any(form in text for form in secret_forms)
    # ended: the run token is revoked, so no canaries are served and nothing more is stored
    assert client.get(f"/audits/{audit_id}/rounds/1/canaries", headers=token).status_code == 401
    assert _put(client, f"/audits/{audit_id}/final-model", theta, token).status_code == 401


def test_a_leaked_run_token_is_rotated_with_the_api_key(client, store):
    audit_id, old = _create(client)
    assert client.post(f"/audits/{audit_id}/run-token").status_code == 401  # needs the API key
    response = client.post(f"/audits/{audit_id}/run-token", headers=AUTH)
    assert response.status_code == 200
    new = {"Authorization": f"Bearer {response.json()['environment']['FLAUDIT_RUN_TOKEN']}"}
    assert client.put(f"/audits/{audit_id}/claim", json=CLAIM, headers=old).status_code == 401
    assert client.put(f"/audits/{audit_id}/claim", json=CLAIM, headers=new).status_code == 200
    text = client.get(f"/audits/{audit_id}").text + response.text
    assert str(store.canary_seed(audit_id)) not in text


def test_built_in_audits_take_no_claim_and_serve_no_canaries(client, store):
    from .conftest import SMALL_SPEC

    audit_id = client.post("/audits", json=SMALL_SPEC, headers=AUTH).json()["id"]
    store.mark_running(audit_id, run_token="tok")
    token = {"Authorization": "Bearer tok"}
    assert client.put(f"/audits/{audit_id}/claim", json=CLAIM, headers=token).status_code == 409
    assert client.post(f"/audits/{audit_id}/run-token", headers=AUTH).status_code == 409


def test_external_audits_survive_a_service_restart(store):
    with make_client(store) as client:
        audit_id, token = _create(client)
        client.put(f"/audits/{audit_id}/claim", json=CLAIM, headers=token)
    assert audit_id not in store.fail_interrupted()
    with make_client(store) as client:
        assert client.get(f"/audits/{audit_id}").json()["status"] == "running"
        assert (
            _put(client, f"/audits/{audit_id}/initial-model", np.ones(DIM), token).status_code
            == 200
        )


@pytest.mark.parametrize("t", [0, 5])
def test_canaries_outside_the_run_are_refused(client, t):
    audit_id, token = _create(client)
    client.put(f"/audits/{audit_id}/claim", json=CLAIM, headers=token)
    _put(client, f"/audits/{audit_id}/initial-model", np.ones(DIM), token)
    assert client.get(f"/audits/{audit_id}/rounds/{t}/canaries", headers=token).status_code == 422
