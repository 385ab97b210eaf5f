"""An audit knows when its run is dead (issue #40, item 5): heartbeats carry progress (when the
SuperLink last answered the ServerApp, when the run last moved, its round timeout), so an
orphaned ServerApp that keeps heartbeating after its SuperLink died does not keep its audit
running; a run silent after 0, 1 or 4 rounds ends within 200 s whatever its cadence; a slow
run that reports progress is never ended. Clocks are injected: nothing sleeps."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from flaudit.server.http_reporter import HttpRoundReporter
from flaudit.service.routers import ingest
from flaudit.service.silence import PROGRESS_GRACE_SECONDS, SILENCE_SECONDS, progress_at
from flaudit.service.store import as_utc, utcnow

from .conftest import AUTH, f32

T0 = datetime(2026, 1, 1, tzinfo=UTC)
CLAIM = {
    "noise_multiplier": 1.0,
    "clip_norm": 0.5,
    "num_rounds": 6,
    "num_clients": 4,
    "clients_per_round": 4,
}
META = {
    "clip_norm": 0.5,
    "cohort_size": 4,
    "num_canaries_inserted": 0,
    "num_failures": 0,
    "clipped_fraction": 0,
    "noise_stddev": 0.5,
    "canaries_missing": "test",
}


# -- the rule, on its own --------------------------------------------------------------------
def test_a_heartbeat_vouches_for_the_superlinks_last_answer_and_the_runs_last_move():
    assert progress_at(T0, None) == T0  # an older wrapper: a heartbeat is progress now
    assert progress_at(T0, {}) == T0
    # the SuperLink answered 40 s ago: the heartbeat counts as 40 s old
    assert progress_at(T0, {"grid_age_seconds": 40}) == T0 - timedelta(seconds=40)
    # a 10-minute round under Flower's default 3600 s round timeout: progress now
    beat = {"grid_age_seconds": 3, "progress_age_seconds": 600, "round_timeout_seconds": 3600}
    assert progress_at(T0, beat) == T0 - timedelta(seconds=3)
    # stuck past its round timeout: the silence ends it PROGRESS_GRACE_SECONDS after it ran out
    beat = {"grid_age_seconds": 3, "progress_age_seconds": 700, "round_timeout_seconds": 600}
    at = progress_at(T0, beat)
    stuck_since = T0 - timedelta(seconds=700)
    ends_at = at + timedelta(seconds=SILENCE_SECONDS)
    assert ends_at - (stuck_since + timedelta(seconds=600)) == timedelta(
        seconds=PROGRESS_GRACE_SECONDS
    )
    # without a round timeout the run's last move says nothing (a round may take any time)
    assert progress_at(T0, {"progress_age_seconds": 10_000}) == T0
    # nonsense is not a report
    assert progress_at(T0, {"grid_age_seconds": float("nan")}) == T0
    assert progress_at(T0, {"grid_age_seconds": -5, "progress_age_seconds": "x"}) == T0


def test_a_shorter_silence_limit_keeps_the_grace_after_the_round_timeout():
    beat = {"progress_age_seconds": 300, "round_timeout_seconds": 30}
    at = progress_at(T0, beat, silence_seconds=20)
    # stuck since T0 - 300, round timeout ran out at T0 - 270: ends 120 s later
    assert (at + timedelta(seconds=20)) - (T0 - timedelta(seconds=270)) == timedelta(
        seconds=PROGRESS_GRACE_SECONDS
    )


def _external(store, **spec):
    spec = {"engine": "external", "num_rounds": 6, "num_canaries": 8, **spec}
    audit = store.create_audit(name="x", spec=spec, canary_seed=1, run_token="t")
    assert store.declare_claim(audit.id, spec=spec, run_id="r")
    return audit


def test_a_heartbeat_never_moves_the_last_sign_of_progress_back(sqlite_store):
    store = sqlite_store
    audit = _external(store)
    first = as_utc(store.get_audit(audit.id).last_contact_at)
    assert store.touch(audit.id, at=first - timedelta(seconds=100))  # an old report: kept
    assert as_utc(store.get_audit(audit.id).last_contact_at) == first
    assert store.touch(audit.id, at=first + timedelta(seconds=5))
    assert as_utc(store.get_audit(audit.id).last_contact_at) == first + timedelta(seconds=5)
    store.finish(audit.id, status="failed", reason="test", only_if=("running",))
    assert not store.touch(audit.id)


def test_heartbeats_of_an_orphaned_serverapp_do_not_keep_its_audit(sqlite_store):
    """The SuperLink died at ``dead``; the ServerApp heartbeats every 30 s, each saying how long
    ago the SuperLink last answered: the audit ends within 3 minutes of the death."""
    store = sqlite_store
    audit = _external(store)
    dead = as_utc(store.get_audit(audit.id).last_contact_at)
    since = dead - timedelta(hours=1)
    ended_at = None
    for beat in range(1, 12):  # heartbeats 30 s apart, the grid silent since ``dead``
        now = dead + timedelta(seconds=30 * beat)
        assert store.touch(audit.id, at=progress_at(now, {"grid_age_seconds": 30 * beat}))
        if store.end_silent_external(since=since, now=now + timedelta(seconds=2)):
            ended_at = now + timedelta(seconds=2)
            break
    assert ended_at is not None
    assert (ended_at - dead).total_seconds() <= 180
    assert store.get_audit(audit.id).reason.startswith("the run stopped making progress")


# -- through the routes ------------------------------------------------------------------------
class Clock:
    """The service's clock of the heartbeat route, moved by hand (starts at real now)."""

    def __init__(self) -> None:
        self.now = utcnow()

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(ingest, "utcnow", clock)
    return clock


