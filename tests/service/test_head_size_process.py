"""The request-head size limit against the real service (``flaudit serve`` in a subprocess, with
the HTTP parser uvicorn picks in production, httptools): heads over 16 KiB are answered 431 and
the connection closed, heads under it and large bodies followed by pipelined requests are served.
"""

from __future__ import annotations

import re

import httpx
import pytest

from flaudit.service.http_protocol import MAX_HEAD_BYTES
from tests.raw_http import assert_431, exchange

from .service_process import ServiceProcess

pytestmark = pytest.mark.slow
KEY = "head-size-key-0123456789"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("head-size")
    service = ServiceProcess(f"sqlite:///{tmp / 'service.db'}", tmp / "service.log", api_key=KEY)
    yield service
    service.stop()


def _headers(count: int, size: int) -> bytes:
    return b"".join(b"X-H%d: %s\r\n" % (i, b"v" * size) for i in range(count))


@pytest.mark.timeout(120)
def test_a_one_megabyte_header_is_answered_431_and_closed(service):
    assert_431(
        exchange(
            service.port,
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n",
        )
    )


@pytest.mark.timeout(120)
def test_a_17_kib_url_is_answered_431(service):
    assert_431(
        exchange(
            service.port,
            b"GET /healthz?q=" + b"u" * (17 * 1024) + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        )
    )


@pytest.mark.timeout(120)
def test_many_small_headers_past_the_limit_are_answered_431(service):
    assert_431(
        exchange(
            service.port,
            b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + _headers(200, 100) + b"\r\n",
        )
    )


@pytest.mark.timeout(120)
def test_a_head_just_under_the_limit_is_served(service):
    head = (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + _headers(145, 100) + b"\r\n"
    )
    assert MAX_HEAD_BYTES - 1024 < len(head) < MAX_HEAD_BYTES
    assert exchange(service.port, head).startswith(b"HTTP/1.1 200 ")


@pytest.mark.timeout(120)
def test_a_5_mb_put_followed_by_a_pipelined_request_is_not_refused(service):
    body = b"\0" * (5 << 20)
    answer = exchange(
        service.port,
        b"PUT /audits/no-such-audit/rounds/1 HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Bearer " + KEY.encode() + b"\r\n"
        b"Content-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n"
        % len(body)
        + body
        + b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)
    assert len(statuses) == 2 and statuses[0] != b"431" and statuses[1] == b"200", answer[:2000]


@pytest.mark.timeout(120)
def test_refusals_are_logged_and_the_service_keeps_serving(service):
    assert_431(
        exchange(
            service.port,
            b"GET /audits HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (64 * 1024) + b"\r\n\r\n",
        )
    )
    with httpx.Client(base_url=service.url, timeout=10) as http:
        assert http.get("/healthz").status_code == 200
        assert http.get("/audits", headers={"X-Medium": "m" * 8000}).status_code == 200
    assert f"request head over {MAX_HEAD_BYTES} bytes: 431" in service.log_path.read_text()
