"""The docker/compose.yaml topology as plain processes on 127.0.0.1 (no Docker engine here).

compose service   ->  here
----------------      ----------------------------------------------------------------------
postgres          ->  the server at FLAUDIT_TEST_POSTGRES_URL (a fresh database per test run),
                      else a throwaway cluster from Debian's initdb/pg_ctl on a free port
                      (skipped, with initdb's or pg_ctl's message, when none can be started)
flaudit           ->  ``flaudit serve --database-url postgresql+psycopg://...`` (a subprocess)
superlink         ->  ``flower-superlink --insecure`` with the compose command's flags
serverapp         ->  ``flower-superexec`` with the compose command's flags (runs the ServerApps)
supernode (x2)    ->  ``docker/supernode-entrypoint.py`` (the image's entry point) running
                      ``flower-supernode --insecure``, partition ids 0 and 1 via node config

The test creates an audit with ``engine = "deployment"`` through the REST API, polls it to
``succeeded`` and checks that both SuperNodes trained in the run; then it starts a long audit and
cancels it through the API, and the SuperLink must report that Flower run ``finished:stopped``.
The secret canary seeds must be in no response and no log of any of the processes. Everything
is stopped by PID (each process leads its own process group, so its Flower children go too).
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from tests.processes import (
    BIN,
    ROOT,
    TEST_SECRET_KEY,
    Processes,
    flower_env,
    free_port,
    group_alive,
    http_ok,
    wait_for,
    wait_for_audit,
)

KEY = "topology-key-" + "k" * 20
AUTH = {"Authorization": f"Bearer {KEY}"}

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

# Two real clients (partition p runs on node p mod 2) in shuffled epochs: every round has
# m = 8 slots and at most 12 seen canaries over both rounds, so some round has >= 2 real slots
# and then both clients -- both SuperNodes -- train in it. Each ClientApp message starts a
# process on its SuperNode, so few real clients keep the test quick.
TINY_DEPLOYMENT_AUDIT = {
    "name": "deployment topology test",
    "task": "synthetic",
    "task_options": {"dim": 2000, "test_size": 200, "samples_per_client": 20},
    "num_rounds": 2,
    "num_clients": 2,
    "clients_per_round": 8,
    "participation": "shuffled",
    "num_canaries": 12,
    "max_canary_fraction": 0.8,
    "noise_multiplier": 0.3,
    "clip_norm": 1.0,
    "delta": 1e-5,
    "engine": "deployment",
    "timeout_seconds": 200,
}


# -- PostgreSQL -------------------------------------------------------------------------------


@contextmanager
def postgres_database():
    """Yield a SQLAlchemy URL of an empty database; drop or stop it afterwards."""
    from sqlalchemy.engine import make_url

    server_url = os.environ.get("FLAUDIT_TEST_POSTGRES_URL")
    if server_url:
        import psycopg

        url = make_url(server_url)
        name = f"flaudit_topology_{secrets.token_hex(4)}"
        conninfo = dict(
            host=url.host or "127.0.0.1",
            port=url.port or 5432,
            user=url.username,
            password=url.password,
            dbname=url.database or "postgres",
            autocommit=True,
        )
        conninfo = {k: v for k, v in conninfo.items() if v is not None}
        with psycopg.connect(**conninfo) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        try:
            yield url.set(database=name).render_as_string(hide_password=False)
        finally:
            with psycopg.connect(**conninfo) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        return

    with private_cluster() as url:
        yield url


def _run_or_skip(command: list[str], what: str, *, log: Path | None = None) -> None:
    """Run a PostgreSQL tool; if it fails, skip the test with the tool's stderr (and log)."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip()
        if log is not None and log.exists():
            detail += "\n" + log.read_text(errors="replace")[-2000:]
        pytest.skip(
            f"no PostgreSQL server for this test: {what} exited with {done.returncode}: "
            f"{detail} (set FLAUDIT_TEST_POSTGRES_URL to use a running server)"
        )


