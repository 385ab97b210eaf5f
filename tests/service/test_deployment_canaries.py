"""Deployment audits hold no seed on the SuperLink (issue #29): the built-in ServerApp fetches
each round's canary sum from the service (``GET .../canary-sum``), and the service derives the
round's participants itself. Both must be what the simulation, with the seed in memory, does."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

from flaudit.auditor.canaries import seen_mask
from flaudit.auditor.spec import AuditSpec
from flaudit.server.app import AuditRuntime, run_audit
from flaudit.server.canary_sums import ServiceCanarySums
from flaudit.server.http_reporter import HttpRoundReporter
from flaudit.server.local import LocalCanaries
from flaudit.server.reporting import LocalRoundReporter
from flaudit.service.store import AuditRound

from .conftest import f32, make_client, start_run

SEED = 0x5EED_2929_0BAD_F00D_1234_5678_9ABC_DEF1
DIM = 400
SPEC = dict(
    name="dep",
    engine="deployment",
    superlink_address="superlink:9093",
    task="synthetic",
    task_options={"dim": DIM},
    num_rounds=4,
    num_clients=50,
    clients_per_round=2,
    num_canaries=20,
    canary_repeats=2,
    noise_multiplier=0.5,
    clip_norm=1.0,
    delta=1e-5,
)
META = {"clip_norm": 1.0, "cohort_size": 5, "num_failures": 0}


def _audit(store, **overrides):
    """A running audit created with a known seed, as the runner leaves it: (id, headers, spec)."""
    spec = AuditSpec(**{**SPEC, **overrides})
    audit = store.create_audit(name=spec.name, spec=spec.model_dump(mode="json"), canary_seed=SEED)
    return audit.id, start_run(store, audit.id), spec


def _as_simulation(spec: AuditSpec) -> AuditSpec:
    return AuditSpec.model_validate(
        {**spec.model_dump(mode="json"), "engine": "simulation", "superlink_address": None}
    )


def _participants(store, audit_id):
    with store.session() as s:
        rows = s.query(AuditRound).filter_by(audit_id=audit_id).order_by(AuditRound.round).all()
        return [
            None if r.participants is None else np.frombuffer(r.participants, "<i4").tolist()
            for r in rows
        ]


@pytest.mark.parametrize("bug", [None, {"kind": "extra_participation", "factor": 2}])
def test_the_canary_sum_route_serves_a_deployment_audit_the_simulations_sums(client, store, bug):
    audit_id, headers, spec = _audit(store, inject_bug=bug)
    path = f"/audits/{audit_id}/rounds/{{t}}/canary-sum"
    assert client.get(path.format(t=1), headers=headers).status_code == 409  # no d yet
    assert (
        client.put(
            f"/audits/{audit_id}/initial-model", content=f32(np.zeros(DIM)), headers=headers
        ).status_code
        == 200
    )
    local = LocalCanaries.for_audit(SEED, _as_simulation(spec))  # what the simulation inserts
    counts = []
    for t in range(1, spec.num_rounds + 1):
        response = client.get(path.format(t=t), headers=headers)
        assert response.status_code == 200, response.text
        assert int(response.headers["X-Canary-Dim"]) == DIM
        total = np.frombuffer(response.content, "<f4")
        want, count = local.round_sum(t, DIM)
        assert int(response.headers["X-Canary-Count"]) == count
        np.testing.assert_allclose(total, want, rtol=0, atol=1e-6)  # float32 on the wire
        counts.append(count)
        assert str(SEED) not in response.text and hex(SEED) not in str(response.headers)
    # the built-in rule: uncapped (an external run's canaries take cohort slots: at most 2)
    assert max(counts) > spec.clients_per_round
    assert sum(counts) == spec.canary_repeats * (2 if bug else 1) * local.num_seen
    assert client.get(path.format(t=5), headers=headers).status_code == 422
    # the unit vectors stay an external run's; a simulation audit gets no canaries at all
    assert client.get(f"/audits/{audit_id}/rounds/1/canaries", headers=headers).status_code == 409
    sim_id, sim_headers, _ = _audit(store, engine="simulation", superlink_address=None)
    client.put(f"/audits/{sim_id}/initial-model", content=f32(np.zeros(DIM)), headers=sim_headers)
    refused = client.get(f"/audits/{sim_id}/rounds/1/canary-sum", headers=sim_headers)
    assert refused.status_code == 409 and "deployment" in refused.text


def test_a_deployment_audits_participants_are_derived_by_the_service(client, store):
    """Rounds sent without participants get the simulation's participants, and the known-rounds
    statistic is what the simulation's ServerApp, sending them, gets."""
    dep_id, dep_headers, spec = _audit(store)
    sim_id, sim_headers, sim_spec = _audit(store, engine="simulation", superlink_address=None)
    local = LocalCanaries.for_audit(SEED, sim_spec)
    rng = np.random.default_rng(3)
    theta0 = rng.standard_normal(DIM).astype(np.float32)
    for audit_id, headers in ((dep_id, dep_headers), (sim_id, sim_headers)):
        assert (
            client.put(
                f"/audits/{audit_id}/initial-model", content=f32(theta0), headers=headers
            ).status_code
            == 200
        )
    want = []
    for t in range(1, spec.num_rounds + 1):
        total, count = local.round_sum(t, DIM)
        missing = t == 2  # a round that trained without its canaries (service unreachable)
        update = ((0 if missing else total) + 0.05 * rng.standard_normal(DIM)) / 5
        meta = dict(META, num_canaries_inserted=0 if missing else count)
        if missing:
            meta["canaries_missing"] = "service unreachable"
        part = [] if missing else local.participants(t).tolist()
        want.append(part)
        r = client.put(
            f"/audits/{dep_id}/rounds/{t}", params=meta, content=f32(update), headers=dep_headers
        )
        assert r.status_code == 200, r.text
        sim_body = f32(update) + np.asarray(part, "<i4").tobytes()
        sim_meta = meta if missing else dict(meta, num_participants=len(part))
        r = client.put(
            f"/audits/{sim_id}/rounds/{t}", params=sim_meta, content=sim_body, headers=sim_headers
        )
        assert r.status_code == 200, r.text
    assert _participants(store, dep_id) == want == _participants(store, sim_id)
    derived = store.load_secret_state(dep_id).known_rounds
    sent = store.load_secret_state(sim_id).known_rounds
    assert derived is not None and derived.num_rounds == spec.num_rounds
    np.testing.assert_array_equal(derived.sums, sent.sums)
    np.testing.assert_array_equal(derived.counts, sent.counts)
    np.testing.assert_array_equal(derived.round_sums, sent.round_sums)
    np.testing.assert_array_equal(derived.round_counts, sent.round_counts)
    for path in ("", "/rounds", "/cosines"):
        assert "participants" not in client.get(f"/audits/{dep_id}{path}").text


