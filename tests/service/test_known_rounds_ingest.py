"""Round participants in the ingest body, the known-rounds state stored with each round, the
alarm guarantee and "no DP claim" fields, and bug injection behind the operator's flag."""

from __future__ import annotations

import numpy as np
import pytest

from flaudit.auditor.canaries import canary_vectors, seen_mask
from flaudit.auditor.claims.known_rounds import KnownRoundsStatistic
from flaudit.server.http_reporter import HttpRoundReporter
from flaudit.server.reporting import RoundMetadata
from flaudit.service.live import LiveAudits
from flaudit.service.schemas import AuditOut
from tests.canary_reference import expected_statistics

from .conftest import AUTH, SMALL_SPEC, f32, make_client, start_run, submit

DIM, K, T = 400, 20, 4
META = {"clip_norm": 1.0, "cohort_size": 5, "num_canaries_inserted": 1}


def _i32(values) -> bytes:
    return np.asarray(values, dtype="<i4").tobytes()


def _run(seed: int):
    """A Gaussian-mechanism run: each canary (seen or not) has one round; seen ones are added."""
    rng = np.random.default_rng(5)
    seen = seen_mask(seed, K)
    canaries = canary_vectors(seed, np.arange(K), DIM, family="orthogonal").astype(np.float64)
    round_of = rng.integers(0, T, size=K)
    updates, participants = [], []
    for t in range(T):
        inside = round_of == t
        total = canaries[inside & seen].sum(axis=0) + rng.normal(scale=0.5, size=DIM)
        updates.append((total / 5).astype(np.float32))
        participants.append(np.flatnonzero(inside))
    return rng.normal(size=DIM).astype(np.float32), updates, participants, canaries, seen


def _expected_state(updates, participants, canaries, seen, upto, seed):
    """The statistic from the orthogonal family's null-standardized cosines, computed here
    independently of the service's code (tests/canary_reference.py: scipy's Student-t and Beta
    laws; the normal scores are not scale-free, so plain cosines would differ by ~4%)."""
    statistic = KnownRoundsStatistic(K, dim=DIM, scale_dof=DIM - K)
    for update, part in zip(updates[:upto], participants[:upto]):
        mask = np.zeros(K, dtype=bool)
        mask[part] = True
        cos = expected_statistics(seed, K, update, family="orthogonal", vectors=canaries)
        statistic.update(cos, mask, ~seen)
    return statistic.state()


