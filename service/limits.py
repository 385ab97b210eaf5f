"""Request limits enforced before routing, so before authentication and before any body parsing.

:class:`RequestLimits` is a pure ASGI middleware:

* body size: a request whose ``Content-Length`` exceeds its route's limit is answered 413 without
  reading a byte of the body; a body without ``Content-Length`` (chunked) is counted while it
  streams and the request fails with 413 as soon as it passes the limit. Binary ingest routes
  (``PUT /audits/{id}/initial-model|rounds/{t}|final-model``, and a record-level audit's
  ``PUT /audits/{id}/record/rounds/{t}``) may carry up to
  ``Settings.max_body_bytes`` (the route itself then allows only ``4 d`` bytes); every other
  route up to ``Settings.max_json_body_bytes``.
* body read time: the whole body must arrive within ``Settings.body_timeout_seconds`` of the first
  read (408 otherwise), so partial bodies cannot hold a worker thread or memory for ever.

The time to receive the request head and its size are bounded below the ASGI layer, in
``flaudit serve``'s HTTP protocol (:mod:`flaudit.service.http_protocol`,
``Settings.header_timeout_seconds``, ``MAX_HEAD_BYTES``).
"""

from __future__ import annotations

import asyncio
import json
import re
import time

from fastapi import HTTPException

__all__ = ["RequestLimits", "is_ingest_path"]

_INGEST_PATH = re.compile(
    r"^/audits/[^/]+/(initial-model|rounds/[^/]+|final-model|record/rounds/[^/]+)/?$"
)


def is_ingest_path(path: str) -> bool:
    """True for the binary ingest routes (large float32 bodies)."""
    return _INGEST_PATH.match(path) is not None


def _message(status: int, detail: str) -> tuple[dict, dict]:
    body = json.dumps({"detail": detail}).encode()
    start = {
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ],
    }
    return start, {"type": "http.response.body", "body": body}


class RequestLimits:
    """ASGI middleware bounding request body size and body read time (see the module docstring).

    Parameters
    ----------
    app : ASGI application
    max_json_body_bytes : int
        Limit for every route but the binary ingest routes.
    max_ingest_body_bytes : int
        Limit for the binary ingest routes.
    body_timeout_seconds : float
        Time allowed to receive the whole body, from the first read.
    """

    def __init__(
        self,
        app,
        *,
        max_json_body_bytes: int,
        max_ingest_body_bytes: int,
        body_timeout_seconds: float,
    ) -> None:
        self.app = app
        self.max_json_body_bytes = max_json_body_bytes
        self.max_ingest_body_bytes = max_ingest_body_bytes
        self.body_timeout_seconds = body_timeout_seconds

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        limit = self.max_ingest_body_bytes if is_ingest_path(path) else self.max_json_body_bytes
        declared = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                break
        if declared is not None and (declared < 0 or declared > limit):
            detail = (
                "invalid Content-Length header"
                if declared < 0
                else f"request body of {declared} bytes exceeds the limit of {limit} bytes for "
                f"{path} (docs/api.md, Limits)"
            )
            start, body = _message(400 if declared < 0 else 413, detail)
            await send(start)
            await send(body)
            return

        received = 0
        deadline: float | None = None
        complete = False
        timeout = self.body_timeout_seconds
        too_slow = f"request body not received within {timeout:g} s (docs/api.md, Limits)"

        async def limited_receive():
            nonlocal received, deadline, complete
            if complete:  # body read: later receives only wait for the disconnect
                return await receive()
            if deadline is None:
                deadline = time.monotonic() + timeout
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise HTTPException(408, too_slow)
            try:
                message = await asyncio.wait_for(receive(), remaining)
            except TimeoutError:
                raise HTTPException(408, too_slow) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise HTTPException(
                        413,
                        f"request body exceeds the limit of {limit} bytes for {path} "
                        "(docs/api.md, Limits)",
                    )
                complete = not message.get("more_body", False)
            return message

        await self.app(scope, limited_receive, send)