@contextmanager
def private_cluster():
    """A throwaway cluster from Debian's initdb/pg_ctl on a free port, in a fresh directory
    under the system temp dir (as root: owned by the ``postgres`` user, who runs the cluster --
    pytest's own temp dirs are 0700 and unreachable for that user). Skips with the reason when
    no cluster can be started."""
    initdbs = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not initdbs:
        pytest.skip("no PostgreSQL: set FLAUDIT_TEST_POSTGRES_URL or install Debian's postgresql")
    bindir = Path(initdbs[-1]).parent
    prefix: list[str] = []
    if os.geteuid() == 0:  # initdb refuses to run as root: use the postgres system user
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user for a throwaway cluster")
        if shutil.which("runuser") is None:
            pytest.skip("running as root and there is no runuser to start a cluster as 'postgres'")
        prefix = ["runuser", "-u", "postgres", "--"]
    base = Path(tempfile.mkdtemp(prefix="flaudit-pg-"))
    try:
        if prefix:
            os.chown(base, pw.pw_uid, pw.pw_gid)
        data = base / "pgdata"
        log = base / "server.log"
        port = free_port()
        _run_or_skip(
            [*prefix, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"],
            "initdb",
        )
        _run_or_skip(
            [
                *prefix,
                str(bindir / "pg_ctl"),
                "-D",
                str(data),
                "-w",
                "-l",
                str(log),
                "-o",
                f"-p {port} -k {base} -c listen_addresses=127.0.0.1",
                "start",
            ],
            "pg_ctl start",
            log=log,
        )
        try:
            yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run(
                [*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"],
                capture_output=True,
                timeout=60,
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _stored_seed(database_url: str, audit_id: str) -> int:
    """The audit's secret seed, read from the database (for the leak scan only)."""
    from flaudit.service.sealing import SeedCipher
    from flaudit.service.store import Store

    store = Store(database_url, cipher=SeedCipher([TEST_SECRET_KEY]))
    try:
        seed = store.canary_seed(audit_id)
    finally:
        store.dispose()
    assert seed is not None
    return int(seed)


# -- the test ---------------------------------------------------------------------------------


@dataclass
class Topology:
    procs: Processes
    database_url: str
    link_port: int
    api: str
    api_port: int
    service_env: dict


def _start_service(top: Topology, name: str) -> None:
    """``flaudit serve`` on the topology's port and database (compose: the flaudit service)."""
    top.procs.start(
        name,
        [
            str(BIN / "python"),
            "-m",
            "flaudit.commands.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(top.api_port),
            "--database-url",
            top.database_url,
        ],
        top.service_env,
    )
    wait_for(
        lambda: (
            http_ok(f"{top.api}/readyz")
            or (not top.procs.alive(name) and pytest.fail(top.procs.log(name)[-3000:]))
        ),
        timeout=90,
        interval=0.3,
        what=f"service /readyz ({name})",
    )


def _start_topology(tmp_path: Path, stack: ExitStack) -> Topology:
    """compose.yaml's services as processes: PostgreSQL, SuperLink, serverapp executor, the
    flaudit service and two SuperNodes through the image's entry point."""
    logs = tmp_path / "logs"
    logs.mkdir()
    procs = Processes(logs)
    database_url = stack.enter_context(postgres_database())
    stack.callback(procs.stop_all)

    # superlink: compose.yaml's command, on a free loopback port
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())["services"]
    link_port = free_port()
    link_command = [str(arg) for arg in compose["superlink"]["command"]]
    link_command[link_command.index("--host") + 1] = "127.0.0.1"
    link_command[link_command.index("--port") + 1] = str(link_port)
    link_command[link_command.index("--database") + 1] = str(tmp_path / "superlink.db")
    assert "--insecure" in link_command
    link_home = tmp_path / "superlink-home"
    link_home.mkdir()
    procs.start("superlink", [str(BIN / "flower-superlink"), *link_command], flower_env(link_home))
    # serverapp: the executor that runs the ServerApps (compose: --isolation process)
    executor = [str(arg) for arg in compose["serverapp"]["command"]]
    executor[executor.index("--runtime-api-address") + 1] = f"127.0.0.1:{link_port}"
    executor_home = tmp_path / "serverapp-home"
    executor_home.mkdir()
    procs.start("serverapp", [str(BIN / "flower-superexec"), *executor], flower_env(executor_home))

    # flaudit service, pointed at PostgreSQL (compose: FLAUDIT_DATABASE_URL from .env)
    api_port = free_port()
    api = f"http://127.0.0.1:{api_port}"
    service_env = flower_env(tmp_path / "service-flwr-home")
    service_env.update(
        FLAUDIT_API_KEY=KEY,
        FLAUDIT_SECRET_KEY=TEST_SECRET_KEY,
        FLAUDIT_PUBLIC_URL=api,
        FLAUDIT_FLOWER_APP_DIR=str(ROOT),
    )
    service_env.pop("FLAUDIT_API_KEY_FILE", None)
    top = Topology(procs, database_url, link_port, api, api_port, service_env)

    wait_for(
        lambda: (
            http_ok(f"http://127.0.0.1:{link_port}/health")
            or (not procs.alive("superlink") and pytest.fail(procs.log("superlink")[-3000:]))
        ),
        timeout=60,
        interval=0.3,
        what="SuperLink /health",
    )

    # two SuperNodes through the image's entry point (partition ids via node config)
    for i in range(2):
        home = tmp_path / f"supernode-{i}-home"
        home.mkdir()
        env = flower_env(home)
        env.update(
            FLAUDIT_SUPERLINK=f"127.0.0.1:{link_port}",
            FLAUDIT_PARTITION_ID=str(i),
            FLAUDIT_NUM_PARTITIONS="2",
        )
        env.pop("FLAUDIT_SUPERLINK_ROOT_CERTIFICATES", None)
        procs.start(
            f"supernode-{i}",
            [
                str(BIN / "python"),
                str(ROOT / "docker" / "supernode-entrypoint.py"),
                *map(str, compose["supernode"]["command"]),
                "--port",
                str(free_port()),
            ],
            env,
        )

    _start_service(top, "flaudit")
    wait_for(
        lambda: all("SuperNode ID" in procs.log(f"supernode-{i}") for i in range(2)),
        timeout=60,
        interval=0.3,
        what="both SuperNodes registered",
    )
    for i in range(2):
        assert f"--node-config partition-id={i} num-partitions=2" in procs.log(f"supernode-{i}")
    return top


@pytest.mark.timeout(420)
def test_deployment_audit_on_superlink_with_two_supernodes(tmp_path):
    from flaudit.server.deployment import RunState, SuperLinkControl

    bodies: list[str] = []
    with ExitStack() as stack:
        top = _start_topology(tmp_path, stack)
        procs, database_url, link_port, api = top.procs, top.database_url, top.link_port, top.api

        spec = dict(TINY_DEPLOYMENT_AUDIT, superlink_address=f"127.0.0.1:{link_port}")
        with httpx.Client(base_url=api, timeout=30) as http:
            created = http.post("/audits", json=spec, headers=AUTH)
            assert created.status_code == 201, created.text
            bodies.append(created.text)
            audit_id = created.json()["id"]

            audit = wait_for_audit(
                http, audit_id, timeout=240, bodies=bodies, what="deployment audit to finish"
            )
            assert audit["status"] == "succeeded", (
                audit.get("reason"),
                procs.log("flaudit")[-3000:],
                procs.log("superlink")[-3000:],
                procs.log("serverapp")[-3000:],
            )
            assert audit["spec"]["engine"] == "deployment"
            rounds = http.get(f"/audits/{audit_id}/rounds")
            bodies.append(rounds.text)
            assert len(rounds.json()["items"]) == spec["num_rounds"]
            assert audit["estimates"], "no estimates after a finished deployment audit"
            bodies.append(http.get(f"/audits/{audit_id}/cosines").text)

            # the runner's worker sees the Flower run finish on the SuperLink and exits
            def worker_done():
                ready = http.get("/readyz").json()
                return ready["detail"].get("running_audits") == 0

            wait_for(worker_done, timeout=90, interval=1.0, what="the deployment worker to exit")

            # cancel: the runner's SIGTERM makes the worker stop the Flower run on the SuperLink
            with SuperLinkControl(f"127.0.0.1:{link_port}") as control:
                before = set(control.runs())
                long_spec = dict(spec, name="deployment topology cancel", num_rounds=50)
                created = http.post("/audits", json=long_spec, headers=AUTH)
                assert created.status_code == 201, created.text
                cancel_id = created.json()["id"]
                new_run = wait_for(
                    lambda: set(control.runs()) - before,
                    timeout=90,
                    interval=1.0,
                    what="the second Flower run",
                )
                (run_id,) = new_run
                # the ServerApp is up and reporting (so the worker holds the run id)
                wait_for(
                    lambda: f"PUT /audits/{cancel_id}/initial-model" in procs.log("flaudit"),
                    timeout=90,
                    interval=0.5,
                    what="the second run's first report",
                )
                cancelled = http.post(f"/audits/{cancel_id}/cancel", headers=AUTH)
                assert cancelled.status_code in (200, 202), cancelled.text

                def run_finished():
                    state = control.runs()[run_id][0]
                    return state if state.finished else None

                state = wait_for(
                    run_finished, timeout=60, interval=0.5, what="the cancelled run to finish"
                )
                assert state is RunState.stopped, state
                assert http.get(f"/audits/{cancel_id}").json()["status"] == "cancelled"
                seeds = [_stored_seed(database_url, cancel_id)]

        # both SuperNodes took part in the Flower run
        for i in range(2):
            assert "[RUN " in procs.log(f"supernode-{i}"), procs.log(f"supernode-{i}")[-2000:]

        seed = _stored_seed(database_url, audit_id)
        seeds.append(seed)

        procs.stop_all()
        for name, proc in procs.started:
            assert proc.poll() is not None, name
            assert not group_alive(proc.pid), name

    texts = bodies + [procs.log(name) for name, _ in procs.started]
    for secret in seeds:
        for form in (str(secret), format(secret, "x"), hex(secret)):
            for text in texts:
                assert form not in text


@pytest.mark.timeout(420)
def test_a_service_restart_leaves_the_flower_run_training_and_the_audit_resumes(tmp_path):
    """compose's `docker compose restart flaudit` mid-audit, as processes: SIGTERM to the
    service while its deployment audit trains, a new service on the same port and database.
    The Flower run must train on while the service is away (never stopped), its ServerApp
    must deliver what it kept, and the audit must end succeeded with every round: none that
    was acknowledged before the restart lost, none missing after it."""
    from flaudit.server.deployment import RunState, SuperLinkControl

    bodies: list[str] = []
    num_rounds = 6
    with ExitStack() as stack:
        top = _start_topology(tmp_path, stack)
        procs = top.procs
        spec = dict(
            TINY_DEPLOYMENT_AUDIT,
            name="deployment topology restart",
            num_rounds=num_rounds,
            superlink_address=f"127.0.0.1:{top.link_port}",
        )
        http = stack.enter_context(httpx.Client(base_url=top.api, timeout=30))
        control = stack.enter_context(SuperLinkControl(f"127.0.0.1:{top.link_port}"))
        created = http.post("/audits", json=spec, headers=AUTH)
        assert created.status_code == 201, created.text
        audit_id = created.json()["id"]

        def first_round():
            body = http.get(f"/audits/{audit_id}").json()
            assert body["status"] in ("queued", "running"), (body["status"], body.get("reason"))
            return body if body["progress"]["round"] >= 1 and body["flower_run_id"] else None

        audit = wait_for(first_round, timeout=200, interval=0.3, what="the audit's round 1")
        run_id = int(audit["flower_run_id"])
        before = [r["round"] for r in http.get(f"/audits/{audit_id}/rounds").json()["items"]]
        assert before and audit["progress"]["round"] < num_rounds, before

        # what `docker compose restart` sends first; the service detaches from the run
        service = next(proc for name, proc in procs.started if name == "flaudit")
        os.kill(service.pid, signal.SIGTERM)
        service.wait(timeout=60)
        state, _ = control.status(run_id)
        assert state is RunState.running, state  # the training goes on without the service
        assert "trains on and is watched again" in procs.log("flaudit")
        time.sleep(5)  # a restart's outage: the ServerApp keeps its reports meanwhile
        _start_service(top, "flaudit-restarted")

        audit = wait_for_audit(
            http, audit_id, timeout=300, bodies=bodies, what="the audit to end after the restart"
        )
        state = wait_for(
            lambda: (s := control.status(run_id)[0]).finished and s,
            timeout=60,
            interval=0.5,
            what="the Flower run to finish",
        )
        logs = {name: procs.log(name) for name, _ in procs.started}
        assert audit["status"] == "succeeded", (
            audit.get("reason"),
            logs["flaudit-restarted"][-3000:],
        )
        assert state is RunState.completed, state  # never stopped
        after = [r["round"] for r in http.get(f"/audits/{audit_id}/rounds").json()["items"]]
        assert set(before) <= set(after) and after == list(range(1, num_rounds + 1)), after
        assert audit["gaps"] == []
        assert audit["flower_run_id"] == str(run_id)
        assert f"watching its Flower run {run_id} again" in logs["flaudit-restarted"]
        seed = _stored_seed(top.database_url, audit_id)

    for text in [*bodies, *logs.values()]:
        for form in (str(seed), format(seed, "x"), hex(seed)):
            assert form not in text


@pytest.mark.timeout(180)
def test_tls_override_command_serves_supernodes_and_control_api(tmp_path):
    """The SuperLink command of docker/compose.tls.yaml, with certificates from
    docker/generate-certs.sh: a SuperNode (image entry point, CA only) registers over TLS, the
    HTTPS health check passes with the CA, and flaudit's Control API client talks to it."""
    from flaudit.server.deployment import DeploymentError, SuperLinkControl

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    certs = tmp_path / "certs"
    subprocess.run(
        ["bash", str(ROOT / "docker" / "generate-certs.sh"), str(certs)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    override = yaml.safe_load((ROOT / "docker" / "compose.tls.yaml").read_text())
    command = [
        str(arg).replace("/certs/", f"{certs}/")
        for arg in override["services"]["superlink"]["command"]
    ]
    port = free_port()
    command[command.index("--host") + 1] = "127.0.0.1"
    command[command.index("--port") + 1] = str(port)
    command[command.index("--database") + 1] = str(tmp_path / "superlink.db")
    assert "--insecure" not in command

    procs = Processes(tmp_path)
    try:
        home = tmp_path / "link-home"
        home.mkdir()
        procs.start("superlink", [str(BIN / "flower-superlink"), *command], flower_env(home))
        health = [
            str(BIN / "python"),
            str(ROOT / "docker" / "healthcheck.py"),
            f"https://127.0.0.1:{port}/health",
        ]
        env = dict(os.environ, HEALTHCHECK_CA_FILE=str(certs / "ca.pem"))
        wait_for(
            lambda: (
                subprocess.run(health, env=env, capture_output=True).returncode == 0
                or (not procs.alive("superlink") and pytest.fail(procs.log("superlink")[-3000:]))
            ),
            timeout=60,
            interval=0.3,
            what="SuperLink HTTPS /health",
        )
        # without the CA the certificate is not trusted
        assert subprocess.run(health, capture_output=True).returncode != 0

        node_home = tmp_path / "node-home"
        node_home.mkdir()
        node_env = flower_env(node_home)
        node_env.update(
            FLAUDIT_SUPERLINK=f"127.0.0.1:{port}",
            FLAUDIT_PARTITION_ID="0",
            FLAUDIT_NUM_PARTITIONS="1",
            FLAUDIT_SUPERLINK_ROOT_CERTIFICATES=str(certs / "ca.pem"),
        )
        procs.start(
            "supernode",
            [
                str(BIN / "python"),
                str(ROOT / "docker" / "supernode-entrypoint.py"),
                "--port",
                str(free_port()),
            ],
            node_env,
        )
        wait_for(
            lambda: "SuperNode ID" in procs.log("supernode"),
            timeout=60,
            interval=0.3,
            what="SuperNode registered over TLS",
        )
        assert "--insecure" not in procs.log("supernode").splitlines()[0]

        # over TLS with the CA the Control API answers (an HTTP error status: no such run) ...
        with SuperLinkControl(
            f"127.0.0.1:{port}", root_certificates=str(certs / "ca.pem")
        ) as control:
            with pytest.raises(DeploymentError, match="HTTPStatusError"):
                control.status(12345)
        # ... while plain HTTP does not even get an HTTP answer from the TLS port
        with SuperLinkControl(f"127.0.0.1:{port}") as plain:
            with pytest.raises(DeploymentError, match="RemoteProtocolError|ConnectError|ReadError"):
                plain.status(12345)
    finally:
        procs.stop_all()
    for name, proc in procs.started:
        assert proc.poll() is not None and not group_alive(proc.pid), name
