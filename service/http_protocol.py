"""The HTTP protocol ``flaudit serve`` runs under uvicorn: uvicorn's, plus limits on request heads.

uvicorn (0.49) closes idle keep-alive connections after ``timeout_keep_alive`` seconds, but the
first byte of a request cancels that timer, and a new connection has no timer at all: a client
that opens connections and sends its request line and headers a byte at a time (slowloris) holds
each connection for ever. :class:`HeaderTimeout` bounds that time.

A connection waits for a request head from the moment it opens and from the end of each
response (keep-alive). If the head is not complete ``header_timeout_seconds`` later, the
connection is closed; if part of a head has arrived, it is answered ``408 Request Timeout``
first. A connection on which nothing arrived is closed without an answer, as uvicorn closes
idle keep-alive connections: a client whose request crossed the close then retries it instead of
taking a 408 for its answer. Request bodies (``service/limits.py``) and responses
(streamed CSV, the dashboard) are not timed here: the timer runs only while no request is in
progress.

:class:`HeadSizeLimit` bounds the size of a request head (default 16 KiB) on both parsers. uvicorn
hands ``h11_max_incomplete_event_size`` to h11 only, and h11 applies it only to a head that is
still incomplete; httptools (llhttp) has no limit at all. A head over the limit is answered
``431 Request Header Fields Too Large`` and the connection closed; the request never reaches the
application. The size is what the parser reports for the head being parsed, so a large body or
another request read in the same ``data_received`` is never counted against it:

* httptools: the request target (``on_url``, in fragments) plus, per header (``on_header``), its
  name and value and 4 bytes for ``": "`` and CRLF. httptools keeps a header's name and value to
  itself until the header ends, so every read that falls entirely inside one unfinished head is
  also counted in raw bytes: an endless header is cut off after the limit plus one read, not
  buffered until the head timeout.
* h11: the raw bytes of a head still incomplete (h11's own ``max_incomplete_event_size``, which
  h11 reports with a 431 hint that uvicorn turns into a 400), and, once h11 has parsed a head,
  the same count as for httptools.

A head refused while earlier pipelined requests are being answered is answered 431 after their
responses, never in the middle of one.

:func:`http_protocol` makes the protocol class for ``uvicorn.run(http=...)`` on top of the
implementation uvicorn's ``http="auto"`` picks (httptools when installed, as with
``uvicorn[standard]``; h11 otherwise), so the service keeps the parser it had.

The mixins use uvicorn's protocol internals (``cycle``, ``conn``, ``server_state``,
``send_400_response``, the httptools callbacks), so pyproject.toml caps uvicorn at the newest
release the tests here passed on (``uvicorn[standard]>=0.30,<0.56``).

None of uvicorn's settings holds these limits (``timeout_keep_alive``, ``limit_concurrency``,
``h11_max_incomplete_event_size``, ...): tests/service/test_uvicorn_settings_slowloris.py shows it
and docs/deployment.md ("Slow clients") says what a reverse proxy in front adds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math

import h11

__all__ = ["MAX_HEAD_BYTES", "HeadSizeLimit", "HeaderTimeout", "http_protocol"]

logger = logging.getLogger("flaudit.service")

#: Default limit on a request head (request line and headers), in bytes.
MAX_HEAD_BYTES = 16 * 1024
#: Bytes counted per header on top of its name and value: ": " and CRLF.
HEADER_OVERHEAD_BYTES = 4


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
                _peer(self.client),
                self.header_timeout_seconds,
            )
            self.transport.write(self._timeout_response())
        self.transport.close()

    def _timeout_response(self) -> bytes:
        return _closing_response(
            self.server_state.default_headers,
            b"408 Request Timeout",
            f"request head not received within {self.header_timeout_seconds:g} s "
            "(docs/api.md, Limits)",
        )


class _HeadTooLarge(Exception):
    """Raised in an httptools callback to stop the parser at a head over the limit."""


class _SizedH11Connection(h11.Connection):
    """h11's server connection that also refuses a complete head over the limit.

    h11 raises ``RemoteProtocolError(error_status_hint=431)`` for an incomplete head over
    ``max_incomplete_event_size``; this class raises the same for a parsed head whose size
    (:func:`_head_size`) is over it, and calls ``on_too_large`` first in both cases.
    """

    def __init__(self, *, max_head_bytes: int, on_too_large) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_head_bytes)
        self.max_head_bytes = max_head_bytes
        self.on_too_large = on_too_large

    def next_event(self):
        try:
            event = super().next_event()
            if isinstance(event, h11.Request):
                size = _head_size(event.target, event.headers)
                if size > self.max_head_bytes:
                    raise h11.RemoteProtocolError(
                        f"request head of {size} bytes", error_status_hint=431
                    )
        except h11.RemoteProtocolError as exc:
            if exc.error_status_hint == 431:
                self.on_too_large()
            raise
        return event


class HeadSizeLimit:
    """Mixin for uvicorn's HTTP protocols (``H11Protocol``, ``HttpToolsProtocol``) that refuses a
    request head over ``max_head_bytes`` with 431 and closes the connection; see the module
    docstring.

    With httptools it counts what the parser reports through the callbacks uvicorn gives it
    (``on_message_begin``, ``on_url``, ``on_header``, ``on_headers_complete``) and stops the
    parser by raising in one; uvicorn then calls ``send_400_response``, which this class
    answers instead. With h11 it gives the protocol a :class:`_SizedH11Connection`. Both ways it
    relies on ``cycle`` (the last request parsed, ``None`` before the first) and
    ``on_response_complete`` to answer only once earlier responses are complete.
    """

    #: Largest request head accepted, in bytes (set by :func:`http_protocol`).
    max_head_bytes: int = MAX_HEAD_BYTES

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._head_refused = False
        self._head_open = False  # httptools: between on_message_begin and on_headers_complete
        self._heads_begun = 0
        self._head_size = 0  # what the parser reported of the current head
        self._head_raw_bytes = 0  # bytes of reads that fell entirely inside the current head
        if isinstance(getattr(self, "conn", None), h11.Connection):  # H11Protocol
            self.conn = _SizedH11Connection(
                max_head_bytes=self.max_head_bytes, on_too_large=self._refuse_head
            )

    # asyncio.Protocol / uvicorn hooks
    def data_received(self, data: bytes) -> None:
        if self._head_refused:  # closed, or closing once earlier responses are sent
            return
        continues_head = self._head_open
        heads_begun = self._heads_begun
        super().data_received(data)
        if continues_head and self._head_open and self._heads_begun == heads_begun:
            # httptools: the whole read belongs to the head that was already being parsed
            self._head_raw_bytes += len(data)
            if self._head_raw_bytes > self.max_head_bytes and not self._head_refused:
                self._refuse_head()

    def send_400_response(self, msg: str) -> None:
        if self._head_refused:  # the parser was stopped at a head over the limit: 431, not 400
            return
        super().send_400_response(msg)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._head_refused and self._no_response_pending():
            self._answer_431()

    # httptools parser callbacks (H11Protocol has none; nothing calls these then)
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_open = True
        self._heads_begun += 1
        self._head_size = self._head_raw_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._head_open:  # not a chunked body's trailer
            self._count_head(len(name) + len(value) + HEADER_OVERHEAD_BYTES)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_open = False
        super().on_headers_complete()

    # the limit
    def _count_head(self, size: int) -> None:
        self._head_size += size
        if self._head_size > self.max_head_bytes:
            self._refuse_head()
            raise _HeadTooLarge(f"request head over {self.max_head_bytes} bytes")

    def _refuse_head(self) -> None:
        self._head_refused = True
        logger.info(
            "%s: request head over %d bytes: 431, connection closed",
            _peer(self.client),
            self.max_head_bytes,
        )
        if self._no_response_pending():
            self._answer_431()
        # else on_response_complete answers once the responses before this head are sent

    def _no_response_pending(self) -> bool:
        if self.transport is None or self.transport.is_closing():
            return False
        return self.cycle is None or self.cycle.response_complete

    def _answer_431(self) -> None:
        self.transport.write(
            _closing_response(
                self.server_state.default_headers,
                b"431 Request Header Fields Too Large",
                f"request head (request line and headers) over the limit of "
                f"{self.max_head_bytes} bytes (docs/api.md, Limits)",
            )
        )
        self.transport.close()


def _head_size(target: bytes, headers) -> int:
    """The size counted for a parsed head: its target, and each header with its separators."""
    return len(target) + sum(
        len(name) + len(value) + HEADER_OVERHEAD_BYTES for name, value in headers
    )


def _closing_response(default_headers, status: bytes, detail: str) -> bytes:
    """A complete response with a JSON ``{"detail": ...}`` body and ``connection: close``."""
    body = json.dumps({"detail": detail}).encode()
    lines = [b"HTTP/1.1 " + status]
    lines += [name + b": " + value for name, value in default_headers]
    lines += [
        b"content-type: application/json",
        b"content-length: " + str(len(body)).encode(),
        b"connection: close",
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "client"


def http_protocol(
    *,
    header_timeout_seconds: float,
    max_head_bytes: int = MAX_HEAD_BYTES,
    base: type | None = None,
) -> type:
    """The HTTP protocol class for ``uvicorn.run(http=...)``: ``base`` with :class:`HeadSizeLimit`
    and :class:`HeaderTimeout`.

    Parameters
    ----------
    header_timeout_seconds : float
        Time allowed for a request line and headers (finite, > 0).
    max_head_bytes : int, optional
        Largest request head accepted (> 0); default :data:`MAX_HEAD_BYTES`. It replaces
        uvicorn's ``h11_max_incomplete_event_size``, which the class does not read.
    base : type, optional
        The uvicorn protocol to extend; default the one ``http="auto"`` picks.

    Raises
    ------
    ValueError
        If ``header_timeout_seconds`` is not a finite number > 0 or ``max_head_bytes`` not an
        integer > 0.
    """
    if not (math.isfinite(header_timeout_seconds) and header_timeout_seconds > 0):
        raise ValueError(
            f"header_timeout_seconds must be a finite number > 0, got {header_timeout_seconds!r}"
        )
    if type(max_head_bytes) is not int or max_head_bytes < 1:  # bool is not a size either
        raise ValueError(f"max_head_bytes must be an integer > 0, got {max_head_bytes!r}")
    if base is None:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        base = AutoHTTPProtocol
    return type(
        f"HeadLimits{base.__name__}",
        (HeadSizeLimit, HeaderTimeout, base),
        {
            "header_timeout_seconds": float(header_timeout_seconds),
            "max_head_bytes": max_head_bytes,
            "__module__": __name__,
        },
    )
