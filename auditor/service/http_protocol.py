"""The HTTP protocol ``flaudit serve`` runs under uvicorn: uvicorn's, plus a request-head timeout.

uvicorn (0.49) closes idle keep-alive connections after ``timeout_keep_alive`` seconds, but the
first byte of a request cancels that timer, and a new connection has no timer at all: a client
that opens connections and sends its request line and headers a byte at a time (slowloris) holds
each connection for ever. :class:`HeaderTimeout` bounds that time.

A connection waits for a request head from the moment it opens and from the end of each
response (keep-alive). If the head is not complete ``header_timeout_seconds`` later, the
connection is closed; if part of a head has arrived, it is answered ``408 Request Timeout``
first. A connection on which nothing arrived is closed without an answer, as uvicorn closes
idle keep-alive connections: a client whose request crossed the close then retries it instead of
taking a 408 for its answer. Request bodies (``auditor/service/limits.py``) and responses
(streamed CSV, the dashboard) are not timed here: the timer runs only while no request is in
progress.

:func:`http_protocol` makes the protocol class for ``uvicorn.run(http=...)`` on top of the
implementation uvicorn's ``http="auto"`` picks (httptools when installed, as with
``uvicorn[standard]``; h11 otherwise), so the service keeps the parser it had.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math

__all__ = ["HeaderTimeout", "http_protocol"]

logger = logging.getLogger("flaudit.service")


class HeaderTimeout:
    """Mixin for uvicorn's HTTP protocols (``H11Protocol``, ``HttpToolsProtocol``) that bounds the
    time to receive a request head; see the module docstring.

    It relies on what both protocols share: ``connection_made``, ``data_received``,
    ``connection_lost``, ``on_response_complete`` (called when a response has been sent), and
    ``cycle``, the request being served (``None`` before the first request head is complete).
    """

    #: Seconds allowed for a request line and headers (set by :func:`http_protocol`).
    header_timeout_seconds: float = 10.0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0  # bytes received since the timer was armed

    # asyncio.Protocol / uvicorn hooks
    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        if self._head_timer is not None:
            self._head_bytes += len(data)
        super().data_received(data)
        if not self._waiting_for_head():
            self._cancel_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request already received
        if self._waiting_for_head():
            self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    # the timer
    def _waiting_for_head(self) -> bool:
        """No request in progress on an open HTTP connection (not one upgraded to WebSocket)."""
        if self.transport is None or self.transport.is_closing():
            return False
        if self.transport.get_protocol() is not self:
            return False
        return self.cycle is None or self.cycle.response_complete

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        if self._waiting_for_head():
            self._head_bytes = 0
            self._head_timer = self.loop.call_later(
                self.header_timeout_seconds, self._head_timed_out
            )

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._waiting_for_head():
            return
        if self._head_bytes:
            logger.info(
                "%s: request head not received within %g s: 408, connection closed",
                _peer(self.client), self.header_timeout_seconds,
            )
            self.transport.write(self._timeout_response())
        self.transport.close()

    def _timeout_response(self) -> bytes:
        body = json.dumps(
            {
                "detail": f"request head not received within {self.header_timeout_seconds:g} s "
                "(docs/api.md, Limits)"
            }
        ).encode()
        lines = [b"HTTP/1.1 408 Request Timeout"]
        lines += [name + b": " + value for name, value in self.server_state.default_headers]
        lines += [
            b"content-type: application/json",
            b"content-length: " + str(len(body)).encode(),
            b"connection: close",
        ]
        return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _peer(client: tuple[str, int] | None) -> str:
    return "%s:%d" % client if client else "client"


def http_protocol(*, header_timeout_seconds: float, base: type | None = None) -> type:
    """The HTTP protocol class for ``uvicorn.run(http=...)``.

    Parameters
    ----------
    header_timeout_seconds : float
        Time allowed for a request line and headers (finite, > 0).
    base : type, optional
        The uvicorn protocol to extend; default the one ``http="auto"`` picks.

    Raises
    ------
    ValueError
        If ``header_timeout_seconds`` is not a finite number > 0.
    """
    if not (math.isfinite(header_timeout_seconds) and header_timeout_seconds > 0):
        raise ValueError(
            f"header_timeout_seconds must be a finite number > 0, got {header_timeout_seconds!r}"
        )
    if base is None:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        base = AutoHTTPProtocol
    return type(
        f"HeaderTimeout{base.__name__}",
        (HeaderTimeout, base),
        {"header_timeout_seconds": float(header_timeout_seconds), "__module__": __name__},
    )
