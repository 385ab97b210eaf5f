"""Every audit ends, promptly (issue #28, items 3 and 6): a refused round (not finite, wrong
length) or a refused final model ends the audit with a verdict on the rounds it has and the
reason; a silent run is given up after 150 s without a sign of progress whatever its round
cadence (at most ``timeout_seconds``; tests/service/test_dead_runs.py has the progress rules),
with a reason that is true when the final model never came; an attached audit whose run never
claims it ends "the run never started" after ``start_timeout_seconds``."""

from __future__ import annotations

import itertools
import json
import random
from datetime import timedelta

import httpx
import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg

import flaudit.service.routers.audits as audits_router
from flaudit.auditor.spec import AuditSpec
from flaudit.commands import cli
from flaudit.server.http_reporter import HttpRoundReporter
from flaudit.server.wrapper import CanaryAuditStrategy
from flaudit.service.silence import SILENCE_SECONDS, silence_limit, start_limit
from flaudit.service.store import as_utc, utcnow
from tests.flower_rounds import reply

from .conftest import AUTH, SMALL_SPEC, f32, start_run, submit
from .fake_engine import synthetic_run
from .test_dead_runs import report_rounds, started_run


@pytest.fixture
def seeded(monkeypatch):
    """Reproducible audits: fixed, secret-looking canary seeds and a fixed state of the global
    generators Flower draws from (NumPy's: the DP wrapper's noise; Python's: the cohort), so
    that a verdict below is one outcome, not one of two (a correct run ends refuted by chance
    in a few percent of runs: the alarm's false-alarm level)."""
    seeds = itertools.count(0x39_5EED_E0D5_0000_0000_0000_0000_0001)
    monkeypatch.setattr(audits_router, "new_master_seed", lambda: next(seeds))
    numpy_state, python_state = np.random.get_state(), random.getstate()
    np.random.seed(39)
    random.seed(39)
    yield
    np.random.set_state(numpy_state)
    random.setstate(python_state)


# -- the rule ---------------------------------------------------------------------------------
def test_the_silence_limit_is_150_s_whatever_the_cadence_at_most_timeout_seconds():
    # no cadence in the rule: a run dead before its second round is not given timeout_seconds
    for spec in ({"timeout_seconds": 3600}, {}, {"timeout_seconds": 900}):
        limit = silence_limit(spec)
        assert limit.seconds == SILENCE_SECONDS == 150
        assert "heartbeats as of the progress they report" in limit.rule
    # a timeout below it wins (an explicit, short timeout_seconds)
    limit = silence_limit({"timeout_seconds": 5})
    assert limit.seconds == 5 and limit.rule == "timeout_seconds = 5 s"


def test_the_start_limit_is_start_timeout_seconds_whatever_timeout_seconds():
    assert start_limit({"timeout_seconds": 3600}).seconds == 600  # a spec from before the field
    assert start_limit({"timeout_seconds": 3600, "start_timeout_seconds": 30}).seconds == 30
    limit = start_limit({"timeout_seconds": 10, "start_timeout_seconds": 600})
    assert limit.seconds == 600 and "start_timeout_seconds = 600 s" in limit.rule


@pytest.mark.parametrize("value", [0, -1, 8 * 24 * 3600, "soon"])
def test_start_timeout_seconds_is_validated_naming_the_field(client, value):
    body = {"engine": "external", "num_canaries": 8, "start_timeout_seconds": value}
    response = client.post("/audits", json=body, headers=AUTH)
    assert response.status_code == 422
    assert any(
        "start_timeout_seconds" in ".".join(map(str, e["loc"])) for e in response.json()["detail"]
    )
    assert AuditSpec().start_timeout_seconds == 600


# -- the watchdog -----------------------------------------------------------------------------
def _external(store, **spec):
    spec = {"engine": "external", "num_rounds": 20, "num_canaries": 8, **spec}
    return store.create_audit(name="x", spec=spec, canary_seed=1, run_token="t"), spec


