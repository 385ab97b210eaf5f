"""A real Flower federation on loopback for the integration tests (and benchmarks/byo_weighted.py):
a ``FLWR_HOME`` whose ``local`` connection names a SuperLink on a free port, the SuperLink and
its SuperNodes as subprocesses, and the ``flaudit attach`` / ``flwr run`` / ``flwr log`` calls
the tests make against them."""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

from tests.processes import BIN, Processes, flower_env, free_port, wait_for
from tests.service.service_process import ServiceProcess

#: The variables a run inherits from a developer's shell that would attach it elsewhere
ATTACHMENT_VARIABLES = ("FLAUDIT_AUDIT_ID", "FLAUDIT_URL", "FLAUDIT_RUN_TOKEN")


def flower_home(
    root: Path, *, project_on_path: bool = True, drop: tuple[str, ...] = ATTACHMENT_VARIABLES
) -> tuple[dict[str, str], str]:
    """``root/flwr-home`` with a ``local`` SuperLink connection (insecure, on a free loopback
    port); returns the Flower processes' environment (without ``drop``) and the address."""
    home = root / "flwr-home"
    home.mkdir()
    env = flower_env(home, project_on_path=project_on_path)
    for key in drop:
        env.pop(key, None)
    address = f"127.0.0.1:{free_port()}"
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "{address}"\n'
        "insecure = true\n"
    )
    return env, address


def start_service(
    root: Path,
    api_key: str,
    *,
    seed: int | None = None,
    port: int | None = None,
    log: str = "service.log",
) -> ServiceProcess:
    """``flaudit serve`` on ``port`` (a free one by default) with its SQLite database and
    ``log`` under ``root``, its public URL that port on loopback; started again on the same
    port and root, it serves the same database. ``seed``: the test-only canary seeds
    (``tests/seeded_service.py``)."""
    port = port or free_port()
    return ServiceProcess(
        f"sqlite:///{root / 'flaudit.db'}",
        root / log,
        api_key=api_key,
        port=port,
        env={"FLAUDIT_PUBLIC_URL": f"http://127.0.0.1:{port}"},
        seed=seed,
    )


def start_federation(
    procs: Processes,
    env: dict[str, str],
    address: str,
    num_nodes: int,
    *,
    partitions: bool = True,
    num_partitions: int | None = None,
) -> None:
    """The SuperLink at ``address`` and ``num_nodes`` SuperNodes (``supernode{i}``), each with
    ``partition-id={i} num-partitions={num_partitions}`` (default ``num_nodes``) as its node
    config when ``partitions``."""
    num_partitions = num_nodes if num_partitions is None else int(num_partitions)
    procs.start(
        "superlink",
        [
            str(BIN / "flower-superlink"),
            "--insecure",
            "--port",
            address.rsplit(":", 1)[1],
            "--disable-runtime-dependency-installation",
        ],
        env,
    )
    for i in range(num_nodes):
        node_config = (
            ["--node-config", f"partition-id={i} num-partitions={num_partitions}"]
            if partitions
            else []
        )
        procs.start(
            f"supernode{i}",
            [
                str(BIN / "flower-supernode"),
                "--insecure",
                "--superlink",
                address,
                "--port",
                str(free_port()),
                *node_config,
            ],
            env,
        )


def attach(
    service_url: str, env: dict, api_key: str, name: str, token_file: Path, *extra: str
) -> dict:
    """``flaudit attach --format run-config`` (with ``extra`` options); returns the run-config
    lines it printed, parsed. The run token goes to ``token_file`` only, never to the output."""
    done = subprocess.run(
        [
            str(BIN / "flaudit"),
            "attach",
            "--url",
            service_url,
            "--name",
            name,
            *extra,
            "--format",
            "run-config",
            "--token-file",
            str(token_file),
        ],
        env={**env, "FLAUDIT_API_KEY": api_key},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert token_file.read_text().strip() not in done.stdout
    return tomllib.loads(done.stdout)


def write_run_config(path: Path, values: dict) -> Path:
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()))
    return path


def submit(app: Path, run_config: Path, env: dict, cwd: Path, *, timeout: float = 180) -> int:
    """``flwr run`` until the SuperLink accepts the run (it needs a few seconds to listen);
    returns the Flower run id. A timeout says what ``flwr run`` answered last."""
    last: list[str] = []

    def once():
        done = subprocess.run(
            [
                str(BIN / "flwr"),
                "run",
                str(app),
                "local",
                "--run-config",
                str(run_config),
                "--format",
                "json",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=cwd,
        )
        last[:] = [f"exit {done.returncode}: {done.stdout[-1500:]} {done.stderr[-1500:]}"]
        if done.returncode != 0 or "{" not in done.stdout:
            return None
        payload = json.loads(done.stdout[done.stdout.index("{") :])
        return payload.get("run-id") if payload.get("success") else None

    try:
        return int(
            wait_for(once, timeout=timeout, interval=2, what="the SuperLink to accept the run")
        )
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; last `flwr run`: {last[0] if last else 'never ran'}") from None


def run_log(run_id: int, env: dict, cwd: Path) -> str:
    """The ServerApp's own log of run ``run_id``, as the SuperLink keeps it."""
    shown = subprocess.run(
        [str(BIN / "flwr"), "log", str(run_id), "local", "--show"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )
    return shown.stdout + shown.stderr