def _assert_same_state(state, want):
    np.testing.assert_allclose(state.sums, want.sums, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(state.counts, want.counts)
    # the exact claim test's per-round sums of the seen participants' studentized values
    np.testing.assert_allclose(state.round_sums, want.round_sums, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(state.round_counts, want.round_counts)


def _put_round(client, audit_id, t, update, part, headers, **meta):
    params = {**META, "num_participants": len(part), **meta}
    return client.put(
        f"/audits/{audit_id}/rounds/{t}",
        params=params,
        content=f32(update) + _i32(part),
        headers=headers,
    )


def test_known_rounds_state_is_stored_with_each_round_and_resumes_in_a_new_instance(client, store):
    audit_id = submit(client)
    headers = start_run(store, audit_id)
    seed = store.canary_seed(audit_id)
    theta0, updates, participants, canaries, seen = _run(seed)
    assert (
        client.put(
            f"/audits/{audit_id}/initial-model", content=f32(theta0), headers=headers
        ).status_code
        == 200
    )
    for t in (1, 2):
        r = _put_round(client, audit_id, t, updates[t - 1], participants[t - 1], headers)
        assert r.status_code == 200, r.text
        # durable before the 2xx: the stored state is the statistic over rounds 1..t
        state = store.load_secret_state(audit_id).known_rounds
        want = _expected_state(updates, participants, canaries, seen, t, seed)
        _assert_same_state(state, want)
        assert state.num_rounds == t

    # a fresh LiveAudits (another process, empty caches) continues from the stored state
    fresh = LiveAudits(store)
    for t in (3, 4):
        mask = np.asarray(participants[t - 1], dtype=np.int64)
        assert (
            fresh.ingest_round(audit_id, t, updates[t - 1], dict(META, num_failures=0), mask)
            == "stored"
        )
    state = store.load_secret_state(audit_id).known_rounds
    want = _expected_state(updates, participants, canaries, seen, T, seed)
    _assert_same_state(state, want)
    assert len(state.round_sums) == int(np.sum([np.any(seen[p]) for p in participants]))
    np.testing.assert_array_equal(state.counts, np.ones(K))  # every canary had its one round

    # participants are stored (secret) and never served
    with store.session() as s:
        from flaudit.service.store import AuditRound

        rows = s.query(AuditRound).filter_by(audit_id=audit_id).order_by(AuditRound.round).all()
        assert [np.frombuffer(r.participants, "<i4").tolist() for r in rows] == [
            p.tolist() for p in participants
        ]
    for path in ("", "/rounds", "/cosines"):
        assert "participants" not in client.get(f"/audits/{audit_id}{path}").text


def test_participants_are_validated_naming_the_field_and_nothing_is_stored(client, store):
    audit_id = submit(client)
    headers = start_run(store, audit_id)
    client.put(f"/audits/{audit_id}/initial-model", content=f32(np.ones(DIM)), headers=headers)
    update = np.ones(DIM)
    for part, words in (([-1, 2], "negative"), ([3, K], "out of range"), ([4, 4], "twice")):
        r = _put_round(client, audit_id, 1, update, part, headers)
        assert r.status_code == 422 and "participants" in r.text and words in r.text, r.text
    r = _put_round(client, audit_id, 1, update, list(range(K + 1)), headers)
    assert r.status_code == 422 and "num_participants" in r.text
    r = client.put(
        f"/audits/{audit_id}/rounds/1",
        params={**META, "num_participants": -1},
        content=f32(update),
        headers=headers,
    )
    assert r.status_code == 422 and "num_participants" in r.text
    assert store.get_audit(audit_id).rounds_stored == 0
    assert store.load_secret_state(audit_id).known_rounds is None

    # an audit reports participants on every round or on none
    assert _put_round(client, audit_id, 1, update, [0, 5], headers).status_code == 200
    r = client.put(
        f"/audits/{audit_id}/rounds/2", params=META, content=f32(update), headers=headers
    )
    assert r.status_code == 409 and "participants" in r.text
    assert store.get_audit(audit_id).rounds_stored == 1
    # a body missing indices its query announces (2 for num_participants=3) is a malformed
    # request: 422 naming the field, nothing stored, the audit goes on (docs/api.md; issue #40)
    r = _put_round(client, audit_id, 2, update, [1, 2], headers, num_participants=3)
    assert r.status_code == 422 and "num_participants" in r.json()["detail"], r.text
    assert "num_participants=3" in r.text
    assert store.get_audit(audit_id).status == "running"
    assert store.get_audit(audit_id).rounds_stored == 1
    assert _put_round(client, audit_id, 2, update, [1, 2], headers).status_code == 200
    assert store.get_audit(audit_id).rounds_stored == 2
    # an update shorter than d with participants cannot be audited: it still ends the audit
    r = _put_round(client, audit_id, 3, update[:-3], [1, 2], headers)  # 4(d - 1) bytes
    assert r.status_code == 422 and store.get_audit(audit_id).status == "failed"


def test_http_reporter_sends_the_released_update_with_its_participants(client, store):
    audit_id = submit(client)
    token = start_run(store, audit_id)["Authorization"].split()[1]
    reporter = HttpRoundReporter("http://testserver", audit_id, token, client=client)
    assert "participants" not in repr(RoundMetadata(1.0, 5, 1, 0, 0.0, 0.5, participants=(3, 1)))
    reporter.report_initial(np.zeros(DIM, dtype=np.float32))
    reporter.report_round(
        1,
        np.ones(DIM, dtype=np.float32),
        RoundMetadata(1.0, 5, 1, 0, 0.0, 0.5, participants=(1, 3, 7)),
    )
    state = store.load_secret_state(audit_id).known_rounds
    assert state.counts.tolist() == [0, 1, 0, 1, 0, 0, 0, 1] + [0] * (K - 8)
    row = client.get(f"/audits/{audit_id}/rounds").json()["items"][0]
    assert row["update_norm"] == pytest.approx(np.sqrt(DIM)) and row["weight_factor"] is None
    # a weighted FedAvg's round: the wrapper's weight factor travels with the round
    reporter.report_round(
        2,
        np.ones(DIM, dtype=np.float32),
        RoundMetadata(1.0, 5, 1, 0, 0.0, 0.5, participants=(2,), weight_factor=2.5),
    )
    rows = client.get(f"/audits/{audit_id}/rounds").json()["items"]
    assert [r["weight_factor"] for r in rows] == [None, 2.5]
    assert client.get(f"/audits/{audit_id}").json()["max_weight_factor"] == 2.5


def test_audit_states_its_alarm_guarantee_and_says_no_dp_claim_without_noise(client, store):
    audit_id = submit(client)
    body = client.get(f"/audits/{audit_id}").json()
    AuditOut.model_validate(body)
    assert "at most 5% over all 5 looks" in body["alarm_guarantee"] and body["bug_injected"] is None

    no_noise = submit(client, {**SMALL_SPEC, "noise_multiplier": 0.0})
    headers = start_run(store, no_noise)
    client.put(f"/audits/{no_noise}/initial-model", content=f32(np.ones(DIM)), headers=headers)
    body = client.get(f"/audits/{no_noise}").json()
    assert body["alarm_guarantee"].startswith("No DP claim")
    assert any(a["level"] == "info" and "No DP claim" in a["message"] for a in body["alerts"])
    schema = client.get("/openapi.json").json()["components"]["schemas"]["AuditOut"]
    assert schema["properties"]["alarm_guarantee"]["description"]


def test_bug_injection_needs_the_operators_flag(store):
    spec = {**SMALL_SPEC, "inject_bug": {"kind": "noise_scale", "factor": 0.5}}
    with make_client(store) as c:
        r = c.post("/audits", json=spec, headers=AUTH)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "inject_bug"]
        assert "FLAUDIT_ALLOW_BUG_INJECTION" in r.text
        assert c.get("/audits").json()["total"] == 0
    with make_client(store, allow_bug_injection=True) as c:
        r = c.post("/audits", json={**spec, "inject_bug": {"kind": "cohort_larger"}}, headers=AUTH)
        assert r.status_code == 422 and "inject_bug" in r.text
        audit_id = submit(c, spec)
        body = c.get(f"/audits/{audit_id}").json()
        assert body["bug_injected"].startswith("bug injected: noise_scale=0.5")
        # the claim stays honest: the spec's noise multiplier is the one the analytic epsilon uses
        assert body["spec"]["noise_multiplier"] == SMALL_SPEC["noise_multiplier"]


def test_external_audits_get_participants_from_the_service_schedule():
    from flaudit.auditor.spec import AuditSpec
    from flaudit.service.external import round_canaries, round_participants

    spec = AuditSpec.model_validate({**SMALL_SPEC, "num_rounds": 6, "canary_repeats": 2})
    seed = 0x5EED_1234_ABCD
    seen = seen_mask(seed, K)
    counts = np.zeros(K, dtype=int)
    for t in range(1, 7):
        part = round_participants(seed, spec, t)
        assert np.array_equal(part, np.unique(part))
        assert np.array_equal(part[seen[part]], round_canaries(seed, spec, t))
        counts[part] += 1
    assert np.all(counts == 2)  # seen and unseen canaries alike: canary_repeats rounds each
