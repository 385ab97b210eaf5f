"""Request limits against the real service (``flaudit serve`` in a subprocess): an anonymous
200 MB body is refused before it is read (service memory measured from /proc), chunked bodies
are cut off at the limit, and slow partial bodies time out."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from .service_process import ServiceProcess

pytestmark = pytest.mark.slow
KEY = "limits-key-0123456789"
BIG = 200 << 20


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _send_and_read(port: int, head: bytes, body_chunks) -> bytes:
    """Send ``head`` then ``body_chunks`` from a thread; return what the server answered."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)

    def send() -> None:
        try:
            sock.sendall(head)
            for chunk in body_chunks:
                sock.sendall(chunk)
        except OSError:
            pass  # the server answered and closed: exactly what we want

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        return _read_head(sock)
    finally:
        sender.join(timeout=30)


def _read_head(sock: socket.socket) -> bytes:
    """Read until the end of the response head (or EOF), then close the socket."""
    answer = b""
    try:
        while b"\r\n\r\n" not in answer:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    finally:
        sock.close()
    return answer


def _megabytes(total: int, *, chunked: bool):
    block = b"x" * (1 << 20)
    for _ in range(total // len(block)):
        yield (b"%x\r\n" % len(block) + block + b"\r\n") if chunked else block
    if chunked:
        yield b"0\r\n\r\n"


@pytest.fixture
def service(tmp_path):
    service = ServiceProcess(
        f"sqlite:///{tmp_path / 'limits.db'}",
        tmp_path / "service.log",
        api_key=KEY,
        env={"FLAUDIT_BODY_TIMEOUT_SECONDS": "2"},
    )
    yield service
    service.stop()


@pytest.mark.timeout(120)
def test_anonymous_200mb_bodies_are_refused_before_they_are_read(service):
    pid = service.process.pid
    with httpx.Client(base_url=service.url, timeout=10) as http:
        assert http.get("/audits").status_code == 200
    before = _rss_bytes(pid)
    declared = (
        b"POST /audits HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % BIG
    )
    started = time.monotonic()
    answer = _send_and_read(service.port, declared, _megabytes(BIG, chunked=False))
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    chunked = (
        b"POST /audits HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    answer = _send_and_read(service.port, chunked, _megabytes(BIG, chunked=True))
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    # the same on an ingest route (no token): refused from Content-Length before auth or reading
    ingest = (
        b"PUT /audits/abc/initial-model HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n" % (2 << 30)
    )
    answer = _send_and_read(service.port, ingest, [])
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    elapsed = time.monotonic() - started
    grown = _rss_bytes(pid) - before
    print(f"RSS before {before / 2**20:.1f} MiB, growth {grown / 2**20:.2f} MiB, {elapsed:.2f} s")
    assert grown < 20 << 20, f"service memory grew {grown / 2**20:.1f} MiB"
    with httpx.Client(base_url=service.url, timeout=10) as http:
        assert http.get("/audits").json()["total"] == 0


@pytest.mark.timeout(120)
def test_partial_bodies_time_out(service):
    head = (
        b"POST /audits HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + KEY.encode() + b'\r\nContent-Length: 1000\r\n\r\n{"name": '
    )
    socks = []
    for _ in range(50):
        sock = socket.create_connection(("127.0.0.1", service.port), timeout=15)
        sock.sendall(head)
        socks.append(sock)
    started = time.monotonic()
    answers = [_read_head(sock) for sock in socks]
    waited = time.monotonic() - started
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers), {a[:40] for a in answers}
    assert waited < 10, waited
    with httpx.Client(base_url=service.url, timeout=10) as http:
        assert http.get("/healthz").status_code == 200
        assert http.get("/audits").json()["total"] == 0
