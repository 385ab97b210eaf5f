"""Ingest routes used by the ServerApp's ``HttpRoundReporter`` (docs/architecture.md).

Bodies are raw little-endian float32 vectors (``Content-Type: application/octet-stream``).
Oversized bodies are refused from ``Content-Length`` before reading, and reading stops as soon
as a streamed body passes the limit. Every 2xx means the data is committed to the database.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from ..auth import require_run_token
from ..live import IngestError
from ..schemas import FinalMetricsQuery, IngestAck, RoundMetadataQuery
from .deps import AuditId

router = APIRouter(prefix="/audits", tags=["ingest"], dependencies=[Depends(require_run_token)])

_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/octet-stream": {
                "schema": {"type": "string", "format": "binary"},
            }
        },
        "description": "Raw little-endian float32 vector of length d.",
    }
}
_ERRORS = {
    400: {"description": "Body not a whole number of float32 values, or truncated."},
    401: {"description": "Missing or invalid run token."},
    404: {"description": "No audit with this id."},
    409: {"description": "Out of order, audit not running, or initial model missing."},
    413: {"description": "Body larger than 4*d bytes or the configured maximum."},
    415: {"description": "Content-Type is not application/octet-stream."},
    422: {"description": "Wrong length, NaN/Inf values, or invalid query metadata."},
}


def _fail(code: int, message: str) -> HTTPException:
    return HTTPException(status_code=code, detail=message)


async def read_float32_body(request: Request, *, limit: int, what: str) -> np.ndarray:
    """Read a raw float32 body of at most ``limit`` bytes and check it value by value."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/octet-stream":
        raise _fail(
            415,
            f"{what}: Content-Type must be application/octet-stream (raw little-endian float32), "
            f"got {content_type or 'none'!r}",
        )
    declared = request.headers.get("content-length")
    declared_len = None
    if declared is not None:
        try:
            declared_len = int(declared)
        except ValueError:
            raise _fail(400, f"{what}: invalid Content-Length header") from None
        if declared_len > limit:
            raise _fail(
                413, f"{what}: body of {declared_len} bytes exceeds the limit of {limit} bytes"
            )
    chunks: list[bytes] = []
    total = 0
    try:
        async for chunk in request.stream():
            total += len(chunk)
            if total > limit:
                raise _fail(413, f"{what}: body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise _fail(400, f"{what}: truncated body (client disconnected after {total} bytes)") from None
    if declared_len is not None and total != declared_len:
        raise _fail(
            400, f"{what}: truncated body: Content-Length is {declared_len}, received {total} bytes"
        )
    if total == 0:
        raise _fail(422, f"{what}: empty body; expected raw little-endian float32 values")
    if total % 4:
        raise _fail(
            400,
            f"{what}: body length {total} bytes is not a multiple of 4; expected raw "
            "little-endian float32 values (wrong dtype or truncated body)",
        )
    vector = np.frombuffer(b"".join(chunks), dtype="<f4")
    bad = np.flatnonzero(~np.isfinite(vector))
    if bad.size:
        kinds = "NaN" if np.isnan(vector[bad[0]]) else "Inf"
        raise _fail(
            422,
            f"{what}: contains {bad.size} non-finite value(s) (NaN or Inf); first is {kinds} at "
            f"index {int(bad[0])}",
        )
    return vector


async def _precheck(request: Request, audit_id: str, *, need_dim: bool):
    audit = await run_in_threadpool(request.app.state.store.get_audit, audit_id)
    if audit is None:
        raise _fail(404, f"audit {audit_id!r} not found")
    if need_dim and audit.dim is None:
        raise _fail(409, "send the initial model first (PUT /audits/{id}/initial-model)")
    return audit


async def _ingest(request: Request, func, *args):
    audit_id = args[0]
    cache = request.app.state.read_cache
    store = request.app.state.store

    def work():
        try:
            return func(*args)
        finally:
            cache.refresh(store, audit_id)

    try:
        return await run_in_threadpool(work)
    except IngestError as exc:
        raise _fail(exc.status_code, exc.message) from None


def _check_length(vector: np.ndarray, dim: int, what: str) -> None:
    if vector.shape[0] != dim:
        raise _fail(
            422,
            f"{what}: wrong length: expected {dim} float32 values ({4 * dim} bytes), "
            f"got {vector.shape[0]}",
        )


async def _read_vector(request: Request, dim: int, what: str) -> np.ndarray:
    """The body as ``d`` float32 values: read at most ``4 d`` bytes (or the body limit), 422 if it
    is not exactly ``d`` values."""
    limit = min(4 * dim, request.app.state.settings.max_body_bytes)
    vector = await read_float32_body(request, limit=limit, what=what)
    _check_length(vector, dim, what)
    return vector


@router.put(
    "/{audit_id}/initial-model",
    response_model=IngestAck,
    responses=_ERRORS,
    openapi_extra=_BODY,
    summary="Ingest θ_0 (sets the model dimension d)",
)
async def put_initial_model(audit_id: AuditId, request: Request) -> IngestAck:
    await _precheck(request, audit_id, need_dim=False)
    settings = request.app.state.settings
    vector = await read_float32_body(request, limit=settings.max_body_bytes, what="initial model")
    result = await _ingest(request, request.app.state.live.ingest_initial, audit_id, vector)
    return IngestAck(audit_id=audit_id, stored=result == "stored", dim=int(vector.shape[0]))


@router.put(
    "/{audit_id}/rounds/{t}",
    response_model=IngestAck,
    responses=_ERRORS,
    openapi_extra=_BODY,
    summary="Ingest round t's model delta Δ_t with its metadata",
)
async def put_round(
    audit_id: AuditId,
    t: Annotated[int, Path(ge=1, le=100_000, description="Round number, 1-based.")],
    metadata: Annotated[RoundMetadataQuery, Query()],
    request: Request,
) -> IngestAck:
    """Idempotent: the same t again is a no-op (200, `stored: false`). t must be the next
    round; later rounds get 409 before the body is read."""
    audit = await _precheck(request, audit_id, need_dim=True)
    if t <= audit.rounds_stored:
        return IngestAck(audit_id=audit_id, stored=False, round=t, dim=audit.dim)
    if audit.status != "running":
        raise _fail(409, f"audit is {audit.status}; ingest refused")
    if t != audit.rounds_stored + 1:
        raise _fail(
            409, f"round {t} is out of order: the next round must be {audit.rounds_stored + 1}"
        )
    vector = await _read_vector(request, audit.dim, f"round {t} delta")
    result = await _ingest(
        request,
        request.app.state.live.ingest_round,
        audit_id,
        t,
        vector,
        metadata.model_dump(),
    )
    return IngestAck(audit_id=audit_id, stored=result == "stored", round=t, dim=audit.dim)


@router.put(
    "/{audit_id}/final-model",
    response_model=IngestAck,
    responses=_ERRORS,
    openapi_extra=_BODY,
    summary="Ingest the final model θ_T (ends the audit: succeeded)",
)
async def put_final_model(
    audit_id: AuditId,
    metrics: Annotated[FinalMetricsQuery, Query()],
    request: Request,
) -> IngestAck:
    audit = await _precheck(request, audit_id, need_dim=True)
    if audit.has_final:
        return IngestAck(audit_id=audit_id, stored=False, dim=audit.dim)
    vector = await _read_vector(request, audit.dim, "final model")
    values = {k: v for k, v in metrics.model_dump().items() if v is not None}
    result = await _ingest(request, request.app.state.live.ingest_final, audit_id, vector, values)
    return IngestAck(audit_id=audit_id, stored=result == "stored", dim=audit.dim)