def test_a_dead_run_is_given_up_150_s_after_its_last_sign_of_progress(sqlite_store):
    store = sqlite_store
    audit, spec = _external(store, timeout_seconds=3600)
    assert store.declare_claim(audit.id, spec=spec, run_id="r")
    assert store.touch(audit.id)
    last = as_utc(store.get_audit(audit.id).last_contact_at)
    since = last - timedelta(hours=1)
    assert store.end_silent_external(since=since, now=last + timedelta(seconds=149)) == []
    assert store.end_silent_external(since=since, now=last + timedelta(seconds=151)) == [audit.id]
    ended = store.get_audit(audit.id)
    assert ended.status == "failed"
    assert ended.reason.startswith(
        "the run stopped making progress: no sign of it for more than 150 s (signs of "
        "progress: rounds, models, and heartbeats as of the progress they report; at most "
        "timeout_seconds = 3600 s; last sign "
    )
    assert "rounds 1-20 and the final model were never reported" in ended.reason


def test_all_rounds_but_no_final_model_says_the_final_model_never_came(sqlite_store):
    store = sqlite_store
    audit, spec = _external(store, num_rounds=3)
    assert store.declare_claim(audit.id, spec=spec, run_id="r")
    for t in (1, 2, 3):  # (the rounds' bodies do not matter to the watchdog)
        assert store.store_missing_round(audit.id, t=t, reason="test")
    last = as_utc(store.get_audit(audit.id).last_contact_at)
    now = last + timedelta(seconds=SILENCE_SECONDS + 1)
    assert store.end_silent_external(since=last, now=now) == [audit.id]
    reason = store.get_audit(audit.id).reason
    assert reason.endswith("after 3 of 3 rounds; the final model was never reported"), reason


def test_an_attached_audit_whose_run_never_claims_it_ends_the_run_never_started(client, store):
    body = client.post(
        "/audits",
        json={"engine": "external", "num_canaries": 8, "start_timeout_seconds": 30},
        headers=AUTH,
    ).json()
    created = as_utc(store.get_audit(body["id"]).created_at)
    assert store.end_silent_external(since=created, now=created + timedelta(seconds=29)) == []
    assert store.end_silent_external(since=created, now=created + timedelta(seconds=31)) == [
        body["id"]
    ]
    audit = client.get(f"/audits/{body['id']}").json()
    assert audit["status"] == "failed"
    assert audit["reason"].startswith(
        "the run never started: no Flower run declared its claim within 30 s of the audit's "
        "creation (start_timeout_seconds = 30 s)"
    )
    assert audit["verdict"]["status"] != "running"


# -- a refused round ends the audit -----------------------------------------------------------
def _first_rounds(client, store, rounds: int):
    audit_id = submit(client)
    headers = start_run(store, audit_id)
    spec = AuditSpec.model_validate(SMALL_SPEC)
    theta0, deltas, meta = synthetic_run(7, spec, 400)
    base = f"/audits/{audit_id}"
    assert (
        client.put(f"{base}/initial-model", content=f32(theta0), headers=headers).status_code == 200
    )
    for t in range(1, rounds + 1):
        r = client.put(
            f"{base}/rounds/{t}", params=meta[t - 1], content=f32(deltas[t - 1]), headers=headers
        )
        assert r.status_code == 200, r.text
    return audit_id, headers, deltas, meta


