"""The SQLAlchemy store on SQLite and (with FLAUDIT_TEST_POSTGRES_URL) PostgreSQL."""

from __future__ import annotations

import threading
from datetime import timedelta

import numpy as np
import pytest

import flaudit.service.leases as leases_module
import flaudit.service.store as store_module
from flaudit.service.store import (
    Analysis,
    StaleRound,
    array_to_bytes,
    bytes_to_array,
    hash_token,
    utcnow,
)

SPEC = {"num_rounds": 3, "num_canaries": 4, "delta": 1e-5}


def _round(t: int) -> dict:
    return {
        "round": t,
        "clip_norm": 1.0,
        "cohort_size": 5,
        "num_canaries_inserted": 1,
        "num_failures": 0,
        "estimates": [{"epsilon": "inf", "estimator": "two_gaussian"}],
    }


def _store_round(store, audit_id, t, max_c=None):
    max_c = np.arange(4, dtype=float) * t if max_c is None else max_c
    store.store_round(
        audit_id,
        round_row=_round(t),
        max_cosines=max_c,
        last_cosines=max_c,
        analysis=Analysis([], [], {}, [], None),
    )


def test_create_get_list_and_secret_stays_out_of_reprs(store):
    seed = 2**127 + 12345
    a = store.create_audit(name="a", spec=SPEC, canary_seed=seed)
    b = store.create_audit(name="b", spec=SPEC, canary_seed=7)
    got = store.get_audit(a.id)
    assert got.name == "a" and got.spec == SPEC and got.status == "queued"
    assert store.canary_seed(a.id) == seed  # 128-bit value survives exactly
    assert str(seed) not in repr(got) and str(seed) not in repr(store.load_secret_state(a.id))
    items, total = store.list_audits(limit=1)
    assert total == 2 and len(items) == 1
    items, total = store.list_audits(status="queued", limit=10, offset=1)
    assert total == 2 and len(items) == 1
    assert {x.id for x in store.list_audits(limit=10)[0]} == {a.id, b.id}


def test_rounds_are_stored_once_and_in_order(store):
    audit = store.create_audit(name="a", spec=SPEC, canary_seed=1)
    assert store.mark_running(audit.id, run_token="tok")
    assert store.run_token_hash(audit.id) == hash_token("tok") != "tok"
    assert not store.mark_running(audit.id, run_token="again")  # only from queued
    with pytest.raises(StaleRound):
        _store_round(store, audit.id, 2)  # not the next round
    _store_round(store, audit.id, 1)
    with pytest.raises(StaleRound):
        _store_round(store, audit.id, 1)  # same round again
    _store_round(store, audit.id, 2, max_c=np.array([0.5, -np.inf, 1e-300, -0.25]))
    assert [r.round for r in store.list_rounds(audit.id)] == [1, 2]
    state = store.load_secret_state(audit.id)
    assert state.rounds_stored == 2
    np.testing.assert_array_equal(state.max_cosines, [0.5, -np.inf, 1e-300, -0.25])
    assert store.list_rounds(audit.id)[0].estimates[0]["epsilon"] == "inf"


def test_concurrent_writers_store_a_round_exactly_once(store):
    audit = store.create_audit(name="a", spec=SPEC, canary_seed=1)
    store.mark_running(audit.id, run_token="tok")
    outcomes = []

    def write():
        try:
            _store_round(store, audit.id, 1)
            outcomes.append("stored")
        except StaleRound:
            outcomes.append("stale")
        except Exception as exc:  # e.g. a unique-constraint violation also refuses the duplicate
            outcomes.append(type(exc).__name__)

    threads = [threading.Thread(target=write) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert outcomes.count("stored") == 1
    assert len(store.list_rounds(audit.id)) == 1 and store.get_audit(audit.id).rounds_stored == 1


def test_finish_only_from_allowed_statuses_and_restart_reason(store):
    running = store.create_audit(name="r", spec=SPEC, canary_seed=1)
    queued = store.create_audit(name="q", spec=SPEC, canary_seed=2)
    store.mark_running(running.id, run_token="tok")
    _store_round(store, running.id, 1)
    assert store.fail_interrupted() == [running.id]
    audit = store.get_audit(running.id)
    assert audit.status == "failed" and audit.finished_at is not None
    assert audit.reason == "service restarted during the run; 1 rounds were stored"
    assert store.run_token_hash(running.id) is None
    assert store.get_audit(queued.id).status == "queued"
    assert not store.finish(
        running.id, status="cancelled", reason="x", only_if=("queued", "running")
    )
    with pytest.raises(ValueError, match="status"):
        store.finish(running.id, status="running", reason=None, only_if=("queued",))


def test_delete_removes_rounds(store):
    audit = store.create_audit(name="a", spec=SPEC, canary_seed=1)
    store.mark_running(audit.id, run_token="tok")
    _store_round(store, audit.id, 1)
    assert store.delete_audit(audit.id)
    assert store.get_audit(audit.id) is None and store.list_rounds(audit.id) == []
    assert not store.delete_audit(audit.id)


def test_array_bytes_roundtrip():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(size=100), [np.inf, -np.inf, 0.0, -0.0]])
    np.testing.assert_array_equal(bytes_to_array(array_to_bytes(x)), x)
    y = rng.normal(size=33).astype(np.float32)
    assert bytes_to_array(array_to_bytes(y, "<f4"), "<f4").dtype == np.float32
    assert array_to_bytes(None) is None and bytes_to_array(None) is None


