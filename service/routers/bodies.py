"""Reading the ingest routes' raw bodies: little-endian float32 vectors, optionally followed
by int32 canary indices, streamed within a byte limit and checked value by value (the errors
name the problem: 400 truncated or not whole float32 values, 413 too large, 415 wrong type,
422 unusable). Split from :mod:`.ingest`, whose routes use them.
"""

from __future__ import annotations

import numpy as np
from fastapi import HTTPException, Request
from starlette.requests import ClientDisconnect

__all__ = [
    "UnusableBody",
    "check_length",
    "float32_values",
    "http_error",
    "participant_indices",
    "read_body",
    "read_float32_body",
    "read_round_body",
    "read_vector",
]


def http_error(code: int, message: str) -> HTTPException:
    """The ``HTTPException`` an ingest route raises: ``code`` with ``message`` as its detail."""
    return HTTPException(status_code=code, detail=message)


class UnusableBody(HTTPException):
    """A complete body the audit cannot use (not finite, wrong length): a 422 that also ends
    a running audit (docs/flower.md, "When an audit ends")."""

    def __init__(self, message: str) -> None:
        super().__init__(status_code=422, detail=message)


async def read_float32_body(request: Request, *, limit: int, what: str) -> np.ndarray:
    """Read a raw float32 body of at most ``limit`` bytes and check it value by value."""
    return float32_values(await read_body(request, limit=limit, what=what), what)


async def read_body(request: Request, *, limit: int, what: str) -> bytearray:
    """The raw octet-stream body (at most ``limit`` bytes, not empty), in one writable buffer."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/octet-stream":
        raise http_error(
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
            raise http_error(400, f"{what}: invalid Content-Length header") from None
        if declared_len > limit:
            raise http_error(
                413, f"{what}: body of {declared_len} bytes exceeds the limit of {limit} bytes"
            )
    # streamed into one buffer: with a Content-Length (every client of ours sends one) it is
    # allocated once at the declared size, so the body is never held twice (no chunk list +
    # join); without one, chunks are collected and joined (at most the limit, twice)
    buffer = bytearray(declared_len) if declared_len is not None else None
    chunks: list[bytes] = []
    total = 0
    try:
        async for chunk in request.stream():
            end = total + len(chunk)
            if end > limit:
                raise http_error(413, f"{what}: body exceeds the limit of {limit} bytes")
            if buffer is not None and end > declared_len:
                raise http_error(
                    400, f"{what}: body longer than its Content-Length ({declared_len})"
                )
            if buffer is not None:
                buffer[total:end] = chunk
            else:
                chunks.append(chunk)
            total = end
    except ClientDisconnect:
        raise http_error(
            400, f"{what}: truncated body (client disconnected after {total} bytes)"
        ) from None
    if declared_len is not None and total != declared_len:
        raise http_error(
            400, f"{what}: truncated body: Content-Length is {declared_len}, received {total} bytes"
        )
    if total == 0:
        raise http_error(422, f"{what}: empty body; expected raw little-endian float32 values")
    return buffer if buffer is not None else bytearray(b"".join(chunks))


def float32_values(data: bytearray | memoryview, what: str) -> np.ndarray:
    """The body's float32 values: a view of ``data`` (no copy), checked chunk by chunk."""
    total = len(data)
    if total % 4:
        raise http_error(
            400,
            f"{what}: body length {total} bytes is not a multiple of 4; expected raw "
            "little-endian float32 values (wrong dtype or truncated body)",
        )
    vector = np.frombuffer(data, dtype="<f4")
    step = 1 << 20
    for start in range(0, vector.shape[0], step):
        if np.isfinite(vector[start : start + step]).all():
            continue
        bad = np.flatnonzero(~np.isfinite(vector))
        kinds = "NaN" if np.isnan(vector[bad[0]]) else "Inf"
        raise UnusableBody(
            f"{what}: contains {bad.size} non-finite value(s) (NaN or Inf); first is {kinds} at "
            f"index {int(bad[0])}",
        )
    return vector


def check_length(vector: np.ndarray, dim: int, what: str) -> None:
    if vector.shape[0] != dim:
        raise UnusableBody(
            f"{what}: wrong length: expected {dim} float32 values ({4 * dim} bytes), "
            f"got {vector.shape[0]}",
        )


async def read_vector(request: Request, dim: int, what: str) -> np.ndarray:
    """The body as ``d`` float32 values: read at most ``4 d`` bytes (or the body limit), 422 if it
    is not exactly ``d`` values."""
    limit = min(4 * dim, request.app.state.settings.max_body_bytes)
    vector = await read_float32_body(request, limit=limit, what=what)
    check_length(vector, dim, what)
    return vector


def participant_indices(data: bytes, num_canaries: int) -> np.ndarray:
    """The appended int32 indices, checked: each in ``[0, k)``, none twice (422 naming
    ``participants`` otherwise)."""
    indices = np.frombuffer(data, dtype="<i4").astype(np.int64)
    if indices.size:
        if indices.min() < 0:
            raise http_error(422, f"participants: negative canary index {int(indices.min())}")
        if indices.max() >= num_canaries:
            raise http_error(
                422,
                f"participants: canary index {int(indices.max())} out of range "
                f"(num_canaries={num_canaries})",
            )
        if np.unique(indices).size != indices.size:
            raise http_error(422, "participants: a canary index is listed twice")
    return indices


async def read_round_body(
    request: Request, dim: int, num_participants: int | None, num_canaries: int, what: str
) -> tuple[np.ndarray, np.ndarray | None]:
    """``d`` float32 values, then ``num_participants`` int32 canary indices (if given)."""
    if num_participants is None:
        return await read_vector(request, dim, what), None
    if num_participants > num_canaries:
        raise http_error(
            422,
            f"num_participants: {num_participants} exceeds num_canaries={num_canaries}",
        )
    expected = 4 * (dim + num_participants)
    limit = min(expected, request.app.state.settings.max_body_bytes)
    data = await read_body(request, limit=limit, what=what)
    if len(data) != expected:
        message = (
            f"{what}: wrong length: expected {dim} float32 values and num_participants="
            f"{num_participants} int32 indices ({expected} bytes), got {len(data)} bytes"
        )
        if len(data) < 4 * dim:  # the update itself is short: unusable, the audit ends
            raise UnusableBody(message)
        # the update is whole but the indices are not the number announced: the request is
        # malformed (422 naming num_participants, nothing stored), the audit goes on
        raise http_error(422, f"num_participants: {message}")
    view = memoryview(data)  # slices of a memoryview share the body's buffer
    vector = float32_values(view[: 4 * dim], what)
    return vector, participant_indices(bytes(view[4 * dim :]), num_canaries)
