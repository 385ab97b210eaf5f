"""Alert webhooks (issue #41): signed events delivered to a real HTTP receiver from the ingest
routes, retries with backoff, ingest never waiting on a receiver, deliveries surviving a restart,
and a secret shown once and nowhere else."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
import typing
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from sqlalchemy import select

from flaudit.service.routers.webhooks import WebhookEvent
from flaudit.service.sealing import is_sealed
from flaudit.service.tables import WEBHOOK_EVENTS, Webhook

from .conftest import AUTH, SMALL_SPEC, f32, make_client, put_gap, start_run, submit
from .gaussian_runs import fix_canary_seeds
from .test_metrics import LEAKY_SEEDS, leaky_run

#: the receivers here listen on 127.0.0.1, which webhooks refuse by default (test_webhook_urls.py)
LOCAL = {"webhook_allow_private": True}
FAST = {"webhook_backoff_seconds": 0.2, "webhook_max_attempts": 3, **LOCAL}


@pytest.fixture(autouse=True)
def fixed_canary_seeds(monkeypatch):
    """The same canaries on every run (the leaky run then fires the alarm every time)."""
    fix_canary_seeds(monkeypatch, LEAKY_SEEDS)


def verify(secret: str, header: str, body: bytes, tolerance: float = 300) -> bool:
    """The recipe of docs/operations.md ("Verifying a webhook's signature")."""
    fields = dict(part.split("=", 1) for part in header.split(","))
    timestamp = int(fields["t"])
    if abs(time.time() - timestamp) > tolerance:
        return False  # too old (or from the future): a replay
    expected = hmac.new(
        secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256
    ).hexdigest()
    return hmac.compare_digest(expected, fields["v1"])


class Receiver:
    """A tiny HTTP server on 127.0.0.1 that records every POST; ``status`` is what it answers
    and ``delay`` how long it waits first."""

    def __init__(self, status: int = 200, delay: float = 0.0) -> None:
        self.status, self.delay = status, delay
        self.requests: list[dict] = []
        self.started = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                with receiver.lock:
                    receiver.started += 1
                body = self.rfile.read(int(self.headers["Content-Length"]))
                time.sleep(receiver.delay)
                with receiver.lock:
                    receiver.requests.append(
                        {
                            "headers": dict(self.headers),
                            "body": body,
                            "status": receiver.status,
                            "at": time.monotonic(),
                        }
                    )
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def events(self, name: str | None = None) -> list[dict]:
        with self.lock:
            got = [r for r in self.requests if r["status"] == 200]
        return [r for r in got if name is None or r["headers"]["X-Flaudit-Event"] == name]

    def wait(self, name: str, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.events(name)
            if found:
                return found[0]
            time.sleep(0.02)
        return None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def subscribe(client, url: str, **body) -> dict:
    response = client.post("/webhooks", json={"url": url, **body}, headers=AUTH)
    assert response.status_code == 201, response.text
    return response.json()


def deliveries(client, audit_id: str) -> list[dict]:
    response = client.get(f"/audits/{audit_id}/webhook-deliveries")
    assert response.status_code == 200, response.text
    return response.json()["items"]


def wait_for(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


def gap_round(client, store) -> tuple[str, dict]:
    """A running audit with its initial model; returns its id and the run's headers."""
    audit_id = submit(client, SMALL_SPEC)
    headers = start_run(store, audit_id)
    zeros = f32(np.zeros(SMALL_SPEC["task_options"]["dim"]))
    response = client.put(f"/audits/{audit_id}/initial-model", content=zeros, headers=headers)
    assert response.status_code == 200, response.text
    return audit_id, headers


def test_the_event_names_agree():
    assert set(typing.get_args(WebhookEvent)) == set(WEBHOOK_EVENTS)


def test_a_leaky_audit_sends_a_signed_alarm_and_its_end_with_verdict_and_links(
    store, receiver, caplog
):
    caplog.set_level(logging.DEBUG)
    with make_client(store, **FAST) as client:
        created = subscribe(client, receiver.url + "?token=url-is-a-credential-too")
        secret = created["secret"]
        assert secret.startswith("whsec_") and len(secret) == 6 + 64
        audit_id, acks = leaky_run(client, store)
        fired = time.monotonic()
        assert any(a["alarm"] == "error" for a in acks)
        alarm = receiver.wait("alarm.fired", timeout=5.0)
        assert alarm is not None, "no alarm event within 5 s"
        assert alarm["at"] - fired < 5.0
        header = alarm["headers"]["X-Flaudit-Signature"]
        assert verify(secret, header, alarm["body"])
        assert not verify(secret, header, alarm["body"] + b" ")  # the body is what is signed
        assert not verify("whsec_" + "0" * 64, header, alarm["body"])
        payload = json.loads(alarm["body"])
        assert payload["event"] == "alarm.fired"
        assert payload["audit"]["id"] == audit_id
        assert isinstance(payload["data"]["round"], int)

        ended = receiver.wait("audit.ended", timeout=5.0)
        assert ended is not None
        assert verify(secret, ended["headers"]["X-Flaudit-Signature"], ended["body"])
        audit = json.loads(ended["body"])["audit"]
        assert audit["status"] == "succeeded"
        assert audit["verdict"]["status"] == "claim_refuted"
        assert (
            audit["verdict"]["summary"]
            == client.get(f"/audits/{audit_id}").json()["verdict"]["summary"]
        )
        assert audit["links"]["page"].endswith(f"/ui/#/audits/{audit_id}")
        assert audit["links"]["report"].endswith(f"/audits/{audit_id}/report")
        assert len(receiver.events("alarm.fired")) == 1  # once, not once per later round

        history = wait_for(
            lambda: [d for d in deliveries(client, audit_id) if d["status"] == "delivered"], 5.0
        )
        assert {d["event"] for d in history} == {"alarm.fired", "audit.ended"}
        assert all(d["attempts"] == 1 and d["last_error"] is None for d in history)

        listed = client.get("/webhooks", headers=AUTH)
        assert listed.status_code == 200
        assert [w["id"] for w in listed.json()["items"]] == [created["id"]]
        assert "secret" not in listed.json()["items"][0]
        seed = store.canary_seed(audit_id)
        texts = [listed.text, caplog.text] + [r["body"].decode() for r in receiver.requests]
        assert "url-is-a-credential-too" not in caplog.text  # httpx's request lines dropped
        for text in texts:
            assert secret not in text and secret[6:] not in text
            assert str(seed) not in text and format(seed, "x") not in text
    with store.session() as s:
        sealed = s.scalar(select(Webhook.sealed_secret))
    assert is_sealed(sealed) and secret[6:] not in sealed  # encrypted at rest like the seeds