@pytest.fixture
def clock(monkeypatch):
    """The store's clock, moved by the test: a lease ages by exactly what the test says (a
    sleep and a loaded machine would make a just-renewed lease look expired too)."""
    now = [utcnow()]
    for module in (store_module, leases_module):
        monkeypatch.setattr(module, "utcnow", lambda: now[0])

    def advance(seconds: float) -> None:
        now[0] += timedelta(seconds=seconds)

    return advance


def test_owner_lease_decides_which_running_audits_restart_recovery_fails(store, clock):
    live = store.create_audit(name="live", spec=SPEC, canary_seed=1)
    dead = store.create_audit(name="dead", spec=SPEC, canary_seed=2)
    ownerless = store.create_audit(name="ownerless", spec=SPEC, canary_seed=3)
    assert store.mark_running(live.id, run_token="a", owner="instance-a")
    assert store.mark_running(dead.id, run_token="b", owner="instance-b")
    assert store.mark_running(ownerless.id, run_token="c")
    # instance-a renews its lease; instance-b's lease is 0 s old too, so with a long lease
    # nothing with an owner is failed
    assert store.heartbeat("instance-a", [live.id]) == []
    assert store.fail_interrupted(lease_seconds=60) == [ownerless.id]
    clock(0.3)  # the leases age 0.3 s
    assert store.heartbeat("instance-a", [live.id]) == []
    assert store.fail_interrupted(lease_seconds=0.2) == [dead.id]  # b stopped renewing
    assert store.get_audit(live.id).status == "running"
    assert store.get_audit(dead.id).status == "failed" and store.run_token_hash(dead.id) is None
    # an audit that ended elsewhere is reported back to its owner's heartbeat
    assert store.finish(live.id, status="cancelled", reason="x", only_if=("running",))
    assert store.heartbeat("instance-a", [live.id]) == [live.id]
    # another instance's heartbeat does not renew a lease it does not hold
    assert store.heartbeat("instance-c", [dead.id]) == [dead.id]


def test_a_released_deployment_audit_is_adopted_not_failed(store, clock):
    """A stopping service leaves a deployment audit's Flower run training: restart recovery
    must not fail it; exactly one instance takes it back; a live owner keeps it."""
    deployment = dict(SPEC, engine="deployment", superlink_address="superlink:9093")
    released = store.create_audit(name="released", spec=deployment, canary_seed=1)
    live = store.create_audit(name="live", spec=deployment, canary_seed=2)
    unknown_run = store.create_audit(name="not started", spec=deployment, canary_seed=3)
    simulation = store.create_audit(name="sim", spec=SPEC, canary_seed=4)
    for audit in (released, live, unknown_run, simulation):
        store.mark_running(audit.id, run_token="tok", owner="instance-a")
    big = 2**64 - 5  # Flower's run ids are unsigned 64-bit: they do not fit a BIGINT
    assert store.set_flower_run(released.id, big) and store.set_flower_run(live.id, 7)
    assert store.get_audit(released.id).flower_run_id == str(big)
    _store_round(store, released.id, 1)
    # instance-a stops: it releases the audit whose run trains on (not the one of another owner)
    assert not store.release(released.id, owner="instance-b")
    assert store.release(released.id, owner="instance-a")
    assert not store.release(
        unknown_run.id, owner="instance-a"
    )  # no Flower run known: not released
    # the lease of a live owner is respected; the released audit is taken over at once, once
    assert store.adopt_flower_runs("instance-b", lease_seconds=60) == [(released.id, str(big))]
    assert store.adopt_flower_runs("instance-c", lease_seconds=60) == []
    audit = store.get_audit(released.id)
    assert audit.status == "running" and audit.owner_id == "instance-b"
    assert store.run_token_hash(released.id) is not None  # the run's buffered reports still count
    assert audit.rounds_stored == 1
    # recovery fails what cannot resume and leaves a run that trains on to the adoption
    clock(0.3)  # the leases age 0.3 s
    assert store.heartbeat("instance-b", [released.id]) == []
    failed = set(store.fail_interrupted(lease_seconds=0.2))
    assert failed == {unknown_run.id, simulation.id}
    assert store.get_audit(live.id).status == "running"  # instance-a's lease expired: adoptable
    assert store.adopt_flower_runs("instance-b", lease_seconds=0.2) == [(live.id, "7")]
    assert not store.set_flower_run(unknown_run.id, 9)  # ended audits take no run


def test_columns_added_later_are_added_to_an_old_table(tmp_path):
    """A table older than any release (abridged) is completed by the baseline migration
    (test_migrations.py upgrades the real released schemas)."""
    from sqlalchemy import create_engine, inspect

    from flaudit.service.store import Store

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = create_engine(url)
    with engine.begin() as conn:  # the table as the first release created it (abridged)
        conn.exec_driver_sql(
            "CREATE TABLE flaudit_audits (id VARCHAR(32) PRIMARY KEY, name VARCHAR(200), "
            "status VARCHAR(16), spec JSON, canary_seed VARCHAR(48))"
        )
        conn.exec_driver_sql(
            "CREATE TABLE flaudit_rounds (audit_id VARCHAR(32), t INTEGER, "
            "PRIMARY KEY (audit_id, t))"
        )
    store = Store(url)
    columns = {c["name"] for c in inspect(engine).get_columns("flaudit_audits")}
    assert {"owner_id", "owner_heartbeat_at", "run_token_hash"} <= columns
    round_columns = {c["name"] for c in inspect(engine).get_columns("flaudit_rounds")}
    assert "participants" in round_columns
    store.dispose()
    engine.dispose()
