"""Start the real service (``flaudit serve`` under uvicorn) in a subprocess on a free port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from flaudit.service.app import TEST_SEED_VARIABLE
from tests.processes import ROOT, TEST_SECRET_KEY, free_port, stop_process, wait_for_http


class ServiceProcess:
    """``python -m flaudit.commands.cli serve`` with its own log file; ``kill9()`` or ``stop()`` it.

    ``seed``: start it through the test-only launcher ``tests.seeded_service`` instead, so that
    its audits get the canary seeds ``seed, seed + 1, ...`` (reproducible worked examples)."""

    def __init__(
        self,
        database_url: str,
        log_path: Path,
        *,
        api_key: str,
        port: int | None = None,
        env: dict | None = None,
        args: tuple[str, ...] = (),
        seed: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        full_env = {
            **os.environ,
            "FLAUDIT_API_KEY": api_key,
            "FLAUDIT_SECRET_KEY": TEST_SECRET_KEY,
            **(env or {}),
        }
        full_env.pop("FLAUDIT_API_KEY_FILE", None)
        full_env.pop("FLAUDIT_SECRET_KEY_FILE", None)
        module = "flaudit.commands.cli"
        if seed is not None:
            module, full_env[TEST_SEED_VARIABLE] = "tests.seeded_service", str(int(seed))
        self._log = open(log_path, "ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                module,
                "serve",
                "--port",
                str(self.port),
                "--database-url",
                database_url,
                *args,
            ],
            cwd=ROOT,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60.0) -> None:
        # ProcessExited (a RuntimeError) if the service dies first, TimeoutError if it hangs
        wait_for_http(
            f"{self.url}/readyz",
            process=self.process,
            timeout=timeout,
            interval=0.2,
            log_tail=lambda: self.log_path.read_text()[-2000:],
        )

    def kill9(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        self._log.close()

    def stop(self) -> None:
        stop_process(self.process, sig=signal.SIGINT, timeout=30)
        self._log.close()


def tagged_processes(audit_id: str) -> list[int]:
    """PIDs whose environment carries the runner's worker tag for ``audit_id``."""
    marker = f"FLAUDIT_AUDIT_WORKER={audit_id}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if marker in fh.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
