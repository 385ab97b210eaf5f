"""Subprocess helpers shared by the end-to-end tests: free loopback ports, polling, waiting for a
process to answer HTTP, and starting/stopping processes (and their process groups) by PID.

Importable as ``tests.processes`` because pytest runs with ``pythonpath = ["."]``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
#: ``FLAUDIT_SECRET_KEY`` of every service the tests start (encrypts canary seeds at rest).
TEST_SECRET_KEY = "nVH1c9oe4asChAQaFR-G63pk5txEHOG3WAKT9r9j5O8="
BIN = Path(sys.executable).parent


def run_pytest(
    tmp_path: Path, *args: str, require_all: str | None = None, timeout: float = 150
) -> subprocess.CompletedProcess:
    """pytest in a subprocess on the test files in ``tmp_path`` (no project config: ``-c
    /dev/null``), with this repository importable and ``FLAUDIT_REQUIRE_ALL`` set to
    ``require_all`` (None: unset); for tests of our own pytest plugins."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "FLAUDIT_REQUIRE_ALL": require_all}
    environ = {name: value for name, value in environ.items() if value is not None}
    return subprocess.run(
        [sys.executable, "-m", "pytest", *args, "--rootdir", str(tmp_path), "-c", os.devnull]
        + [str(tmp_path)],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (nothing listens on it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, *, timeout: float, interval: float = 0.5, what: str = "condition"):
    """Call ``predicate`` every ``interval`` seconds until it returns something truthy; return
    that value, or raise ``TimeoutError`` naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what}")


def http_ok(url: str, *, timeout: float = 2.0) -> bool:
    """Whether ``GET url`` answers 200 (False on any HTTP or connection error)."""
    try:
        return httpx.get(url, timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


class ProcessExited(RuntimeError):
    """The process being waited for exited before it answered."""


def wait_for_http(
    url: str,
    *,
    process: subprocess.Popen,
    timeout: float,
    interval: float,
    log_tail: Callable[[], str] = lambda: "",
) -> None:
    """Poll ``GET url`` until it answers 200.

    Raises
    ------
    ProcessExited
        If ``process`` exits first (the message ends with ``log_tail()``).
    TimeoutError
        If it does not answer 200 within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise ProcessExited(f"the process exited with {process.returncode}:\n{log_tail()}")
        if http_ok(url):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer 200 within {timeout:g} s:\n{log_tail()}")
        time.sleep(interval)


def stop_process(
    proc: subprocess.Popen, *, sig: int = signal.SIGTERM, timeout: float, kill_group: bool = False
) -> None:
    """Send ``sig`` to a running ``proc`` and wait ``timeout`` seconds for it to exit; then SIGKILL
    it -- its whole process group with ``kill_group`` (for a process started with
    ``start_new_session=True``) -- and wait up to 10 s more."""
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        if kill_group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
        proc.wait(timeout=10)


def group_alive(pgid: int) -> bool:
    """Whether a process group still has a member that is not a zombie."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # zombies count as gone
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def flower_env(home: Path, *, project_on_path: bool = True) -> dict[str, str]:
    """This process's environment for a Flower process: ``FLWR_HOME=home``, no telemetry, no
    update check, no runtime dependency installation, the venv's scripts first on ``PATH``
    (flower-superexec, flwr-serverapp) and, with ``project_on_path``, the project on
    ``PYTHONPATH``."""
    env = dict(os.environ)
    env.update(
        FLWR_HOME=str(home),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
    )
    if project_on_path:
        env["PYTHONPATH"] = str(ROOT)
    return env


class Processes:
    """Starts processes as leaders of their own process groups, each logging to
    ``log_dir/<name>.log``; stops them by PID/PGID."""

    def __init__(self, log_dir: Path, *, cwd: Path = ROOT):
        self.log_dir = log_dir
        self.cwd = cwd
        self.started: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "ab")
        proc = subprocess.Popen(
            argv,
            cwd=self.cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self.started.append((name, proc))
        return proc

    def log(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def alive(self, name: str) -> bool:
        return any(n == name and p.poll() is None for n, p in self.started)

    def stop_all(self) -> None:
        for _, proc in reversed(self.started):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for _, proc in reversed(self.started):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        # the group leader is gone; sweep anything left in its group (Flower's SuperExec children)
        deadline = time.monotonic() + 10
        for _, proc in self.started:
            while time.monotonic() < deadline and group_alive(proc.pid):
                time.sleep(0.2)
            if group_alive(proc.pid):
                os.killpg(proc.pid, signal.SIGKILL)


def wait_for_audit(
    http: httpx.Client,
    audit_id: str,
    *,
    timeout: float,
    bodies: list[str],
    what: str = "audit to finish",
) -> dict:
    """Poll ``GET /audits/{audit_id}`` once a second until the audit is succeeded, failed or
    cancelled; return its JSON. Every response body is appended to ``bodies`` (for the tests'
    scans for secrets)."""

    def finished():
        r = http.get(f"/audits/{audit_id}")
        bodies.append(r.text)
        body = r.json()
        return body if body["status"] in ("succeeded", "failed", "cancelled") else None

    return wait_for(finished, timeout=timeout, interval=1.0, what=what)


@contextlib.contextmanager
def serve_in_thread(app, **config) -> Iterator[int]:
    """``app`` served by uvicorn (``uvicorn.Config`` options ``config``) on a free loopback port
    in a daemon thread of this process, until the block ends; yields the port once it listens."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, **config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=30)
