"""Alert webhooks (issue #41, docs/operations.md "Alert webhooks").

Subscriptions (``POST /webhooks``) name a URL, the events they want and optionally one audit.
Events:

* ``alarm.fired``: an audit's error alarm fired (its claim is refuted);
* ``audit.ended`` / ``audit.failed``: an audit ended (succeeded or cancelled) / failed, with its
  verdict sentence and links to its page and report;
* ``gap.recorded``: a round trained without canaries or was not reported.

Delivery never runs on an ingest or a training round. Alarms and gaps are handed to
:meth:`WebhookDispatcher.notify` (a bounded in-memory queue, never waiting); an audit's end
is written in the very transaction that ends it (``tables.queue_webhook_deliveries``). One
background thread per app turns events into delivery rows (``flaudit_webhook_deliveries``) and
delivers the due ones: a restart finds the pending rows in the database and goes on. A failed
attempt is retried after ``backoff * 2**(attempts - 1)`` seconds (at most an hour), up to
``max_attempts`` attempts.

Every body is signed with the subscription's secret, as Stripe does: the header
``X-Flaudit-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>." + raw body>``.
Payloads carry the audit's id, name, status and verdict, never a canary seed or anything per
canary.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import queue
import secrets
import threading
import time
from datetime import timedelta

import httpx
from sqlalchemy import delete, select, update

from .store import Store
from .tables import (
    WEBHOOK_EVENTS,
    Audit,
    Webhook,
    WebhookDelivery,
    as_utc,
    queue_webhook_deliveries,
    utcnow,
)
from .views import audit_verdict_view
from .webhook_urls import WebhookURLRefused, pinned_request

__all__ = [
    "WebhookDispatcher",
    "WEBHOOK_EVENTS",
    "sign",
    "create_webhook",
    "list_webhooks",
    "delete_webhook",
    "list_deliveries",
    "webhook_events",
]

log = logging.getLogger("flaudit.service.webhooks")

_PLAIN_PREFIX = "plain:"  # a store without a secret key (development): the secret as hex
_SECRET_BYTES = 32
_MAX_BACKOFF = 3600.0
_BATCH = 20
_QUEUE_SIZE = 1000


class _NotFromDeliveries(logging.Filter):
    """Drops httpx's request lines ("HTTP Request: POST <url> ...") of the delivery thread: a
    webhook URL can be a credential itself (a Slack incoming webhook's is)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return threading.current_thread().name != _THREAD


_THREAD = "flaudit-webhooks"
_QUIET = _NotFromDeliveries()


def sign(secret: str, body: bytes, timestamp: int) -> str:
    """The ``X-Flaudit-Signature`` header value of ``body`` sent at ``timestamp``."""
    mac = hmac.new(
        secret.encode("ascii"), f"{timestamp}.".encode("ascii") + body, hashlib.sha256
    ).hexdigest()
    return f"t={timestamp},v1={mac}"


# -- subscriptions ------------------------------------------------------------------------
def _seal(store: Store, secret: str) -> str:
    raw = bytes.fromhex(secret.removeprefix("whsec_"))
    if store.cipher is None:
        return _PLAIN_PREFIX + raw.hex()
    return store.cipher.seal(int.from_bytes(raw, "big"))


def _open(store: Store, sealed: str) -> str:
    if sealed.startswith(_PLAIN_PREFIX):
        return "whsec_" + sealed[len(_PLAIN_PREFIX) :]
    if store.cipher is None:
        raise ValueError("the webhook secret is sealed and no secret key is configured")
    return "whsec_" + store.cipher.open(sealed).to_bytes(_SECRET_BYTES, "big").hex()


def create_webhook(
    store: Store, *, url: str, events: list[str], audit_id: str | None, format: str, link_base: str
) -> tuple[Webhook, str]:
    """Store a subscription; returns it and its signing secret (shown once, never again)."""
    secret = "whsec_" + secrets.token_bytes(_SECRET_BYTES).hex()
    row = Webhook(
        id=secrets.token_urlsafe(12),
        url=url,
        events="," + ",".join(sorted(set(events))) + ",",
        audit_id=audit_id,
        format=format,
        link_base=link_base.rstrip("/"),
        sealed_secret=_seal(store, secret),
        created_at=utcnow(),
    )
    with store.session() as s, s.begin():
        s.add(row)
    return row, secret


def list_webhooks(store: Store) -> list[Webhook]:
    with store.session() as s:
        return list(s.scalars(select(Webhook).order_by(Webhook.created_at, Webhook.id)))


def delete_webhook(store: Store, webhook_id: str) -> bool:
    with store.session() as s, s.begin():
        return s.execute(delete(Webhook).where(Webhook.id == webhook_id)).rowcount > 0


def list_deliveries(store: Store, audit_id: str, limit: int = 200) -> list[WebhookDelivery]:
    """The audit's deliveries, newest first."""
    with store.session() as s:
        return list(
            s.scalars(
                select(WebhookDelivery)
                .where(WebhookDelivery.audit_id == audit_id)
                .order_by(WebhookDelivery.id.desc())
                .limit(limit)
            )
        )


def webhook_events(row: Webhook) -> list[str]:
    return [e for e in row.events.split(",") if e]


# -- payloads -----------------------------------------------------------------------------
def _links(base: str, audit_id: str) -> dict:
    return {
        "page": f"{base}/ui/#/audits/{audit_id}",
        "api": f"{base}/audits/{audit_id}",
        "report": f"{base}/audits/{audit_id}/report",
    }


def _payload(delivery: WebhookDelivery, hook: Webhook, audit: Audit | None) -> dict:
    data = dict(delivery.data or {})
    body: dict = {
        "id": str(delivery.id),
        "event": delivery.event,
        "created_at": as_utc(delivery.created_at).isoformat(),
        "data": data,
    }
    if audit is not None:
        verdict = audit_verdict_view(audit)
        body["audit"] = {
            "id": audit.id,
            "name": audit.name,
            "status": audit.status,
            "reason": audit.reason,
            "verdict": {"status": verdict.get("status"), "summary": verdict.get("summary")},
            "links": _links(hook.link_base, audit.id),
        }
    elif delivery.audit_id is not None:
        body["audit"] = {"id": delivery.audit_id, "deleted": True}
    return body


def _slack_text(body: dict) -> str:
    audit = body.get("audit") or {}
    name = audit.get("name") or audit.get("id") or "?"
    data = body.get("data") or {}
    head = {
        "alarm.fired": f":rotating_light: flaudit: the privacy claim of audit *{name}* is refuted "
        f"(alarm fired at round {data.get('round')})",
        "audit.ended": f"flaudit: audit *{name}* ended ({audit.get('status')})",
        "audit.failed": f":warning: flaudit: audit *{name}* failed: {audit.get('reason')}",
        "gap.recorded": f"flaudit: audit *{name}* recorded a gap at round {data.get('round')} "
        f"({data.get('kind')}): {data.get('reason')}",
    }.get(body.get("event"), f"flaudit: {body.get('event')}")
    summary = (audit.get("verdict") or {}).get("summary")
    page = (audit.get("links") or {}).get("page")
    return "\n".join(x for x in (head, summary, page) if x)


def _body(payload: dict, format: str) -> bytes:
    if format == "slack":
        payload = {"text": _slack_text(payload)}
    return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()


# -- the dispatcher -----------------------------------------------------------------------
class WebhookDispatcher:
    """The background thread of one app that queues and delivers webhook events.

    Parameters
    ----------
    store : Store
    backoff : float
        Seconds before the first retry; doubled after each failed attempt.
    max_attempts : int
        Attempts before a delivery is marked ``failed``.
    timeout : float
        Seconds one attempt may take (a slow receiver delays only the other deliveries).
    poll : float
        Seconds between looks at the database for due deliveries (another instance's, or a
        retry).
    """

    def __init__(
        self,
        store: Store,
        *,
        backoff: float = 10.0,
        max_attempts: int = 8,
        timeout: float = 10.0,
        poll: float = 1.0,
        allow_private: bool = False,
    ) -> None:
        self.store = store
        self.allow_private = allow_private  # webhook_urls.py: checked again at each delivery
        self.backoff, self.max_attempts, self.timeout, self.poll = (
            backoff,
            max_attempts,
            timeout,
            poll,
        )
        self._events: queue.Queue = queue.Queue(maxsize=_QUEUE_SIZE)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client = httpx.Client(timeout=timeout, follow_redirects=False)

    def __repr__(self) -> str:
        return "WebhookDispatcher()"

    def notify(self, event: str, audit_id: str | None, data: dict) -> None:
        """Queue ``event`` of ``audit_id`` (never blocks: a full queue drops it, logged)."""
        try:
            self._events.put_nowait((event, audit_id, dict(data)))
        except queue.Full:
            log.warning("webhooks: event queue full; %s event dropped", event)
            return
        self._wake.set()

    def wake(self) -> None:
        """Look for due deliveries now (an audit ended: its rows were just written)."""
        self._wake.set()

    def start(self) -> None:
        logging.getLogger("httpx").addFilter(_QUIET)  # once: addFilter skips a filter it has
        self._thread = threading.Thread(target=self._loop, name=_THREAD, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + 5)
        self._client.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.poll)
            self._wake.clear()
            try:
                self._queue_events()
                while not self._stop.is_set() and self._deliver_due():
                    pass
            except Exception as exc:  # the kind only: no URLs, no connection strings
                log.warning("webhooks: delivery loop error (%s)", type(exc).__name__)

    def _queue_events(self) -> None:
        while True:
            try:
                event, audit_id, data = self._events.get_nowait()
            except queue.Empty:
                return
            with self.store.session() as s, s.begin():
                queue_webhook_deliveries(s, event, audit_id, data)

    def _deliver_due(self) -> int:
        """Claim and attempt the due deliveries; how many were attempted."""
        now = utcnow()
        with self.store.session() as s:
            due = s.execute(
                select(WebhookDelivery.id, WebhookDelivery.next_attempt_at)
                .where(WebhookDelivery.status == "pending", WebhookDelivery.next_attempt_at <= now)
                .order_by(WebhookDelivery.next_attempt_at)
                .limit(_BATCH)
            ).all()
        attempted = 0
        for delivery_id, when in due:
            if self._stop.is_set():
                break
            # claim it (another instance on this database may look at the same rows)
            hold = now + timedelta(seconds=self.timeout + 30)
            with self.store.session() as s, s.begin():
                claimed = (
                    s.execute(
                        update(WebhookDelivery)
                        .where(
                            WebhookDelivery.id == delivery_id,
                            WebhookDelivery.status == "pending",
                            WebhookDelivery.next_attempt_at == when,
                        )
                        .values(next_attempt_at=hold)
                    ).rowcount
                    > 0
                )
            if claimed:
                self._attempt(delivery_id)
                attempted += 1
        return attempted

    def _attempt(self, delivery_id: int) -> None:
        with self.store.session() as s:
            delivery = s.get(WebhookDelivery, delivery_id)
            hook = None if delivery is None else s.get(Webhook, delivery.webhook_id)
            if hook is None:
                return  # the webhook was deleted meanwhile (its deliveries go with it)
            sealed = s.scalar(select(Webhook.sealed_secret).where(Webhook.id == hook.id))
            payload = delivery.payload
            if payload is None:
                audit = s.get(Audit, delivery.audit_id) if delivery.audit_id else None
                payload = json.dumps(_payload(delivery, hook, audit), allow_nan=False)
            attempts = delivery.attempts + 1
        body = _body(json.loads(payload), hook.format)
        error = None
        try:
            headers = {
                "Content-Type": "application/json",
                "User-Agent": "flaudit-webhooks",
                "X-Flaudit-Event": delivery.event,
                "X-Flaudit-Delivery": str(delivery.id),
                "X-Flaudit-Signature": sign(_open(self.store, sealed), body, int(time.time())),
            }
            # DNS may have changed since the subscription: checked again, and the request
            # goes to the address checked (webhook_urls.py)
            url, host, extensions = pinned_request(hook.url, allow_private=self.allow_private)
            response = self._client.post(
                url, content=body, headers={**headers, **host}, extensions=extensions
            )
            if not 200 <= response.status_code < 300:
                error = f"HTTP {response.status_code}"
        except WebhookURLRefused as exc:  # the host's name only, never the URL's path or query
            error = f"refused: {exc}"
        except httpx.HTTPError as exc:
            error = type(exc).__name__
        except Exception as exc:  # a secret that cannot be opened, ...: the kind only
            error = type(exc).__name__
        self._record(delivery_id, payload, attempts, error)

    def _record(self, delivery_id: int, payload: str, attempts: int, error: str | None) -> None:
        now = utcnow()
        values: dict = {"payload": payload, "attempts": attempts, "last_error": error}
        if error is None:
            values.update(status="delivered", delivered_at=now, next_attempt_at=now)
        elif attempts >= self.max_attempts:
            values.update(status="failed", next_attempt_at=now)
            log.warning(
                "webhooks: delivery %s failed after %d attempts (%s)", delivery_id, attempts, error
            )
        else:
            delay = min(self.backoff * 2 ** (attempts - 1), _MAX_BACKOFF)
            values.update(next_attempt_at=now + timedelta(seconds=delay))
        with self.store.session() as s, s.begin():
            s.execute(
                update(WebhookDelivery).where(WebhookDelivery.id == delivery_id).values(**values)
            )
