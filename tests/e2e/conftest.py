"""Fixtures for the browser tests: the real audit service in a uvicorn subprocess and Debian's
headless chromium driven by Playwright (never a downloaded browser)."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.processes import TEST_SECRET_KEY, ProcessExited, free_port, stop_process, wait_for_http

REPO = Path(__file__).resolve().parents[2]
OUTPUT_DIR = REPO / "test-output"
CHROMIUM = os.environ.get("FLAUDIT_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
API_KEY = "e2e-dashboard-key"


class Service:
    """A running audit service: ``url`` (root), ``api_key``, ``client`` (httpx, keyed)."""

    def __init__(self, url: str, api_key: str, log_path: Path) -> None:
        self.url = url
        self.api_key = api_key
        self.log_path = log_path
        self.client = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {api_key}"}, timeout=10
        )

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


@pytest.fixture(scope="module")
def service(tmp_path_factory) -> Service:
    """The real service (``flaudit.service.app:create_app``, its audits' canary seeds
    reproducible: :mod:`tests.e2e.seeded_app`) on a free port with a temporary SQLite database
    and ``FLAUDIT_API_KEY`` set; stopped (runner included) at the end."""
    tmp = tmp_path_factory.mktemp("dashboard-service")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "FLAUDIT_DATABASE_URL": f"sqlite:///{tmp / 'flaudit.db'}",
        "FLAUDIT_API_KEY": API_KEY,
        "FLAUDIT_SECRET_KEY": TEST_SECRET_KEY,
        "FLAUDIT_PUBLIC_URL": url,
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_HOME": str(tmp / "flwr-home"),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("FLAUDIT_REQUIRE_KEY_FOR_READS", None)
    log_path = tmp / "service.log"
    log_file = open(log_path, "wb")
    proc = subprocess.Popen(
        [
            # the real app, with reproducible canary seeds (tests/e2e/seeded_app.py)
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            "tests.e2e.seeded_app:create_app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        cwd=REPO,
        env=env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    svc = Service(url, API_KEY, log_path)
    try:
        try:
            wait_for_http(
                f"{url}/healthz", process=proc, timeout=60, interval=0.3, log_tail=svc.log_tail
            )
        except (ProcessExited, TimeoutError) as exc:
            pytest.fail(f"the service did not answer /healthz: {exc}")
        yield svc
    finally:
        svc.client.close()
        # SIGTERM is graceful: the runner stops its workers
        stop_process(proc, sig=signal.SIGTERM, timeout=20, kill_group=True)
        log_file.close()


@pytest.fixture(scope="module")
def browser():
    """Headless Debian chromium through Playwright's Python API."""
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        pytest.fail(
            f"{CHROMIUM} not found: install Debian's chromium (`apt-get install -y chromium`; "
            "scripts/test.sh does this when run as root) or set FLAUDIT_TEST_CHROMIUM"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class Tab:
    """A page plus what it logged: console errors (and uncaught exceptions) and every
    response as (method, url, status)."""

    page: Any
    console_errors: list[str] = field(default_factory=list)
    responses: list[tuple[str, str, int]] = field(default_factory=list)


@pytest.fixture
def tab(browser):
    """A fresh browser context (fresh session storage) at 1280x800."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(20_000)
    tab = Tab(page)
    page.on(
        "console", lambda msg: tab.console_errors.append(msg.text) if msg.type == "error" else None
    )
    page.on("pageerror", lambda exc: tab.console_errors.append(f"page error: {exc}"))
    page.on("response", lambda r: tab.responses.append((r.request.method, r.url, r.status)))
    try:
        yield tab
    finally:
        context.close()


@pytest.fixture(scope="session")
def output_dir() -> Path:
    OUTPUT_DIR.mkdir(exist_ok=True)
    return OUTPUT_DIR


@pytest.fixture(scope="module")
def static_url():
    """The dashboard's static files alone, from a plain HTTP server (no API behind them)."""
    from flaudit.service.app import STATIC_DIR

    class QuietHandler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format, *args):  # noqa: A002 (the stdlib's signature)
            pass

    handler = functools.partial(QuietHandler, directory=str(STATIC_DIR))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
