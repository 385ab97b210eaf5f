"""Why ``service/http_protocol.py`` stays (issue 29): uvicorn's own settings, at their strictest,
do not bound a request head in time or (with httptools) in size; the same server with our protocol
does. A real uvicorn server on a loopback port, raw sockets, both parsers.

uvicorn 0.49's settings that touch a slow client, and why none holds a trickled head:

* ``timeout_keep_alive`` is armed only after a response, and the first byte of the next request
  cancels it; a new connection has no timer at all.
* ``limit_concurrency`` counts open connections, finished heads or not, and is checked only when a
  head is complete: trickling clients take the slots and every real request is answered 503.
* ``h11_max_incomplete_event_size`` bounds an incomplete head's size on h11 only (answered 400);
  httptools, the parser of ``uvicorn[standard]``, has no limit. It does not bound time.
* ``timeout_graceful_shutdown`` and ``limit_max_requests`` act at shutdown or after whole requests.

docs/deployment.md ("Slow clients") has the table, and what a reverse proxy adds.
Timings are generous bounds, not speed targets: the limit is 1 s, a trickler runs for 5 s.
"""

from __future__ import annotations

import contextlib
import select
import time

import pytest
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from flaudit.service.http_protocol import http_protocol
from tests.processes import serve_in_thread
from tests.raw_http import connect, read_response, read_until_closed, send_all_you_can

LIMIT = 1  # uvicorn's timeout_keep_alive and our header timeout, in seconds
HOLD = 5.0  # how long a client trickles its head
TRICKLERS = 2
#: uvicorn's strictest settings for slow clients (what flaudit serve could pass instead)
STRICT = dict(
    timeout_keep_alive=LIMIT,
    limit_concurrency=TRICKLERS,
    h11_max_incomplete_event_size=1024,
    timeout_graceful_shutdown=LIMIT,
)


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(params=[H11Protocol, HttpToolsProtocol], ids=["h11", "httptools"])
def parser(request):
    return request.param


@pytest.fixture
def servers():
    with contextlib.ExitStack() as stack:

        def start(http):
            return stack.enter_context(
                serve_in_thread(app, lifespan="off", log_level="error", http=http, **STRICT)
            )

        yield start


def _trickle(socks, seconds):
    """Send each socket's head a byte every 0.2 s for ``seconds``; per socket, what the server
    answered and when it closed (seconds from the start), or ``None`` if it is still open."""
    for sock in socks:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    started = time.monotonic()
    ended: dict[int, tuple[bytes, float]] = {}
    while time.monotonic() - started < seconds and len(ended) < len(socks):
        for i, sock in enumerate(socks):
            if i in ended:
                continue
            send_all_you_can(sock, b"a")
            if select.select([sock], [], [], 0)[0]:
                ended[i] = (read_until_closed(sock), time.monotonic() - started)
        time.sleep(0.2)
    return [ended.get(i) for i in range(len(socks))]


def _get(port):
    with connect(port) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        return read_response(sock)


@pytest.mark.timeout(120)
def test_uvicorns_strictest_settings_let_a_trickled_head_hold_its_connection(parser, servers):
    port = servers(parser)
    assert _get(port).startswith(b"HTTP/1.1 200 ")
    socks = [connect(port) for _ in range(TRICKLERS)]
    try:
        ends = _trickle(socks, HOLD)
        # past timeout_keep_alive (1 s) five times over, every trickler is still connected...
        assert ends == [None] * TRICKLERS, ends
        # ...and holds a slot of limit_concurrency: a real request is turned away
        assert _get(port).startswith(b"HTTP/1.1 503 ")
    finally:
        for sock in socks:
            sock.close()


@pytest.mark.timeout(120)
def test_with_our_protocol_a_trickled_head_is_answered_408_within_the_limit(parser, servers):
    port = servers(http_protocol(header_timeout_seconds=LIMIT, base=parser))
    socks = [connect(port) for _ in range(TRICKLERS)]
    try:
        ends = _trickle(socks, HOLD)
    finally:
        for sock in socks:
            sock.close()
    for end in ends:
        assert end is not None, "a trickled head kept its connection past the limit"
        answer, closed_after = end
        assert answer.startswith(b"HTTP/1.1 408 ") and b"connection: close" in answer, answer
        assert closed_after < HOLD
    # the slots are free again
    assert _get(port).startswith(b"HTTP/1.1 200 ")


@pytest.mark.timeout(60)
def test_uvicorns_head_size_setting_holds_on_h11_only_for_incomplete_heads(parser, servers):
    port = servers(parser)
    with connect(port) as sock:  # a 60 KB header, then (the head still incomplete) its end
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 60_000)
        time.sleep(0.5)
        send_all_you_can(sock, b"\r\n\r\n")
        answer = read_until_closed(sock)
    # (h11 checks only a head still incomplete after a read; one read holding a whole 60 KB
    # head passes it too, which http_protocol.HeadSizeLimit also catches)
    if parser is H11Protocol:  # h11_max_incomplete_event_size: refused, but 400 and not 431
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:100]
    else:  # httptools: a 60 KB head over a 1 KB setting reaches the application
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:100]
