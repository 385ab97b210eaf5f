"""The request-head limits of ``flaudit serve``'s HTTP protocol (time and size), on both uvicorn
parsers (h11 and httptools), with uvicorn running a small ASGI app in a thread of the test process.

Timings are generous bounds, not speed targets: the timeout is 0.5 s, and a stalled connection
only has to be closed within 30 s.
"""

from __future__ import annotations

import asyncio
import select
import time

import pytest
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from flaudit.service.http_protocol import MAX_HEAD_BYTES, http_protocol
from tests.processes import serve_in_thread
from tests.raw_http import (
    assert_431,
    connect,
    read_response,
    read_until_closed,
    send_all_you_can,
)

TIMEOUT = 0.5
KEEP_ALIVE_TIMEOUT = 2.0
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
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/csv")],
            }
        )
        for i in range(STREAM_CHUNKS):
            await asyncio.sleep(TIMEOUT / 2)
            await send({"type": "http.response.body", "body": b"row,%d\n" % i, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    answer = b"%s %d" % (scope["path"].encode(), len(body))
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", str(len(answer)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": answer})


PARSERS = {"params": [H11Protocol, HttpToolsProtocol], "ids": ["h11", "httptools"]}


@pytest.fixture(**PARSERS)
def port(request):
    yield from _serve(request.param, TIMEOUT)


@pytest.fixture(**PARSERS)
def keep_alive_port(request):
    """A head timeout of KEEP_ALIVE_TIMEOUT: long beside a pause of a loaded machine."""
    yield from _serve(request.param, KEEP_ALIVE_TIMEOUT)


def _serve(base, timeout: float):
    with serve_in_thread(
        app,
        lifespan="off",
        log_level="warning",
        http=http_protocol(header_timeout_seconds=timeout, base=base),
        timeout_keep_alive=60,  # so that only the head timeout closes idle connections
    ) as port:
        yield port


def test_a_stalled_partial_head_is_answered_408_and_closed(port):
    with connect(port) as sock:
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\nX-A: ")
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"connection: close" in answer and b"request head not received" in answer


def test_a_connection_that_sends_nothing_is_closed_without_an_answer(port):
    with connect(port) as sock:
        assert read_until_closed(sock) == b""


def test_trickled_bytes_do_not_extend_the_deadline(port):
    with connect(port) as sock:
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
                    answer = read_until_closed(sock)
    assert answer is not None, "the connection was still open after 30 s"
    assert answer.startswith(b"HTTP/1.1 408 ") or answer == b"", answer


def test_a_head_sent_in_pieces_within_the_timeout_is_served(port):
    with connect(port) as sock:
        for piece in (b"GET /pieces HT", b"TP/1.1\r\nHo", b"st: x\r\n", b"\r\n"):
            sock.sendall(piece)
            time.sleep(TIMEOUT / 10)
        assert read_response(sock).endswith(b"/pieces 0")


def test_keep_alive_restarts_the_timer_after_each_response(keep_alive_port):
    with connect(keep_alive_port) as sock:
        # requests back to back on one connection until it is twice the head timeout old: a
        # timer that did not restart after each response would have closed it
        opened, i = time.monotonic(), 0
        while time.monotonic() - opened < 2 * KEEP_ALIVE_TIMEOUT:
            sock.sendall(b"GET /r%d HTTP/1.1\r\nHost: x\r\n\r\n" % i)
            assert read_response(sock).endswith(b"/r%d 0" % i)
            i += 1
        # then idle: closed without an answer
        assert read_until_closed(sock) == b""


def test_a_partial_head_after_a_response_is_answered_408(port):
    with connect(port) as sock:
        sock.sendall(b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock).endswith(b"/first 0")
        sock.sendall(b"GET /second HTTP/1.1\r\n")
        assert read_until_closed(sock).startswith(b"HTTP/1.1 408 ")