def test_a_down_receiver_gets_retries_and_ends_failed(store):
    dead = Receiver()
    url = dead.url
    dead.close()  # nothing listens there: every attempt is refused
    with make_client(store, **FAST) as client:
        subscribe(client, url, events=["gap.recorded"])
        audit_id, headers = gap_round(client, store)
        assert put_gap(client, audit_id, headers, 1).status_code == 200
        rows = wait_for(
            lambda: [d for d in deliveries(client, audit_id) if d["status"] == "failed"], 10.0
        )
        assert len(rows) == 1
        assert rows[0]["attempts"] == FAST["webhook_max_attempts"]
        assert rows[0]["event"] == "gap.recorded"
        assert rows[0]["last_error"] == "ConnectError"


def test_a_slow_receiver_never_stalls_ingest(store):
    slow = Receiver(delay=5.0)
    try:
        with make_client(store, **FAST, webhook_timeout_seconds=30.0) as client:
            subscribe(client, slow.url, events=["gap.recorded"])
            audit_id, headers = gap_round(client, store)
            assert put_gap(client, audit_id, headers, 1).status_code == 200
            assert wait_for(lambda: slow.started >= 1, 5.0)  # a delivery is in progress
            for t in (2, 3):
                response = put_gap(client, audit_id, headers, t)
                assert response.status_code == 200, response.text
            # both ingests answered while the receiver still sat on its first request
            assert slow.requests == []
            # the first delivery is still in flight (rows 2 and 3 are queued behind it)
            assert [d["status"] for d in deliveries(client, audit_id)][-1:] == ["pending"]
    finally:
        slow.close()


def test_pending_deliveries_survive_a_restart(store):
    flaky = Receiver(status=503)
    try:
        with make_client(
            store, webhook_backoff_seconds=0.5, webhook_max_attempts=20, **LOCAL
        ) as client:
            subscribe(client, flaky.url, events=["audit.failed"])
            audit_id, _ = gap_round(client, store)
            assert store.finish(
                audit_id, status="failed", reason="test: the run crashed", only_if=("running",)
            )
            rows = wait_for(
                lambda: [d for d in deliveries(client, audit_id) if d["attempts"] >= 1], 10.0
            )
            assert rows and rows[0]["status"] == "pending"
            assert rows[0]["last_error"] == "HTTP 503"
        flaky.status = 200  # the receiver is back; a new service on the same database
        with make_client(store, webhook_backoff_seconds=0.5, **LOCAL) as client:
            got = flaky.wait("audit.failed", timeout=10.0)
            assert got is not None
            body = json.loads(got["body"])
            assert body["audit"]["status"] == "failed"
            assert body["audit"]["reason"] == "test: the run crashed"
            rows = wait_for(
                lambda: [d for d in deliveries(client, audit_id) if d["status"] == "delivered"], 5.0
            )
            assert len(rows) == 1 and rows[0]["attempts"] >= 2
    finally:
        flaky.close()


def test_slack_format_per_audit_scope_and_validation(store, receiver):
    with make_client(store, **FAST) as client:
        audit_id, headers = gap_round(client, store)
        other, other_headers = gap_round(client, store)
        subscribe(client, receiver.url, events=["gap.recorded"], audit_id=audit_id, format="slack")
        assert put_gap(client, other, other_headers, 1).status_code == 200
        assert put_gap(client, audit_id, headers, 1).status_code == 200
        got = receiver.wait("gap.recorded", timeout=5.0)
        assert got is not None
        text = json.loads(got["body"])["text"]
        assert "round 1" in text and "connection refused" in text
        assert deliveries(client, other) == []  # subscribed to the other audit only
        assert len(receiver.events()) == 1

        for bad in (
            {"url": "ftp://example.org/x"},
            {"url": "not a url"},
            {"url": receiver.url, "events": ["audit.exploded"]},
            {"url": receiver.url, "events": []},
            {"url": receiver.url, "format": "xml"},
        ):
            assert client.post("/webhooks", json=bad, headers=AUTH).status_code == 422, bad
        assert client.post("/webhooks", json={"url": receiver.url}).status_code == 401
        assert client.get("/webhooks").status_code == 401
        missing = client.post(
            "/webhooks", json={"url": receiver.url, "audit_id": "nope"}, headers=AUTH
        )
        assert missing.status_code == 404
        hook = client.get("/webhooks", headers=AUTH).json()["items"][0]["id"]
        assert client.delete(f"/webhooks/{hook}", headers=AUTH).status_code == 204
        assert client.delete(f"/webhooks/{hook}", headers=AUTH).status_code == 404
        assert client.get("/webhooks", headers=AUTH).json()["items"] == []
        assert client.get("/audits/nope/webhook-deliveries").status_code == 404
