"""Flower's own ``examples/opacus`` (record-level DP-SGD in every client; copied with only its
hub data replaced: ``third_party/flower_opacus/ORIGIN.md``), changed only by the lines
docs/flower.md shows, on a SuperLink with two SuperNodes on loopback against a running
``flaudit serve``: the correct app is not refuted; half the noise and per-example clipping
bypassed are refuted with their cause named (issue #37).

The bugs are planted without changing the app: the SuperNodes run with
``tests/integration/opacus_bugs`` on ``PYTHONPATH``, whose ``sitecustomize.py`` patches Opacus's
``DPOptimizer`` as the file ``FLAUDIT_TEST_OPACUS_BUG_FILE`` says (read every time the app builds
its optimizer), so one federation serves the three runs, one after the other.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest

from flaudit.server.record_http import RecordAuditClient
from tests.integration import federation
from tests.processes import ROOT, Processes, wait_for

pytestmark = pytest.mark.slow

TEMPLATE = Path(__file__).parent / "third_party" / "flower_opacus"
BUGS = Path(__file__).parent / "opacus_bugs"
API_KEY = "record-opacus-key-" + "k" * 12
SEED = 0x5EED_0FAC  # the service's test-only canary seeds
NODES = 2
#: the SuperNodes hold partitions 0 and 1 of PARTITIONS (node config, not the app): 144 train
#: examples each, so Opacus samples at q = 1/5 and a round is 5 DP-SGD steps
PARTITIONS = 10
NUM_ROUNDS = 3
NUM_CANARIES = 20000
#: run: (bug planted in every client's DPOptimizer, verdict, cause)
CASES = {
    "correct": ("", None),
    "noise x0.5": ("noise_scale=0.5", "noise"),
    "clipping bypassed": ("no_clipping", "clipping"),
}


def documented_blocks() -> dict[str, list[str]]:
    """The code blocks docs/flower.md marks with ``<!-- flaudit-record: NAME -->``."""
    text = (ROOT / "docs" / "flower.md").read_text()
    pattern = r"<!-- flaudit-record: ([^>]+?) -->\n```\w*\n(.*?)```"
    return {
        m.group(1): m.group(2).rstrip("\n").split("\n") for m in re.finditer(pattern, text, re.S)
    }


def insert_after(text: str, anchor: str, lines: list[str]) -> str:
    assert text.count(anchor) == 1, f"examples/opacus no longer has {anchor!r} once"
    return text.replace(anchor, anchor + "\n" + "\n".join(lines), 1)


def make_app(dest: Path) -> int:
    """Copy the app, apply the documented lines; return how many lines they add."""
    shutil.copytree(TEMPLATE, dest, ignore=shutil.ignore_patterns("ORIGIN.md", "__pycache__"))
    blocks = documented_blocks()
    pkg = dest / "opacus_fl"
    client = (pkg / "client_app.py").read_text()
    client = insert_after(client, "from opacus import PrivacyEngine", blocks["client_app imports"])
    client = insert_after(client, "@app.train()", blocks["client_app train"])
    client = insert_after(
        client, "        max_grad_norm=max_grad_norm,\n    )", blocks["client_app optimizer"]
    )
    (pkg / "client_app.py").write_text(client)
    server = (pkg / "server_app.py").read_text()
    server = insert_after(
        server, "from flwr.serverapp.strategy import FedAvg", blocks["server_app imports"]
    )
    server = insert_after(
        server,
        "        train_metrics_aggr_fn=aggregate_train,\n    )",
        blocks["server_app strategy"],
    )
    (pkg / "server_app.py").write_text(server)
    pyproject = (dest / "pyproject.toml").read_text()
    (dest / "pyproject.toml").write_text(
        insert_after(pyproject, "[tool.flwr.app.config]", blocks["pyproject config"])
    )
    return sum(len(lines) for lines in blocks.values())


def wait_for_verdict(audit: RecordAuditClient, *, timeout: float) -> dict:
    """``GET /audits/{id}`` once the audit has ended (the ServerApp ends it after its last
    round)."""

    def ended():
        body = audit.status()
        return body if body["status"] != "running" else None

    return wait_for(ended, timeout=timeout, interval=1.0, what="the record-level verdict")


@pytest.mark.timeout(900)  # 551 s at load 12-14, 377 s at load 9-10 (docs/flower.md)
def test_flower_opacus_example_audited_at_record_level(tmp_path):
    env, address = federation.flower_home(tmp_path)
    bug_file = tmp_path / "planted-bug"
    bug_file.write_text("")
    node_env = {
        **env,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(BUGS)]),
        "FLAUDIT_TEST_OPACUS_BUG_FILE": str(bug_file),
        "OMP_NUM_THREADS": "1",  # torch's threads thrash on a loaded 2-core machine
    }
    key_file = tmp_path / "api-key"
    key_file.write_text(API_KEY + "\n")
    service = federation.start_service(tmp_path, API_KEY, seed=SEED)
    procs = Processes(tmp_path, cwd=tmp_path)
    app = tmp_path / "opacus-app"
    added = make_app(app)
    assert added <= 15  # the documented change stays small
    verdicts, took = {}, {}
    try:
        federation.start_federation(procs, node_env, address, NODES, num_partitions=PARTITIONS)
        for name, (bug, _) in CASES.items():
            started = time.monotonic()
            bug_file.write_text(bug)
            audit = RecordAuditClient.create(
                service.url,
                {
                    "name": f"examples/opacus, {name}",
                    "engine": "external",
                    "num_rounds": NUM_ROUNDS,
                    "num_clients": NODES,
                    "num_canaries": NUM_CANARIES,
                    "delta": 1e-5,
                },
                api_key=API_KEY,
            )
            run_config = federation.write_run_config(
                tmp_path / f"run-{len(verdicts)}.toml",
                {
                    "num-server-rounds": NUM_ROUNDS,
                    "target-delta": 1e-5,
                    "max-grad-norm": 1.0,
                    "flaudit-ingest-url": service.url,
                    "flaudit-audit-id": audit.audit_id,
                    "flaudit-api-key-file": str(key_file),
                },
            )
            federation.submit(app, run_config, node_env, tmp_path, timeout=90)
            verdicts[name] = wait_for_verdict(audit, timeout=300)
            took[name] = time.monotonic() - started
    finally:
        procs.stop_all()
        service.stop()
    for name, body in verdicts.items():
        looks = [
            (look["round"], look["status"], f"{look['p_value']:.3g}") for look in body["looks"]
        ]
        print(f"{name}: {body['verdict']} cause={body['cause']} looks={looks} {took[name]:.0f} s")
    logs = {p.name: p.read_text(errors="replace")[-3000:] for p in tmp_path.glob("*.log")}
    for name, (_, cause) in CASES.items():
        body = verdicts[name]
        assert body["status"] == "succeeded", (body["reason"], logs)
        assert body["progress"]["rounds_reported"] == NUM_ROUNDS
        assert all(c["rounds_trained"] == NUM_ROUNDS for c in body["clients"]), body["clients"]
        assert {c["noise_multiplier"] for c in body["clients"]} == {1.0, 1.5}  # the app's own
        if cause is None:
            assert body["verdict"]["status"] != "claim_refuted", (name, body["verdict"])
        else:
            assert body["verdict"]["status"] == "claim_refuted", (name, body["verdict"], logs)
            assert cause in str(body["cause"]).lower(), (name, body["cause"])
    for path in tmp_path.glob("*.log"):  # the API key reaches no log
        assert API_KEY not in path.read_text(errors="replace")