@pytest.mark.parametrize("problem", ["nan", "inf", "short"])
def test_a_refused_round_ends_the_audit_on_the_rounds_it_has_with_the_reason(
    client, store, problem, seeded
):
    audit_id, headers, deltas, meta = _first_rounds(client, store, 2)
    before = client.get(f"/audits/{audit_id}").json()
    assert before["estimates"]  # the two rounds' estimates
    body = deltas[2].copy()
    if problem == "nan":
        body[5] = np.nan
    elif problem == "inf":
        body[5] = np.inf
    else:
        body = body[:-1]
    r = client.put(
        f"/audits/{audit_id}/rounds/3", params=meta[2], content=f32(body), headers=headers
    )
    assert r.status_code == 422
    audit = client.get(f"/audits/{audit_id}").json()
    assert audit["status"] == "failed"
    assert audit["reason"].startswith("round 3 was refused (round 3 update: ")
    assert (
        "the audit ended on the 2 round(s) it has; rounds 3-4 and the final model were "
        "never received"
    ) in audit["reason"]
    assert ("training diverged" in audit["reason"]) == (problem != "short")
    assert [(g["round"], g["kind"]) for g in audit["gaps"]] == [
        (3, "not_reported"),
        (4, "not_reported"),
    ]
    assert "final model never arrived" in audit["gaps"][0]["cost"]
    # no alarm on 2 rounds of a correct run: inconclusive, saying on what it stands
    assert audit["verdict"]["status"] == "inconclusive", audit["verdict"]
    assert audit["verdict"]["cause"] is None
    assert audit["verdict"]["summary"].startswith(
        "Inconclusive: the run failed after 2 of 4 rounds"
    ), audit["verdict"]["summary"]
    assert audit["estimates"] == before["estimates"]  # the verdict stands on the rounds it has
    assert audit["progress"]["round"] == 2
    # later data of the diverged run is refused, naming the state
    again = client.put(
        f"/audits/{audit_id}/rounds/3", params=meta[2], content=f32(deltas[2]), headers=headers
    )
    assert again.status_code in (401, 409)


def test_a_refused_final_model_ends_the_audit_and_a_malformed_body_does_not(client, store):
    audit_id, headers, deltas, meta = _first_rounds(client, store, 4)
    base = f"/audits/{audit_id}"
    # a body cut mid-value (transport trouble, not the model): refused, the audit goes on
    r = client.put(f"{base}/final-model", content=f32(np.zeros(400))[:-2], headers=headers)
    assert r.status_code == 400
    assert client.get(base).json()["status"] == "running"
    final = np.full(400, np.nan, dtype=np.float32)
    r = client.put(f"{base}/final-model", content=f32(final), headers=headers)
    assert r.status_code == 422 and "non-finite" in r.json()["detail"]
    audit = client.get(base).json()
    assert audit["status"] == "failed" and audit["gaps"] == []
    assert audit["reason"].startswith(
        "the final model was refused (final model: contains 400 non-finite value(s)"
    )
    assert "ended on the 4 round(s) it has" in audit["reason"]
    assert audit["verdict"]["status"] != "running"


def test_a_started_audit_is_not_ended_before_its_start_limit_by_the_start_rule(store):
    """The start rule applies only to audits that no run claimed."""
    audit = store.create_audit(
        name="x",
        spec={"engine": "external", "num_rounds": 3, "num_canaries": 8, "start_timeout_seconds": 1},
        canary_seed=1,
        run_token="t",
    )
    assert store.declare_claim(
        audit.id,
        spec={"engine": "external", "num_rounds": 3, "num_canaries": 8, "start_timeout_seconds": 1},
        run_id="r",
    )
    now = utcnow()
    assert store.end_silent_external(since=now, now=now + timedelta(seconds=60)) == []


def test_flaudit_attach_sends_the_start_timeout_and_says_what_happens_without_a_run(
    client, store, monkeypatch, capsys
):
    monkeypatch.setenv("FLAUDIT_API_KEY", AUTH["Authorization"].split()[1])
    monkeypatch.setattr(
        httpx,
        "post",
        lambda url, **kw: client.post(
            url.replace("http://svc", ""), **{k: v for k, v in kw.items() if k != "timeout"}
        ),
    )
    assert (
        cli.main(["attach", "--url", "http://svc", "--start-timeout", "45", "--format", "json"])
        == 0
    )
    out = capsys.readouterr()
    audit_id = json.loads(out.out)["FLAUDIT_AUDIT_ID"]
    assert store.get_audit(audit_id).spec["start_timeout_seconds"] == 45
    assert (
        "if no ServerApp declares its claim within 45 s, the audit ends failed: the run "
        "never started"
    ) in out.err


# -- the case: the model goes NaN mid-run, with the real wrapper ------------------------
class _Grid3:
    def get_node_ids(self):
        return [1, 2, 3]