def started_run(client, rounds: int) -> tuple[str, dict]:
    """An attached audit whose run declared ``CLAIM`` and sent its initial model and its first
    ``rounds`` rounds; returns (audit id, the run's headers)."""
    body = client.post(
        "/audits",
        json={"engine": "external", "num_canaries": 8, "max_canary_fraction": 1.0},
        headers=AUTH,
    ).json()
    audit_id, token = body["id"], body["environment"]["FLAUDIT_RUN_TOKEN"]
    run = {"Authorization": f"Bearer {token}", "X-Flaudit-Run-Id": "r1"}
    assert client.put(f"/audits/{audit_id}/claim", json=CLAIM, headers=run).status_code == 200
    raw = {**run, "Content-Type": "application/octet-stream"}
    initial = client.put(
        f"/audits/{audit_id}/initial-model", content=f32(np.zeros(64)), headers=raw
    )
    assert initial.status_code == 200, initial.text
    report_rounds(client, audit_id, run, range(1, rounds + 1))
    return audit_id, run


def report_rounds(client, audit_id: str, run: dict, rounds) -> None:
    """Rounds ``rounds`` of a run started by ``started_run`` (small updates, no canaries)."""
    raw = {**run, "Content-Type": "application/octet-stream"}
    for t in rounds:
        r = client.put(
            f"/audits/{audit_id}/rounds/{t}",
            params=META,
            content=f32(np.full(64, 0.01)),
            headers=raw,
        )
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("rounds", [0, 1, 4])
def test_a_run_silent_after_its_first_rounds_ends_within_200_s(client, store, rounds):
    audit_id, _ = started_run(client, rounds)
    last = as_utc(store.get_audit(audit_id).last_contact_at)
    since = last - timedelta(hours=1)
    assert store.end_silent_external(since=since, now=last + timedelta(seconds=140)) == []
    assert store.end_silent_external(since=since, now=last + timedelta(seconds=199)) == [audit_id]
    audit = store.get_audit(audit_id)
    assert audit.status == "failed"
    assert f"after {rounds} of 6 rounds" in audit.reason
    assert [g["round"] for g in audit.gaps if g["kind"] == "not_reported"] == list(
        range(rounds + 1, 7)
    )


def test_a_10_minute_round_with_progress_heartbeats_keeps_running(client, store, clock):
    audit_id, run = started_run(client, 1)
    since = clock.now - timedelta(hours=1)
    round_start = clock.now
    for beat in range(1, 21):  # round 2 trains for 10 minutes; a heartbeat every 30 s
        clock.now = round_start + timedelta(seconds=30 * beat)
        body = {
            "round": 2,
            "phase": "training",
            "progress_age_seconds": 30.0 * beat,
            "grid_age_seconds": 4.0,
            "round_timeout_seconds": 3600,
        }
        r = client.put(f"/audits/{audit_id}/heartbeat", json=body, headers=run)
        assert r.status_code == 200, r.text
        assert r.json()["silence_limit_seconds"] == SILENCE_SECONDS
        assert store.end_silent_external(since=since, now=clock.now + timedelta(seconds=25)) == []
    assert store.get_audit(audit_id).status == "running"
    # a heartbeat without a body (an older wrapper) is progress now
    clock.now += timedelta(seconds=140)
    assert client.put(f"/audits/{audit_id}/heartbeat", headers=run).status_code == 200
    assert store.end_silent_external(since=since, now=clock.now + timedelta(seconds=140)) == []


