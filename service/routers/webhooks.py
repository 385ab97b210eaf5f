"""Alert webhooks: subscribe (``POST /webhooks``), list, delete, and an audit's delivery history
(``GET /audits/{id}/webhook-deliveries``). docs/operations.md, "Alert webhooks"."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Request, Response, status
from fastapi.exceptions import RequestValidationError
from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field, field_validator
from starlette.concurrency import run_in_threadpool

from ..auth import read_access, require_api_key
from ..store import Store
from ..strict_json import StrictJSONRoute
from ..tables import WEBHOOK_EVENTS, Webhook, as_utc
from ..webhook_urls import WebhookURLRefused, resolve_webhook_host
from ..webhooks import (
    create_webhook,
    delete_webhook,
    list_deliveries,
    list_webhooks,
    webhook_events,
)
from .deps import AuditId

router = APIRouter(tags=["webhooks"], route_class=StrictJSONRoute)

_AUTH = {
    401: {"description": "Missing or invalid API key."},
    503: {"description": "No API key configured on the server."},
}

#: the same as ``tables.WEBHOOK_EVENTS`` (tests/service/test_webhooks.py checks)
WebhookEvent = Literal["alarm.fired", "audit.ended", "audit.failed", "gap.recorded"]


class WebhookIn(BaseModel):
    """A subscription: where to POST which events, for one audit or all."""

    model_config = ConfigDict(extra="forbid")

    url: AnyHttpUrl = Field(description="http or https URL the events are POSTed to.")
    events: list[WebhookEvent] = Field(
        default=list(WEBHOOK_EVENTS),
        min_length=1,
        description="Events to deliver: alarm.fired, audit.ended (succeeded or cancelled), "
        "audit.failed, gap.recorded. Default: all.",
    )
    audit_id: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_-]{1,32}$",
        description="Only this audit's events (default: every audit).",
    )
    format: Literal["json", "slack"] = Field(
        default="json",
        description='"json": the signed event; "slack": {"text": ...} for a '
        "Slack incoming webhook (signed too).",
    )

    @field_validator("url")
    @classmethod
    def _short(cls, value: AnyHttpUrl) -> AnyHttpUrl:
        if len(str(value)) > 2000:
            raise ValueError("url must have at most 2000 characters")
        return value


class WebhookOut(BaseModel):
    id: str
    url: str
    events: list[WebhookEvent]
    audit_id: str | None
    format: Literal["json", "slack"]
    created_at: datetime


class WebhookCreated(WebhookOut):
    secret: str = Field(
        description="The signing secret: returned once, here, never again. "
        "Verify X-Flaudit-Signature with it (docs/operations.md)."
    )


class WebhookList(BaseModel):
    items: list[WebhookOut]


class DeliveryOut(BaseModel):
    id: int
    webhook_id: str
    event: WebhookEvent
    status: Literal["pending", "delivered", "failed"]
    attempts: int
    last_error: str | None
    created_at: datetime
    next_attempt_at: datetime | None = Field(description="When a pending delivery is tried next.")
    delivered_at: datetime | None


class DeliveryList(BaseModel):
    items: list[DeliveryOut]


def _out(row: Webhook) -> dict:
    return {
        "id": row.id,
        "url": row.url,
        "events": webhook_events(row),
        "audit_id": row.audit_id,
        "format": row.format,
        "created_at": as_utc(row.created_at),
    }


@router.post(
    "/webhooks",
    status_code=status.HTTP_201_CREATED,
    response_model=WebhookCreated,
    dependencies=[Depends(require_api_key)],
    responses={
        **_AUTH,
        404: {"description": "No audit with this audit_id."},
        422: {
            "description": "Invalid body, or a url whose host is or resolves to a private, "
            "loopback or link-local address (allowed only with "
            "FLAUDIT_WEBHOOK_ALLOW_PRIVATE=1 on the server)."
        },
    },
    summary="Subscribe a URL to alert events (the signing secret is returned once)",
)
def post_webhook(body: WebhookIn, request: Request) -> dict:
    """Events are POSTed as JSON, signed with HMAC-SHA256 over `<timestamp>.<raw body>`
    (`X-Flaudit-Signature: t=<unix>,v1=<hex>`), retried with exponential backoff. Links in the
    payloads start at this request's base URL. The URL's host must resolve to public
    addresses only (checked here and again at every delivery), unless the server sets
    `FLAUDIT_WEBHOOK_ALLOW_PRIVATE=1`."""
    store: Store = request.app.state.store
    try:
        resolve_webhook_host(
            str(body.url),
            allow_private=request.app.state.settings.webhook_allow_private,
            strict=False,
        )
    except WebhookURLRefused as exc:
        raise RequestValidationError(
            [
                {
                    "type": "value_error",
                    "loc": ("body", "url"),
                    "msg": str(exc),
                    "input": str(body.url),
                }
            ]
        ) from None
    if body.audit_id is not None and store.get_audit(body.audit_id) is None:
        raise HTTPException(status_code=404, detail=f"audit {body.audit_id!r} not found")
    row, secret = create_webhook(
        store,
        url=str(body.url),
        events=list(body.events),
        audit_id=body.audit_id,
        format=body.format,
        link_base=str(request.base_url),
    )
    return {**_out(row), "secret": secret}


@router.get(
    "/webhooks",
    response_model=WebhookList,
    dependencies=[Depends(require_api_key)],
    responses=_AUTH,
    summary="List the webhook subscriptions (never their secrets)",
)
def get_webhooks(request: Request) -> dict:
    return {"items": [_out(row) for row in list_webhooks(request.app.state.store)]}


@router.delete(
    "/webhooks/{webhook_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    dependencies=[Depends(require_api_key)],
    responses={**_AUTH, 404: {"description": "No webhook with this id."}},
    summary="Delete a webhook subscription and its pending deliveries",
)
def remove_webhook(
    request: Request,
    webhook_id: str = Path(pattern=r"^[A-Za-z0-9_-]{1,32}$", description="The webhook's id."),
) -> Response:
    if not delete_webhook(request.app.state.store, webhook_id):
        raise HTTPException(status_code=404, detail=f"webhook {webhook_id!r} not found")
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get(
    "/audits/{audit_id}/webhook-deliveries",
    response_model=DeliveryList,
    dependencies=[Depends(read_access)],
    responses={404: {"description": "No audit with this id."}},
    summary="The audit's webhook deliveries (newest first): event, status, attempts",
)
async def get_deliveries(audit_id: AuditId, request: Request) -> dict:
    store: Store = request.app.state.store

    def read() -> list | None:
        if store.get_audit(audit_id) is None:
            return None
        return [
            {
                "id": d.id,
                "webhook_id": d.webhook_id,
                "event": d.event,
                "status": d.status,
                "attempts": d.attempts,
                "last_error": d.last_error,
                "created_at": as_utc(d.created_at),
                "next_attempt_at": as_utc(d.next_attempt_at) if d.status == "pending" else None,
                "delivered_at": as_utc(d.delivered_at),
            }
            for d in list_deliveries(store, audit_id)
        ]

    items = await run_in_threadpool(read)
    if items is None:
        raise HTTPException(status_code=404, detail=f"audit {audit_id!r} not found")
    return {"items": items}
