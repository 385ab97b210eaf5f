"""Static checks of the replicas shape (docs/deployment.md §10): HAProxy accepts the shipped
configuration, the end-to-end test's proxy routes, checks and retries as the shipped one does,
and the Kubernetes example has the same shape as the compose override. The run itself:
scripts/replicas-e2e.sh (.ci/run)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "docker" / "haproxy.cfg"
HAPROXY = shutil.which("haproxy") or (
    "/usr/sbin/haproxy" if os.access("/usr/sbin/haproxy", os.X_OK) else None
)
#: The lines that decide where a request goes and when it is retried.
ROUTING = (
    "balance uri depth 2",
    "hash-type consistent",
    "option httpchk GET /readyz",
    "http-check expect status 200",
    "retry-on conn-failure empty-response",
    "option http-server-close",
)


def _lines(text: str) -> set[str]:
    return {line.split("#")[0].strip() for line in text.splitlines()} - {""}


@pytest.mark.skipif(HAPROXY is None, reason="HAProxy is not installed (.ci/run installs it)")
def test_haproxy_accepts_the_shipped_configuration_and_refuses_a_broken_one(tmp_path):
    env = {**os.environ, "FLAUDIT_REPLICAS": "localhost"}
    ok = subprocess.run([HAPROXY, "-c", "-f", str(CONFIG)], capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = tmp_path / "haproxy.cfg"
    broken.write_text(CONFIG.read_text().replace("balance uri depth 2", "balance nonsense"))
    bad = subprocess.run(
        [HAPROXY, "-c", "-f", str(broken)], capture_output=True, text=True, env=env
    )
    assert bad.returncode != 0


def test_the_e2e_proxy_routes_checks_and_retries_as_the_shipped_one():
    shipped = _lines(CONFIG.read_text())
    source = (ROOT / "scripts" / "replicas_e2e.py").read_text()
    tested = _lines(re.search(r'HAPROXY_CFG = """(.*?)"""', source, re.S).group(1))
    for line in ROUTING:
        assert line in shipped and line in tested, line
    assert "option redispatch" not in " ".join(shipped | tested)  # one takeover, not two


def test_kubernetes_example_has_the_replicas_shape():
    docs = list(yaml.safe_load_all((ROOT / "docker" / "k8s" / "flaudit-replicas.yaml").read_text()))
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert set(by_name) == {
        ("Deployment", "flaudit"),
        ("Service", "flaudit-replicas"),
        ("Deployment", "flaudit-proxy"),
        ("Service", "flaudit"),
    }
    service = by_name[("Deployment", "flaudit")]["spec"]
    assert service["replicas"] >= 2
    (container,) = service["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["FLAUDIT_INSTANCE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["FLAUDIT_PUBLIC_URL"]["value"] == "http://flaudit:8000"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert by_name[("Service", "flaudit-replicas")]["spec"]["clusterIP"] == "None"
    proxy = by_name[("Deployment", "flaudit-proxy")]["spec"]
    assert proxy["replicas"] == 1  # several proxies could disagree on the ring (see the file)
    (haproxy,) = proxy["template"]["spec"]["containers"]
    proxy_env = {e["name"]: e.get("value") for e in haproxy["env"]}
    assert proxy_env["FLAUDIT_REPLICAS"].startswith("flaudit-replicas.")
    assert haproxy["volumeMounts"][0]["mountPath"] == "/usr/local/etc/haproxy"
    selector = by_name[("Service", "flaudit")]["spec"]["selector"]
    assert selector == {"app": "flaudit-proxy"}
