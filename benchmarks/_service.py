"""A real ``flaudit serve`` in a subprocess for the benchmarks (SQLite in a temp dir, loopback)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
KEY = "bench-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _new_secret_key() -> str:
    from flaudit.service.sealing import generate_secret_key

    return generate_secret_key()


@contextlib.contextmanager
def running_service(
    extra_env: dict[str, str] | None = None,
) -> Iterator[tuple[str, Path, subprocess.Popen]]:
    """Start the service, wait until ``/readyz`` answers; yield ``(url, tmp dir, process)``."""
    tmp = Path(tempfile.mkdtemp(prefix="flaudit-bench-"))
    env = {
        **os.environ,
        "FLAUDIT_API_KEY": KEY,
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLAUDIT_SECRET_KEY": os.environ.get("FLAUDIT_SECRET_KEY") or _new_secret_key(),
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_HOME": str(tmp / "flwr"),
        **(extra_env or {}),
    }
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp / "service.log", "wb")
    service = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flaudit.commands.cli",
            "serve",
            "--port",
            str(port),
            "--database-url",
            f"sqlite:///{tmp / 'bench.db'}",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or service.poll() is not None:
                raise SystemExit("service did not start; see " + str(tmp / "service.log"))
            time.sleep(0.2)
        yield url, tmp, service
    finally:
        service.send_signal(signal.SIGINT)
        try:
            service.wait(timeout=30)
        except subprocess.TimeoutExpired:
            service.kill()
        log.close()


def in_process_reporter(client, environment: dict, **options):
    """The real ``HttpRoundReporter`` talking to a service app in this process: ``client`` a
    ``TestClient`` of it, ``environment`` the ``environment`` of its ``POST /audits`` answer."""
    from flaudit.server.http_reporter import HttpRoundReporter

    http = httpx.Client(transport=client._transport, base_url="http://testserver")
    return HttpRoundReporter(
        "http://testserver",
        environment["FLAUDIT_AUDIT_ID"],
        environment["FLAUDIT_RUN_TOKEN"],
        client=http,
        **{"backoff": 0.01, "retry_seconds": 0.05, **options},
    )
