"""The request-head timeout against the real service (``flaudit serve`` in a subprocess, with the
HTTP parser it runs in production): stalled and trickled heads are closed, slow but complete
heads and slow bodies are served, idle keep-alive connections end, and a bad setting stops
``flaudit serve`` with a message naming it.

Timings are generous bounds (30 s), not speed targets."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

import httpx
import pytest

from tests.processes import ROOT, TEST_SECRET_KEY
from tests.raw_http import connect, read_response, read_until_closed

from .service_process import ServiceProcess

pytestmark = pytest.mark.slow
KEY = "header-timeout-key-0123456789"
TIMEOUT = 1.0


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("header-timeout")
    service = ServiceProcess(
        f"sqlite:///{tmp / 'service.db'}",
        tmp / "service.log",
        api_key=KEY,
        args=("--header-timeout-seconds", str(TIMEOUT)),
    )
    yield service
    service.stop()


@pytest.mark.timeout(120)
def test_stalled_and_trickled_heads_are_closed(service):
    stalled = [connect(service.port) for _ in range(20)]
    for sock in stalled:
        sock.sendall(b"GET /audits HTTP/1.1\r\nHost: x\r\nX-Partial: ")
    trickled = connect(service.port)
    trickled.sendall(b"GET /audits HTTP/1.1\r\nHost: x\r\n")
    deadline = time.monotonic() + 30
    trickled_answer = None
    while trickled_answer is None and time.monotonic() < deadline:
        try:
            trickled.sendall(b"X")  # a byte every 0.2 s
        except OSError:
            trickled_answer = b""
        else:
            if select.select([trickled], [], [], 0.2)[0]:
                trickled_answer = read_until_closed(trickled)
    trickled.close()
    assert trickled_answer is not None, "a trickling connection was still open after 30 s"
    assert trickled_answer == b"" or trickled_answer.startswith(b"HTTP/1.1 408 "), trickled_answer
    answers = []
    for sock in stalled:
        with sock:
            answers.append(read_until_closed(sock))
    assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers), {a[:40] for a in answers}
    assert b"request head not received within 1 s" in answers[0]
    with httpx.Client(base_url=service.url, timeout=10) as http:
        assert http.get("/healthz").status_code == 200


@pytest.mark.timeout(120)
def test_a_complete_head_sent_slowly_within_the_limit_is_served(service):
    with connect(service.port) as sock:
        for piece in (b"GET /heal", b"thz HTTP/1.1\r\n", b"Host: x\r\n", b"\r\n"):
            sock.sendall(piece)
            time.sleep(TIMEOUT / 10)
        assert read_response(sock).startswith(b"HTTP/1.1 200 ")


@pytest.mark.timeout(120)
def test_keep_alive_serves_several_requests_then_closes_when_idle(service):
    with connect(service.port) as sock:
        started = time.monotonic()
        for _ in range(3):  # TIMEOUT / 2 apart: the connection outlives one timeout
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(sock).startswith(b"HTTP/1.1 200 ")
            time.sleep(TIMEOUT / 2)
        assert read_until_closed(sock) == b""  # idle after a response: closed
        assert time.monotonic() - started < 30
    with connect(service.port) as sock:  # a partial head after a response: 408
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock).startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        assert read_until_closed(sock).startswith(b"HTTP/1.1 408 ")


@pytest.mark.timeout(120)
def test_a_body_slower_than_the_head_timeout_is_still_read(service):
    body = b'{"name": "slow", "task": 1}'
    with connect(service.port) as sock:
        sock.sendall(
            b"POST /audits HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + KEY.encode() + b"\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        for i in range(0, len(body), 9):  # about 3 * TIMEOUT for the body
            time.sleep(TIMEOUT)
            sock.sendall(body[i : i + 9])
        answer = read_response(sock)
    assert answer.startswith(b"HTTP/1.1 422 "), answer[:200]  # parsed and refused: not a 408


@pytest.mark.timeout(120)
def test_the_dashboard_and_api_answer_as_before(service):
    with httpx.Client(base_url=service.url, timeout=10) as http:
        dashboard = http.get("/", follow_redirects=True)
        assert dashboard.status_code == 200 and "html" in dashboard.headers["content-type"]
        assert http.get("/audits").json()["total"] == 0
        time.sleep(TIMEOUT * 1.5)  # httpx reconnects if the idle connection was closed
        assert http.get("/healthz").status_code == 200


def _serve(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flaudit.commands.cli", "serve", "--port", "9", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "args, variable",
    [
        (["--header-timeout-seconds", "0"], None),
        (["--header-timeout-seconds", "inf"], None),
        ([], "-5"),
        ([], "nan"),
        ([], "ten"),
    ],
)
def test_a_bad_header_timeout_stops_serve_and_names_the_setting(tmp_path, args, variable):
    env = {**os.environ, "FLAUDIT_SECRET_KEY": TEST_SECRET_KEY}
    env.pop("FLAUDIT_HEADER_TIMEOUT_SECONDS", None)
    if variable is not None:
        env["FLAUDIT_HEADER_TIMEOUT_SECONDS"] = variable
    done = _serve(["--database-url", f"sqlite:///{tmp_path / 'x.db'}", *args], env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "FLAUDIT_HEADER_TIMEOUT_SECONDS" in done.stdout, done.stdout + done.stderr
    if args:
        assert "--header-timeout-seconds" in done.stdout
    assert not (tmp_path / "x.db").exists()