def test_heartbeats_after_the_superlink_died_end_the_audit_within_3_minutes(client, store, clock):
    audit_id, run = started_run(client, 4)
    since = clock.now - timedelta(hours=1)
    dead = clock.now  # the SuperLink's last answer
    ended = None
    for beat in range(1, 20):
        clock.now = dead + timedelta(seconds=30 * beat)
        body = {
            "round": 5,
            "phase": "training",
            "progress_age_seconds": 30.0 * beat,
            "grid_age_seconds": 30.0 * beat,
            "round_timeout_seconds": 3600,
        }
        if (
            client.put(f"/audits/{audit_id}/heartbeat", json=body, headers=run).status_code == 409
        ):  # ended: the run is told
            break
        if store.end_silent_external(since=since, now=clock.now + timedelta(seconds=2)):
            ended = clock.now + timedelta(seconds=2)
    assert ended is not None and (ended - dead).total_seconds() <= 180
    assert store.get_audit(audit_id).reason.startswith(
        "the run stopped making progress: no sign of it for more than 150 s"
    )


def test_heartbeats_of_a_run_stuck_past_its_round_timeout_do_not_keep_it(client, store, clock):
    audit_id, run = started_run(client, 1)
    since = clock.now - timedelta(hours=1)
    stuck = clock.now
    ended = None
    for beat in range(1, 40):  # the SuperLink answers, but the run never moves again
        clock.now = stuck + timedelta(seconds=30 * beat)
        body = {
            "round": 2,
            "phase": "training",
            "progress_age_seconds": 30.0 * beat,
            "grid_age_seconds": 1.0,
            "round_timeout_seconds": 600,
        }
        if client.put(f"/audits/{audit_id}/heartbeat", json=body, headers=run).status_code == 409:
            break
        if store.end_silent_external(since=since, now=clock.now):
            ended = clock.now
    # the round timeout ran out at stuck + 600; ended 120 s after that (heartbeats 30 s apart)
    assert ended is not None
    assert 600 + PROGRESS_GRACE_SECONDS <= (ended - stuck).total_seconds() <= 600 + 180


def test_a_heartbeat_body_is_validated(client):
    audit_id, run = started_run(client, 0)
    r = client.put(f"/audits/{audit_id}/heartbeat", json={"grid_age_seconds": -1}, headers=run)
    assert r.status_code == 422
    assert any("grid_age_seconds" in ".".join(map(str, e["loc"])) for e in r.json()["detail"])


# -- the wrapper's side ------------------------------------------------------------------------
def test_the_reporter_heartbeat_says_what_the_run_is_doing_and_probes_the_superlink():
    reporter = HttpRoundReporter("http://127.0.0.1:9", "a", "t")
    try:
        body = reporter.heartbeat_body()
        assert body["round"] == 0 and body["phase"] == "starting"
        assert "grid_age_seconds" not in body and "round_timeout_seconds" not in body
        reporter.moved(3, "training")
        probed = threading.Event()
        answers = []

        def probe():
            answers.append(1)
            if len(answers) >= 3:
                probed.set()
            raise ConnectionError("the SuperLink is gone")

        reporter.watch_grid(probe, round_timeout=900, every=0.01)
        watched = reporter._grid_answered_at
        assert probed.wait(10)
        body = reporter.heartbeat_body()
        assert body["round"] == 3 and body["phase"] == "training"
        assert body["round_timeout_seconds"] == 900
        assert body["grid_age_seconds"] >= 0
        assert reporter._grid_answered_at == watched  # failed probes are no answer
    finally:
        reporter.close()


def test_an_answering_superlink_refreshes_the_reporters_last_answer():
    reporter = HttpRoundReporter("http://127.0.0.1:9", "a", "t")
    try:
        answered = threading.Event()
        reporter.watch_grid(answered.set, every=0.01)
        watched = reporter._grid_answered_at
        assert answered.wait(10)
        for _ in range(1000):  # the probe thread records the answer right after probe()
            if reporter._grid_answered_at != watched:
                break
            threading.Event().wait(0.01)
        assert reporter._grid_answered_at > watched
        assert "round_timeout_seconds" not in reporter.heartbeat_body()
    finally:
        reporter.close()
