"""The request-head timeout of ``flaudit serve``'s HTTP protocol, on both uvicorn parsers (h11 and
httptools), with uvicorn running a small ASGI app in a thread of the test process.

Timings are generous bounds, not speed targets: the timeout is 0.5 s, and a stalled connection
only has to be closed within 30 s.
"""

from __future__ import annotations

import asyncio
import select
import socket
import threading
import time

import pytest
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from flaudit.auditor.service.http_protocol import http_protocol
from tests.processes import free_port

TIMEOUT = 0.5
STREAM_CHUNKS = 6  # /stream sends one chunk every TIMEOUT / 2: longer than TIMEOUT in all


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b""
    while True:  # read the whole body (as the service's routes do)
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/csv")]})
        for i in range(STREAM_CHUNKS):
            await asyncio.sleep(TIMEOUT / 2)
            await send({"type": "http.response.body", "body": b"row,%d\n" % i, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    answer = b"%s %d" % (scope["path"].encode(), len(body))
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(answer)).encode())]})
    await send({"type": "http.response.body", "body": answer})


@pytest.fixture(params=[H11Protocol, HttpToolsProtocol], ids=["h11", "httptools"])
def port(request):
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, lifespan="off", log_level="warning",
        http=http_protocol(header_timeout_seconds=TIMEOUT, base=request.param),
        timeout_keep_alive=60,  # so that only the head timeout closes idle connections
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield port
    server.should_exit = True
    thread.join(timeout=30)


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30)


def _read_response(sock: socket.socket) -> bytes:
    """One response with a Content-Length or a chunked body; b"" if the server closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        while not body.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(65536)
            assert chunk, data
            body += chunk
    else:
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(body) < length:
            chunk = sock.recv(65536)
            assert chunk, data
            body += chunk
    return head + b"\r\n\r\n" + body


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (what arrived before a reset)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def test_a_stalled_partial_head_is_answered_408_and_closed(port):
    with _connect(port) as sock:
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\nX-A: ")
        answer = _read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"connection: close" in answer and b"request head not received" in answer


def test_a_connection_that_sends_nothing_is_closed_without_an_answer(port):
    with _connect(port) as sock:
        assert _read_until_closed(sock) == b""


def test_trickled_bytes_do_not_extend_the_deadline(port):
    with _connect(port) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        deadline = time.monotonic() + 30
        answer = None
        while answer is None and time.monotonic() < deadline:
            try:
                sock.sendall(b"a")  # one byte every TIMEOUT / 5
            except OSError:  # reset: the server closed
                answer = b""
            else:
                readable, _, _ = select.select([sock], [], [], TIMEOUT / 5)
                if readable:
                    answer = _read_until_closed(sock)
    assert answer is not None, "the connection was still open after 30 s"
    assert answer.startswith(b"HTTP/1.1 408 ") or answer == b"", answer


def test_a_head_sent_in_pieces_within_the_timeout_is_served(port):
    with _connect(port) as sock:
        for piece in (b"GET /pieces HT", b"TP/1.1\r\nHo", b"st: x\r\n", b"\r\n"):
            sock.sendall(piece)
            time.sleep(TIMEOUT / 10)
        assert _read_response(sock).endswith(b"/pieces 0")


def test_keep_alive_restarts_the_timer_after_each_response(port):
    with _connect(port) as sock:
        for i in range(4):  # 4 requests, TIMEOUT / 2 apart: longer than TIMEOUT in all
            sock.sendall(b"GET /r%d HTTP/1.1\r\nHost: x\r\n\r\n" % i)
            assert _read_response(sock).endswith(b"/r%d 0" % i)
            time.sleep(TIMEOUT / 2)
        # then idle: closed without an answer
        assert _read_until_closed(sock) == b""


def test_a_partial_head_after_a_response_is_answered_408(port):
    with _connect(port) as sock:
        sock.sendall(b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_response(sock).endswith(b"/first 0")
        sock.sendall(b"GET /second HTTP/1.1\r\n")
        assert _read_until_closed(sock).startswith(b"HTTP/1.1 408 ")


def test_slow_bodies_and_slow_responses_are_not_timed(port):
    with _connect(port) as sock:
        sock.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n")
        for byte in b"abcd":  # the body takes twice the head timeout
            time.sleep(TIMEOUT / 2)
            sock.sendall(bytes([byte]))
        assert _read_response(sock).endswith(b"/upload 4")
        sock.sendall(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        streamed = _read_response(sock)
        assert streamed.startswith(b"HTTP/1.1 200 ")
        assert b"row,%d\n" % (STREAM_CHUNKS - 1) in streamed
        # the connection is still usable
        sock.sendall(b"GET /after HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_response(sock).endswith(b"/after 0")


def test_pipelined_requests_are_all_served(port):
    with _connect(port) as sock:
        sock.sendall(b"".join(b"GET /p%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(3)))
        answers = _read_until_closed(sock)  # the three responses, then the close
    assert answers.count(b"HTTP/1.1 200 ") == 3, answers
    assert answers.index(b"/p0 0") < answers.index(b"/p1 0") < answers.index(b"/p2 0")


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf")])
def test_the_timeout_must_be_finite_and_positive(value):
    with pytest.raises(ValueError, match="header_timeout_seconds"):
        http_protocol(header_timeout_seconds=value)
