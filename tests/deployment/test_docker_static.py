"""Static checks of docker/: compose validates, Dockerfiles lint, and the project's own rules.

No Docker engine runs here or in CI, so the images are never built; these tests make sure what a
user runs with ``docker compose up`` is at least well-formed and follows the rules in
``docker_policy.py``. Each check is also shown to fail on a bad input, so a passing run means
something.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from . import docker_policy as policy

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
CHECK = ROOT / "scripts" / "check-docker.sh"
DOCKERFILES = sorted(p for p in DOCKER.glob("Dockerfile.*") if not p.name.endswith(".dockerignore"))

needs_docker_cli = pytest.mark.skipif(
    shutil.which("docker") is None, reason="the docker CLI is not installed (CI has it)"
)


def _run_check(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(CHECK), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _compose_model(*files: Path, env_file: Path | None = None) -> dict:
    """The merged compose model, as ``docker compose config --format json`` prints it."""
    args = ["json"] + (["--env-file", str(env_file)] if env_file else []) + [str(f) for f in files]
    result = _run_check(*args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# -- the CI check script ----------------------------------------------------------------------


@needs_docker_cli
def test_check_docker_script_passes():
    result = _run_check()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "docker/compose.yaml is valid" in result.stdout
    assert "Dockerfiles pass hadolint" in result.stdout


@needs_docker_cli
def test_compose_config_rejects_a_broken_file(tmp_path):
    broken = tmp_path / "compose.yaml"
    broken.write_text(
        "services:\n  web:\n    image: nginx:1.27\n    ports: 8080\n    restrt: always\n"
    )
    result = _run_check("compose", str(broken))
    assert result.returncode != 0


@needs_docker_cli
def test_hadolint_rejects_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\nRUN cd /tmp\n")
    result = _run_check("lint", str(bad))
    assert result.returncode != 0
    assert re.search(r"DL3007|DL3008|DL3003", result.stdout + result.stderr)


# -- the project's own Dockerfile rules -------------------------------------------------------


def test_there_are_dockerfiles_for_the_service_and_flower():
    names = {p.name for p in DOCKERFILES}
    assert {"Dockerfile.service", "Dockerfile.flower"} <= names


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_follows_policy(path):
    assert policy.check_dockerfile(path.read_text()) == []


def _published_python_versions() -> list[str]:
    """The Python versions the pinned flwr supports (its wheel's classifiers): Flower publishes
    flwr/supernode and flwr/superexec for each of them and flwr/superlink for the latest only
    (framework/dev/build-docker-image-matrix.py in Flower's repository)."""
    from importlib.metadata import metadata

    found = [
        c.rsplit(":: ", 1)[1]
        for c in metadata("flwr").get_all("Classifier")
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    return sorted(found, key=lambda v: int(v.split(".")[1]))


def test_flower_images_are_the_official_pinned_ones_with_tags_that_exist():
    from importlib.metadata import version

    text = (DOCKER / "Dockerfile.flower").read_text()
    images = dict(
        re.findall(r"^ARG (SUPERLINK_IMAGE|SUPEREXEC_IMAGE|SUPERNODE_IMAGE)=(\S+)", text, re.M)
    )
    flwr = version("flwr")
    pythons = _published_python_versions()
    project_python = re.search(
        r'requires-python = ">=(3\.\d+)', (ROOT / "pyproject.toml").read_text()
    )
    # the app-running images: the project's Python, on Ubuntu (published for every version)
    assert project_python.group(1) in pythons
    app_tag = f"{flwr}-py{project_python.group(1)}-ubuntu24.04"
    assert images["SUPEREXEC_IMAGE"] == f"flwr/superexec:{app_tag}"
    assert images["SUPERNODE_IMAGE"] == f"flwr/supernode:{app_tag}"
    # the SuperLink image exists only for the latest Python Flower supports
    assert images["SUPERLINK_IMAGE"] == f"flwr/superlink:{flwr}-py{pythons[-1]}-ubuntu24.04"
    assert "FROM ${SUPERLINK_IMAGE} AS superlink" in text
    assert "FROM ${SUPEREXEC_IMAGE} AS serverapp" in text
    assert "FROM ${SUPERNODE_IMAGE} AS supernode" in text
    # the SuperLink stage installs no project code: it runs none (process isolation)
    superlink_stage = text.split("AS superlink", 1)[1].split("\nFROM ", 1)[0]
    assert "pip-install" not in superlink_stage and '"--isolation", "process"' in superlink_stage
    compose = (DOCKER / "compose.yaml").read_text()
    for name, image in images.items():
        assert f"{name}: ${{{name}:-{image}}}" in compose  # compose passes the same defaults
    assert "torch==2.13.0" in (DOCKER / "Dockerfile.service").read_text()


@pytest.mark.parametrize(
    ("dockerfile", "rule_fragment"),
    [
        ("FROM python\nUSER 1000\nHEALTHCHECK CMD true\n", "no tag"),
        ("FROM python:latest\nUSER 1000\nHEALTHCHECK CMD true\n", "latest"),
        ("ARG TAG\nFROM python:${TAG}\nUSER 1000\nHEALTHCHECK CMD true\n", "ARG without a default"),
        ("FROM python:3.11-slim\nHEALTHCHECK CMD true\n", "no USER"),
        ("FROM python:3.11-slim\nUSER app\nUSER root\nHEALTHCHECK CMD true\n", "ends as root"),
        ("FROM python:3.11-slim\nUSER 1000\n", "no HEALTHCHECK"),
        ("FROM python:3.11-slim\nUSER 1000\nHEALTHCHECK NONE\n", "no HEALTHCHECK"),
        (
            (
                "FROM python:3.11-slim\nRUN apt-get update && \\\n    python -m pip install numpy==2.1\n"
                "USER 1000\nHEALTHCHECK CMD true\n"
            ),
            "--no-cache-dir",
        ),
        ("FROM python:3.11-slim\nENV API_KEY=abc\nUSER 1000\nHEALTHCHECK CMD true\n", "secret"),
        (
            "FROM python:3.11-slim\nENV DB_PASSWORD hunter2\nUSER 1000\nHEALTHCHECK CMD true\n",
            "secret",
        ),
        (
            "FROM python:3.11-slim\nARG GITHUB_TOKEN=ghp_x\nUSER 1000\nHEALTHCHECK CMD true\n",
            "secret",
        ),
    ],
)
def test_policy_catches_each_rule(dockerfile, rule_fragment):
    problems = policy.check_dockerfile(dockerfile)
    assert any(rule_fragment in p for p in problems), problems


def test_policy_accepts_multistage_and_digests():
    good = (
        "ARG BASE=3.11-slim\n"
        "FROM python:${BASE} AS build\nUSER 1000\nHEALTHCHECK CMD true\n"
        "FROM build AS final\nUSER 1000\nHEALTHCHECK CMD true\n"
        "FROM python@sha256:" + "a" * 64 + "\nUSER 1000\nHEALTHCHECK CMD true\n"
        "ENV TOKEN_FILE=\nRUN pip install --no-cache-dir x==1\n"
    )
    assert policy.check_dockerfile(good) == []


# -- compose: services, secrets, TLS, scaling --------------------------------------------------


@needs_docker_cli
def test_compose_services_have_healthchecks_restart_and_no_literal_secrets():
    for files in (
        [DOCKER / "compose.yaml"],
        [DOCKER / "compose.yaml", DOCKER / "compose.tls.yaml"],
    ):
        model = _compose_model(*files)
        assert set(model["services"]) == {
            "postgres",
            "flaudit",
            "superlink",
            "serverapp",
            "supernode",
        }
        assert policy.compose_services_ok(model) == []


def test_compose_policy_catches_problems():
    model = {
        "services": {
            "a": {"image": "nginx", "environment": {"DB_PASSWORD": "x"}},
            "b": {"image": "nginx:latest", "restart": "no", "healthcheck": {"disable": True}},
        }
    }
    problems = "\n".join(policy.compose_services_ok(model))
    for fragment in (
        "a: no healthcheck",
        "a: no restart",
        "a: image nginx",
        "DB_PASSWORD",
        "b: no healthcheck",
        "b: no restart",
        "b: image nginx:latest",
    ):
        assert fragment in problems


@needs_docker_cli
def test_compose_topology_postgres_volume_scaling_and_dependencies():
    model = _compose_model(DOCKER / "compose.yaml", env_file=DOCKER / "example.env")
    services = model["services"]
    assert any(
        v["target"] == "/var/lib/postgresql/data" and v["type"] == "volume"
        for v in services["postgres"]["volumes"]
    )
    assert services["flaudit"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["supernode"]["depends_on"]["superlink"]["condition"] == "service_healthy"
    # no fixed container_name or host port on the SuperNodes: `--scale supernode=N` works
    assert "container_name" not in services["supernode"]
    assert "ports" not in services["supernode"]
    assert services["supernode"]["deploy"]["replicas"] == 2
    assert services["supernode"]["environment"]["FLAUDIT_NUM_PARTITIONS"] == "2"
    assert "--insecure" in services["superlink"]["command"]
    assert "--disable-runtime-dependency-installation" in services["superlink"]["command"]
    # ServerApps run in the serverapp executor, not in the SuperLink (its image has no app code)
    link = services["superlink"]["command"]
    assert link[link.index("--isolation") + 1] == "process"
    assert services["serverapp"]["depends_on"]["superlink"]["condition"] == "service_healthy"
    executor = services["serverapp"]["command"]
    assert executor[executor.index("--runtime-api-address") + 1] == "superlink:9093"
    assert set(services["serverapp"]["networks"]) == {"flower"}
    # the service reaches the SuperLink's network, and the database on its own network
    assert set(services["flaudit"]["networks"]) == {"backend", "flower"}
    assert "backend" not in services["superlink"]["networks"]


@needs_docker_cli
def test_replicas_override_scales_the_service_behind_the_proxy():
    """docker/compose.replicas.yaml (docs/deployment.md §10): the service publishes no port, so
    `--scale flaudit=N` works; the proxy publishes the service's port, follows the rules and
    reaches both networks; everything reports to the proxy."""
    model = _compose_model(DOCKER / "compose.yaml", DOCKER / "compose.replicas.yaml")
    services = model["services"]
    assert set(services) == {"postgres", "flaudit", "superlink", "serverapp", "supernode", "proxy"}
    assert policy.compose_services_ok(model) == []
    flaudit, proxy = services["flaudit"], services["proxy"]
    assert not flaudit.get("ports") and "container_name" not in flaudit
    assert flaudit["deploy"]["replicas"] == 3
    assert flaudit["environment"]["FLAUDIT_PUBLIC_URL"] == "http://proxy:8000"
    assert [p["target"] for p in proxy["ports"]] == [8000]
    assert set(proxy["networks"]) == {"backend", "flower"}
    assert proxy["environment"]["FLAUDIT_REPLICAS"] == "flaudit"
    (volume,) = proxy["volumes"]
    assert Path(volume["source"]) == DOCKER / "haproxy.cfg"
    assert volume["target"] == "/usr/local/etc/haproxy/haproxy.cfg" and volume["read_only"]
    assert proxy["depends_on"]["flaudit"]["condition"] == "service_healthy"


@needs_docker_cli
def test_tls_override_switches_every_flower_link_to_tls():
    model = _compose_model(DOCKER / "compose.yaml", DOCKER / "compose.tls.yaml")
    services = model["services"]
    command = services["superlink"]["command"]
    assert "--insecure" not in command
    for flag, path in (
        ("--ssl-ca-certfile", "/certs/ca.pem"),
        ("--ssl-certfile", "/certs/superlink.pem"),
        ("--ssl-keyfile", "/certs/superlink.key"),
    ):
        assert command[command.index(flag) + 1] == path
    assert (
        services["supernode"]["environment"]["FLAUDIT_SUPERLINK_ROOT_CERTIFICATES"]
        == "/certs/ca.pem"
    )
    assert (
        services["flaudit"]["environment"]["FLAUDIT_SUPERLINK_ROOT_CERTIFICATES"] == "/certs/ca.pem"
    )
    assert services["superlink"]["healthcheck"]["test"][-1].startswith("https://")
    executor = services["serverapp"]["command"]
    assert "--insecure" not in executor
    assert executor[executor.index("--root-certificates") + 1] == "/certs/ca.pem"


def test_example_env_has_placeholders_only_and_real_env_is_ignored():
    text = (DOCKER / "example.env").read_text()
    values = dict(
        line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
    for key in ("POSTGRES_PASSWORD", "FLAUDIT_API_KEY", "FLAUDIT_SECRET_KEY"):
        assert values[key].startswith("CHANGE-ME"), key
    assert "CHANGE-ME" in values["FLAUDIT_DATABASE_URL"]
    for path in ("docker/.env", "docker/certs/ca.key"):
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0, path


# -- helper scripts ---------------------------------------------------------------------------


def test_generate_certs_makes_a_chain_the_superlink_can_serve(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    out = tmp_path / "certs"
    result = subprocess.run(
        ["bash", str(DOCKER / "generate-certs.sh"), str(out), "superlink.example.org", "10.9.8.7"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    verify = subprocess.run(
        ["openssl", "verify", "-CAfile", str(out / "ca.pem"), str(out / "superlink.pem")],
        capture_output=True,
        text=True,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    sans = subprocess.run(
        ["openssl", "x509", "-in", str(out / "superlink.pem"), "-noout", "-ext", "subjectAltName"],
        capture_output=True,
        text=True,
    ).stdout
    for name in (
        "DNS:superlink",
        "DNS:localhost",
        "IP Address:127.0.0.1",
        "DNS:superlink.example.org",
        "IP Address:10.9.8.7",
    ):
        assert name in sans
    assert stat.S_IMODE(os.stat(out / "ca.key").st_mode) == 0o600


def test_supernode_entrypoint_builds_node_config(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("sn_entry", DOCKER / "supernode-entrypoint.py")
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)

    monkeypatch.setenv("FLAUDIT_PARTITION_ID", "3")
    monkeypatch.setenv("FLAUDIT_NUM_PARTITIONS", "4")
    assert entry.node_config() == "partition-id=3 num-partitions=4"

    monkeypatch.delenv("FLAUDIT_PARTITION_ID")
    monkeypatch.setattr(entry, "replica_number", lambda: 2)  # flaudit-supernode-2
    assert entry.node_config() == "partition-id=1 num-partitions=4"

    monkeypatch.setattr(entry, "replica_number", lambda: 5)  # scaled past SUPERNODES
    with pytest.raises(SystemExit):
        entry.node_config()

    monkeypatch.setattr(entry, "replica_number", lambda: None)
    monkeypatch.delenv("FLAUDIT_NUM_PARTITIONS")
    assert entry.node_config() == ""


def test_supernode_replica_number_is_found_by_name_not_by_reverse_lookup():
    """Compose's DNS answers `<project>-supernode-<n>` with each replica's address; a reverse
    lookup of the own address answers the container id from /etc/hosts (issue #24)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sn_entry2", DOCKER / "supernode-entrypoint.py")
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)
    dns = {
        "flaudit-supernode-1": {"10.0.0.5"},
        "flaudit-supernode-2": {"10.0.0.7"},
        "flaudit-supernode-4": {"10.0.0.9"},
    }  # replica 3 not in DNS yet
    lookup = lambda name: dns.get(name, set())  # noqa: E731
    find = lambda mine, **kw: entry.replica_number(  # noqa: E731
        "flaudit-supernode", lookup=lookup, addresses=lambda: mine, wait=0, **kw
    )
    assert find({"10.0.0.5"}) == 1
    assert find({"10.0.0.7"}) == 2
    assert find({"10.0.0.9"}) == 4  # past a gap of one missing name
    assert find({"10.0.0.99"}, attempts=2) is None
    assert find(set(), attempts=1) is None
    # another compose project name (docker compose -p other)
    dns = {"other-supernode-1": {"10.1.0.2"}, "other-supernode-2": {"10.1.0.3"}}
    assert (
        entry.replica_number(
            "other-supernode", lookup=lookup, addresses=lambda: {"10.1.0.3"}, wait=0
        )
        == 2
    )


def test_dockerfiles_fetch_nothing_but_their_bases_and_take_every_base_as_an_argument():
    """No `# syntax=` line (BuildKit would fetch a frontend image from a registry), every FROM
    an ARG that compose.yaml passes through, torch from TORCH_INDEX_URL alone (issue #24)."""
    compose = (DOCKER / "compose.yaml").read_text()
    for name in ("Dockerfile.service", "Dockerfile.flower"):
        text = (DOCKER / name).read_text()
        assert not re.search(r"^#\s*syntax\s*=", text, re.M | re.I), name
        for image in re.findall(r"^FROM (\S+)", text, re.M):
            arg = re.fullmatch(r"\$\{(\w+)\}", image)
            assert arg, f"{name}: FROM {image} is not a build argument"
            assert f"{arg.group(1)}: ${{{arg.group(1)}:-" in compose, arg.group(1)
        assert "--index-url" not in text  # the torch index is used for torch only (pip-install.sh)
    assert "TORCH_INDEX_URL: ${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}" in compose
    assert "POSTGRES_IMAGE:-postgres:" in compose
    helper = (DOCKER / "pip-install.sh").read_text()
    assert '--no-deps "$@" "torch==$version"' in helper


def test_image_dependency_layers_follow_pyproject():
    """docker/project-deps.py: every runtime dependency of pyproject.toml (and the extras asked
    for) but torch, which the builds take from its own index first; the Flower images' flwr
    replaced (no Ray). The sources are installed after it with --no-deps, so nothing is missed."""
    import sys
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def deps(*args):
        done = subprocess.run(
            [sys.executable, str(DOCKER / "project-deps.py"), str(ROOT / "pyproject.toml"), *args],
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.split()

    service = deps("postgres")
    expected = [
        d
        for d in project["dependencies"] + project["optional-dependencies"]["postgres"]
        if not d.startswith("torch")
    ]
    assert service == expected and not any(d.startswith("torch") for d in service)
    flower = deps("--flwr", "flwr==1.41.0")
    assert "flwr==1.41.0" in flower and not any(d.startswith("flwr[") for d in flower)
    assert len(flower) == len(project["dependencies"]) - 1
    for name in ("Dockerfile.service", "Dockerfile.flower"):
        text = (DOCKER / name).read_text()
        torch = text.index("torch 2.13.0")
        deps_layer = text.index("flaudit-project-deps.py pyproject.toml")
        sources = text.index("auditor ./auditor")
        assert torch < deps_layer < sources, name
        assert "--no-deps ." in text, name