def test_slow_bodies_and_slow_responses_are_not_timed(port):
    with connect(port) as sock:
        sock.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n")
        for byte in b"abcd":  # the body takes twice the head timeout
            time.sleep(TIMEOUT / 2)
            sock.sendall(bytes([byte]))
        assert read_response(sock).endswith(b"/upload 4")
        sock.sendall(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        streamed = read_response(sock)
        assert streamed.startswith(b"HTTP/1.1 200 ")
        assert b"row,%d\n" % (STREAM_CHUNKS - 1) in streamed
        # the connection is still usable
        sock.sendall(b"GET /after HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock).endswith(b"/after 0")


def test_pipelined_requests_are_all_served(port):
    with connect(port) as sock:
        sock.sendall(b"".join(b"GET /p%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(3)))
        answers = read_until_closed(sock)  # the three responses, then the close
    assert answers.count(b"HTTP/1.1 200 ") == 3, answers
    assert answers.index(b"/p0 0") < answers.index(b"/p1 0") < answers.index(b"/p2 0")


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf")])
def test_the_timeout_must_be_finite_and_positive(value):
    with pytest.raises(ValueError, match="header_timeout_seconds"):
        http_protocol(header_timeout_seconds=value)


# the head-size limit (MAX_HEAD_BYTES, 16 KiB)


def test_a_one_megabyte_header_is_answered_431_and_closed(port):
    with connect(port) as sock:
        send_all_you_can(
            sock, b"GET /big HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
        )
        assert_431(read_until_closed(sock))


def test_an_endless_header_is_cut_off_without_waiting_for_its_end(port):
    with connect(port) as sock:
        sock.sendall(b"GET /endless HTTP/1.1\r\nHost: x\r\nX-Endless: ")
        for _ in range(8):  # 8 x 4 KiB, well past the limit, and never a CRLF
            send_all_you_can(sock, b"a" * 4096)
            time.sleep(TIMEOUT / 20)
        assert_431(read_until_closed(sock))  # 431, not the head timeout's 408


def test_a_17_kib_url_is_answered_431(port):
    with connect(port) as sock:
        send_all_you_can(sock, b"GET /" + b"u" * (17 * 1024) + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert_431(read_until_closed(sock))


def test_many_small_headers_past_the_limit_are_answered_431(port):
    headers = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(200))  # ~22 KiB
    with connect(port) as sock:
        send_all_you_can(sock, b"GET /many HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        assert_431(read_until_closed(sock))


def test_a_head_just_under_the_limit_is_served(port):
    headers = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(100))  # ~10.7 KiB
    url = b"/" + b"u" * 5000
    head = b"GET " + url + b" HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n"
    assert MAX_HEAD_BYTES - 1024 < len(head) < MAX_HEAD_BYTES
    with connect(port) as sock:
        sock.sendall(head)
        assert read_response(sock).endswith(url + b" 0")
        sock.sendall(b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n")  # the connection stays usable
        assert read_response(sock).endswith(b"/next 0")


def test_a_large_body_with_a_pipelined_request_in_the_same_reads_is_served(port):
    body = b"b" * (5 << 20)
    with connect(port) as sock:
        sock.sendall(
            b"PUT /audits/a/rounds/1 HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
            + body
            + b"GET /after HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        answers = read_until_closed(sock)  # both responses, then the idle close
    assert answers.count(b"HTTP/1.1 200 ") == 2, answers
    assert answers.index(b"/audits/a/rounds/1 %d" % len(body)) < answers.index(b"/after 0")


def test_pipelined_requests_after_a_body_in_one_write_are_served(port):
    # the body's end, a whole request and the next request's start can share one read
    small = b"GET /small HTTP/1.1\r\nHost: x\r\n\r\n"
    with connect(port) as sock:
        sock.sendall(
            b"POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: 300000\r\n\r\n"
            + b"p" * 300000
            + small * 50
        )
        answers = read_until_closed(sock)  # 51 responses, then the idle close
    assert answers.count(b"HTTP/1.1 200 ") == 51 and answers.count(b"/small 0") == 50, answers
    assert b"431" not in answers and answers.index(b"/post 300000") < answers.index(b"/small 0")


def test_trailers_of_a_chunked_body_do_not_count_against_the_head(port):
    headers = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(140))  # ~15 KiB
    trailers = b"".join(b"X-T%d: %s\r\n" % (i, b"t" * 100) for i in range(20))  # ~2 KiB
    with connect(port) as sock:
        sock.sendall(
            b"POST /chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            + headers
            + b"\r\n"
            + b"5\r\nhello\r\n0\r\n"
            + trailers
            + b"\r\n"
        )
        assert read_response(sock).endswith(b"/chunked 5")


def test_a_large_head_pipelined_during_a_response_is_answered_431_after_it(port):
    with connect(port) as sock:
        sock.sendall(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(TIMEOUT / 4)  # the response has started
        send_all_you_can(sock, b"GET /big HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20))
        answer = read_until_closed(sock)
    streamed, _, rest = answer.partition(b"0\r\n\r\n")  # the chunked response's end
    assert streamed.startswith(b"HTTP/1.1 200 ") and b"row,%d" % (STREAM_CHUNKS - 1) in streamed
    assert_431(rest)


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "16384"])
def test_the_head_limit_must_be_a_positive_integer(value):
    with pytest.raises(ValueError, match="max_head_bytes"):
        http_protocol(header_timeout_seconds=1, max_head_bytes=value)