def test_a_run_whose_model_goes_nan_ends_its_audit_with_the_reason_and_trains_on(
    client, store, flower_task_identity, caplog, seeded
):
    body = client.post(
        "/audits",
        json={"engine": "external", "num_canaries": 16, "max_canary_fraction": 1.0, "delta": 1e-5},
        headers=AUTH,
    ).json()
    audit_id, token = body["id"], body["environment"]["FLAUDIT_RUN_TOKEN"]
    http = httpx.Client(transport=client._transport, base_url="http://testserver")
    reporter = HttpRoundReporter(
        "http://testserver", audit_id, token, client=http, backoff=0.01, retry_seconds=0.05
    )
    dp = DifferentialPrivacyServerSideFixedClipping(
        FedAvg(min_train_nodes=3, min_available_nodes=3, fraction_evaluate=0.0),
        noise_multiplier=0.5,
        clipping_norm=0.5,
        num_sampled_clients=3,
    )
    strategy = CanaryAuditStrategy(dp, reporter=reporter, num_rounds=6)
    strategy.audit._slot_rng = np.random.default_rng(0)  # which sampled clients canaries displace
    rng = np.random.default_rng(0)
    arrays = ArrayRecord(
        [
            rng.standard_normal((20, 30)).astype(np.float32),
            rng.standard_normal(30).astype(np.float32),
        ]
    )
    with caplog.at_level("ERROR", logger="flaudit.server.reporting"):
        for t in range(1, 7):  # the clients' updates blow up from round 3
            messages = list(strategy.configure_train(t, arrays, ConfigRecord({}), _Grid3()))
            current = np.concatenate([a.ravel() for a in arrays.to_numpy_ndarrays()])
            replies = []
            for msg in messages:
                vec = current + 0.01 * rng.standard_normal(630).astype(np.float32)
                if t >= 3:
                    vec[:] = np.nan
                replies.append(reply(msg, vec))
            arrays, _ = strategy.aggregate_train(t, replies)
            strategy.flush()
    reporter.close()
    audit = client.get(f"/audits/{audit_id}").json()
    assert audit["status"] == "failed"
    assert audit["reason"].startswith(
        "round 3 was refused (round 3 update: contains 630 non-finite value(s) (NaN or Inf)"
    )
    assert "ended on the 2 round(s) it has; rounds 3-6 and the final model" in audit["reason"]
    assert "training diverged" in audit["reason"]
    assert audit["verdict"]["status"] == "inconclusive", audit["verdict"]
    assert audit["verdict"]["cause"] is None
    assert audit["verdict"]["summary"].startswith(
        "Inconclusive: the run failed after 2 of 6 rounds"
    ), audit["verdict"]["summary"]
    assert [g["round"] for g in audit["gaps"] if g["kind"] == "not_reported"] == [3, 4, 5, 6]
    # the ServerApp says once that the audit stopped; training went on to round 6
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and "non-finite" in refusals[0]


def test_the_heartbeat_answers_the_silence_limit_and_the_wrapper_follows_it(client):
    audit_id, run = started_run(client, 0)
    token = run["Authorization"].removeprefix("Bearer ")
    beat = client.put(f"/audits/{audit_id}/heartbeat", headers=run).json()
    assert beat["silence_limit_seconds"] == SILENCE_SECONDS  # before round 1 too
    report_rounds(client, audit_id, run, (1, 2, 3))  # fast rounds
    beat = client.put(f"/audits/{audit_id}/heartbeat", headers=run)
    assert beat.json()["silence_limit_seconds"] == SILENCE_SECONDS
    reporter = HttpRoundReporter("http://testserver", audit_id, token)
    reporter._claimed = True
    reporter._heartbeat_acknowledged(beat)
    assert reporter._heartbeat_interval() == 30  # a quarter of 150 s, at most 30 s
    reporter._silence_limit = 20.0  # e.g. a short timeout_seconds
    assert reporter._heartbeat_interval() == 5  # a quarter of a shorter limit
    reporter.close()