def test_a_deployment_round_must_insert_the_canaries_served(client, store):
    """The service served round t's sum, so it knows how many canaries the round holds: another
    count is refused (422, nothing stored); a round without its canaries says 0 and is a gap."""
    audit_id, headers, spec = _audit(store)
    assert (
        client.put(
            f"/audits/{audit_id}/initial-model", content=f32(np.zeros(DIM)), headers=headers
        ).status_code
        == 200
    )
    local = LocalCanaries.for_audit(SEED, _as_simulation(spec))
    total, count = local.round_sum(1, DIM)
    update = f32((total + 0.01) / 5)
    for wrong in (count + 1, max(count - 1, 0)):
        refused = client.put(
            f"/audits/{audit_id}/rounds/1",
            content=update,
            headers=headers,
            params=dict(META, num_canaries_inserted=wrong),
        )
        assert refused.status_code == 422, refused.text
        assert "num_canaries_inserted" in refused.text and f"the {count} canaries" in refused.text
    assert client.get(f"/audits/{audit_id}").json()["progress"]["round"] == 0  # nothing stored
    ok = client.put(
        f"/audits/{audit_id}/rounds/1",
        content=update,
        headers=headers,
        params=dict(META, num_canaries_inserted=count),
    )
    assert ok.status_code == 200, ok.text
    gap = client.put(
        f"/audits/{audit_id}/rounds/2",
        content=f32(np.zeros(DIM)),
        headers=headers,
        params=dict(META, num_canaries_inserted=0, canaries_missing="unreachable"),
    )
    assert gap.status_code == 200, gap.text
    assert client.get(f"/audits/{audit_id}").json()["progress"]["round"] == 2


class _Grid:
    """Three SuperNodes whose clients send a small constant update."""

    def get_node_ids(self):
        return [101, 102, 103]

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            delta = np.full_like(msg.content["arrays"].to_numpy_ndarrays()[0], 1e-3)
            content = RecordDict(
                {"arrays": ArrayRecord([delta]), "metrics": MetricRecord({"train-loss": 1.0})}
            )
            replies.append(Message(content=content, reply_to=msg))
        return replies


class _Recording(LocalRoundReporter):
    def report_round(self, server_round, delta, metadata):
        super().report_round(server_round, delta, metadata)
        self.participants = getattr(self, "participants", []) + [list(metadata.participants)]


def test_a_deployment_serverapp_without_the_seed_audits_as_the_simulation_does(
    sqlite_store, flower_task_identity
):
    spec = AuditSpec(**{**SPEC, "num_rounds": 3, "canary_repeats": 1, "clients_per_round": 3})
    audit = sqlite_store.create_audit(
        name="dep", spec=spec.model_dump(mode="json"), canary_seed=SEED
    )
    with make_client(sqlite_store) as client:  # (running after the service's start-up)
        token = start_run(sqlite_store, audit.id)["Authorization"].split()[1]
        http = httpx.Client(transport=client._transport, base_url="http://testserver")
        reporter = HttpRoundReporter(
            "http://testserver", audit.id, token, client=http, backoff=0.01
        )
        canaries = ServiceCanarySums(reporter, num_seen=int(seen_mask(SEED, 20).sum()))
        result = run_audit(
            _Grid(), AuditRuntime(spec=spec, reporter=reporter, canaries=canaries, noise_seed=1)
        )
        reporter.close()
        served = client.get(f"/audits/{audit.id}").json()
    assert served["status"] == "succeeded" and reporter.gaps == []

    local = _Recording.for_audit(canary_seed=SEED, num_canaries=20)
    expected = run_audit(
        _Grid(),
        AuditRuntime(spec=_as_simulation(spec), reporter=local, canary_seed=SEED, noise_seed=1),
    )
    assert [r["cohort_size"] for r in result["rounds"]] == [
        r["cohort_size"] for r in expected["rounds"]
    ]
    assert _participants(sqlite_store, audit.id) == local.participants
    final = sqlite_store.load_secret_state(audit.id)
    np.testing.assert_allclose(final.max_cosines, local.tracker.max_cosines, atol=1e-5)
