"""Replicas on one database (issue #41): an external audit is held under the owner lease by the
replica that serves its run's requests; a request that lands on another replica is served from
the database and moves the lease, the change named on the audit; a replica takes over, in the
background, audits whose owner stopped renewing. SQLite and PostgreSQL, two apps in-process
(the process-level test with a proxy and a killed replica: scripts/replicas-e2e.sh)."""

from __future__ import annotations

import numpy as np

from .conftest import AUTH, make_client
from .test_external import CLAIM, DIM, EXTERNAL, _put


def _round(client, audit_id, token, t):
    served = client.get(f"/audits/{audit_id}/rounds/{t}/canaries", headers=token)
    assert served.status_code == 200, served.text
    count = int(served.headers["X-Canary-Count"])
    canaries = np.frombuffer(served.content, "<f4").reshape(count, DIM)
    delta = np.random.default_rng(t).standard_normal(DIM) * 0.01 + canaries.sum(axis=0) * 0.5
    return _put(
        client,
        f"/audits/{audit_id}/rounds/{t}",
        delta,
        token,
        clip_norm=0.5,
        cohort_size=8,
        num_failures=0,
        num_canaries_inserted=count,
    )


def test_the_lease_follows_the_run_and_a_takeover_is_named(store):
    with (
        make_client(store, instance_id="replica-a") as a,
        make_client(store, instance_id="replica-b") as b,
    ):
        created = a.post("/audits", json=EXTERNAL, headers=AUTH).json()
        audit_id = created["id"]
        token = {"Authorization": f"Bearer {created['environment']['FLAUDIT_RUN_TOKEN']}"}
        assert a.put(f"/audits/{audit_id}/claim", json=CLAIM, headers=token).status_code == 200
        assert _put(a, f"/audits/{audit_id}/initial-model", np.zeros(DIM), token).status_code == 200
        for t in (1, 2):
            assert _round(a, audit_id, token, t).json()["stored"] is True
        held = store.get_audit(audit_id)
        assert held.owner_id == "replica-a" and held.owner_heartbeat_at is not None
        assert held.owner_changes is None and a.app.state.ownership.held() == [audit_id]

        # the proxy now sends the run to replica b: served from the database, the lease moves
        ack = _round(b, audit_id, token, 3)
        assert ack.status_code == 200 and ack.json()["stored"] is True
        assert _round(b, audit_id, token, 3).json()["stored"] is False  # a retry: no-op
        audit = store.get_audit(audit_id)
        assert audit.owner_id == "replica-b" and audit.rounds_stored == 3
        (change,) = audit.owner_changes
        assert change["from"] == "replica-a" and change["to"] == "replica-b"
        assert change["after_round"] == 2 and change["count"] == 1
        assert "lease was live" in change["why"]
        view = b.get(f"/audits/{audit_id}").json()
        assert view["owner"] == "replica-b" and view["owner_changes"] == [change]
        (alert,) = [x for x in view["alerts"] if "took this audit over" in x["message"]]
        assert alert["level"] == "info" and "after round 2" in alert["message"]
        assert "No acknowledged round is lost" in alert["message"]

        # replica a learns at its next heartbeat that b holds it, and forgets its live state
        assert store.heartbeat("replica-a", [audit_id]) == [audit_id]
        assert a.app.state.ownership.lost(audit_id)
        assert a.app.state.ownership.held() == []

        # a third replica takes it over in the background only once b's lease expired
        assert store.adopt_external("replica-c", lease_seconds=30) == []
        assert store.adopt_external("replica-c", lease_seconds=0) == [audit_id]
        audit = store.get_audit(audit_id)
        assert audit.owner_id == "replica-c"
        assert "expired" in audit.owner_changes[-1]["why"]
        assert audit.owner_changes[-1]["count"] == 2

        # the run's last requests reach b again: it takes the audit back and ends it
        assert _round(b, audit_id, token, 4).json()["stored"] is True
        final = _put(b, f"/audits/{audit_id}/final-model", np.ones(DIM), token)
        assert final.status_code == 200 and final.json()["stored"] is True
        view = a.get(f"/audits/{audit_id}").json()
        assert view["status"] == "succeeded" and view["owner"] is None
        assert [c["to"] for c in view["owner_changes"]] == ["replica-b", "replica-c", "replica-b"]
        rounds = [r["round"] for r in a.get(f"/audits/{audit_id}/rounds").json()["items"]]
        assert rounds == [1, 2, 3, 4]
