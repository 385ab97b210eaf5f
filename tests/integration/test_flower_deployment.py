"""Deployment engine: a SuperLink and two SuperNodes as subprocesses on 127.0.0.1, a 2-round audit
submitted with `flwr run`, round data received by a minimal in-test ingest server that also serves
each round's canary sum from the seed, as the service does: the run config holds no seed
(issue #29). Everything started here is stopped by PID."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from flaudit.auditor.canaries import seen_mask
from flaudit.auditor.schedules import audit_canary_plan
from flaudit.auditor.spec import AuditSpec
from flaudit.auditor.statistics import CosineTracker
from flaudit.server.deployment import _run_config_toml, build_run_config
from flaudit.service.external import round_canary_sum
from tests.integration import federation
from tests.processes import ROOT, Processes

pytestmark = pytest.mark.slow

SEED = 2**100 + 12345
TOKEN = "run-token-for-test"


class Ingest:
    """Records PUTs to /audits/{id}/initial-model, /rounds/{t}, /final-model; serves GET
    /audits/{id}/rounds/{t}/canary-sum from the seed (what the service does)."""

    def __init__(self, audit_id: str, spec: AuditSpec) -> None:
        self.audit_id = audit_id
        self.spec = spec
        self.fetched: list[int] = []
        self.initial = None
        self.rounds: dict[int, tuple[np.ndarray, dict]] = {}
        self.final = None
        self.final_params: dict = {}
        self.rejected: list[str] = []
        self.done = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):  # noqa: N802
                path = self.path.split("?")[0]
                match = re.fullmatch(rf"/audits/{outer.audit_id}/rounds/(\d+)/canary-sum", path)
                if (
                    self.headers.get("Authorization") != f"Bearer {TOKEN}"
                    or match is None
                    or outer.initial is None
                ):
                    outer.rejected.append(path)
                    self.send_response(409)
                    self.end_headers()
                    return
                t = int(match.group(1))
                if (
                    t > outer.spec.num_rounds
                ):  # fetched ahead past the last round: the service's 422
                    self.send_response(422)
                    self.end_headers()
                    return
                total, count = round_canary_sum(SEED, outer.spec, t, outer.initial.size)
                body = np.ascontiguousarray(total, dtype="<f4").tobytes()
                outer.fetched.append(t)
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("X-Canary-Count", str(count))
                self.send_header("X-Canary-Dim", str(outer.initial.size))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self):  # noqa: N802
                from urllib.parse import parse_qsl, urlsplit

                parts = urlsplit(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    outer.rejected.append(parts.path)
                    self.send_response(401)
                    self.end_headers()
                    return
                params = dict(parse_qsl(parts.query))
                # a round body is the float32 vector, then num_participants int32 indices
                tail = 4 * int(params.get("num_participants", 0))
                vector = np.frombuffer(body[: len(body) - tail], dtype="<f4").copy()
                if tail:
                    params["participants"] = np.frombuffer(body[len(body) - tail :], dtype="<i4")
                prefix = f"/audits/{outer.audit_id}/"
                path = parts.path[len(prefix) :] if parts.path.startswith(prefix) else None
                if path == "initial-model":
                    outer.initial = vector
                elif path is not None and path.startswith("rounds/"):
                    outer.rounds[int(path.split("/")[1])] = (vector, params)
                elif path == "final-model":
                    outer.final, outer.final_params = vector, params
                    outer.done.set()
                else:
                    outer.rejected.append(parts.path)
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def _descendants(pids: set[int], marker: str) -> set[int]:
    """PIDs of processes started (directly or not) by ours: by parent, or by the unique port
    marker/--parent-pid in their command line (Flower detaches some helpers)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parent_flag = re.search(r"--parent-pid (\d+)", cmd)
        if ppid in pids or marker in cmd or (parent_flag and int(parent_flag.group(1)) in pids):
            found.add(int(entry.name))
    return found - {os.getpid()}


def _stop(procs: list[subprocess.Popen], marker: str) -> None:
    ours = {p.pid for p in procs}
    for _ in range(3):  # the tree may grow while we look
        ours |= _descendants(ours, marker)
    for pid in sorted(ours, reverse=True):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
    time.sleep(1)
    for pid in _descendants(ours, marker) | ours:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.timeout(300)
def test_two_round_audit_on_superlink_with_two_supernodes(tmp_path):
    env, marker = federation.flower_home(tmp_path, project_on_path=False)
    spec = AuditSpec(
        task="synthetic",
        task_options={"dim": 3000, "test_size": 200},
        num_rounds=2,
        num_clients=4,
        clients_per_round=3,
        participation="uniform",
        num_canaries=4,
        noise_multiplier=0.1,
        clip_norm=1.0,
        canary_repeats=1,
        engine="deployment",
        superlink_address=marker,
    )
    ingest = Ingest("audit-42", spec)
    run_config = tmp_path / "run-config.toml"
    config = build_run_config(
        spec, audit_id="audit-42", canary_seed=SEED, ingest_url=ingest.url, run_token=TOKEN
    )
    text = _run_config_toml(config)
    assert not any(form in text for form in (str(SEED), hex(SEED), format(SEED, "x")))
    run_config.write_text(text + "flaudit-min-nodes = 2\nflaudit-round-timeout = 120.0\n")
    procs = Processes(tmp_path, cwd=tmp_path)

    started = time.monotonic()
    try:
        federation.start_federation(procs, env, marker, 2, partitions=False)
        federation.submit(ROOT, run_config, env, tmp_path, timeout=90)
        finished = ingest.done.wait(timeout=220)
        logs = {p.name: p.read_text(errors="replace")[-3000:] for p in tmp_path.glob("*.log")}
        assert finished, f"no final model received; logs: {logs}"
    finally:
        _stop([proc for _, proc in procs.started], marker)
        ingest.close()
    elapsed = time.monotonic() - started
    print(f"deployment audit took {elapsed:.1f} s")

    for text in (p.read_text(errors="replace") for p in tmp_path.glob("*.log")):
        assert str(SEED) not in text  # the seed never reaches a log
    assert not ingest.rejected
    assert sorted(ingest.rounds) == [1, 2]
    assert sorted(set(ingest.fetched)) == [1, 2]  # each round's canaries came from the "service"
    d = ingest.initial.size
    assert d > 1000 and ingest.final.size == d
    total = ingest.initial + sum(v for v, _ in ingest.rounds.values())
    assert np.allclose(ingest.final, total, atol=1e-5)
    for _, params in ingest.rounds.values():
        assert float(params["clip_norm"]) == 1.0
        assert int(params["num_failures"]) == 0
        assert int(params["cohort_size"]) >= 1
    assert 0.0 <= float(ingest.final_params["accuracy"]) <= 1.0
    inserted = sum(int(p["num_canaries_inserted"]) for _, p in ingest.rounds.values())
    mask = seen_mask(SEED, spec.num_canaries)
    assert inserted == int(mask.sum())
    # no round names its canary participants (the ServerApp cannot: it has no seed); the
    # service derives them, and each seen canary is among them in exactly canary_repeats = 1 round
    plan = audit_canary_plan(SEED, spec)
    counts = np.zeros(spec.num_canaries, dtype=int)
    for t, (_, params) in ingest.rounds.items():
        assert "participants" not in params and "num_participants" not in params
        assert int(params["num_canaries_inserted"]) == plan.seen(t).size
        counts[plan.participants(t)] += 1
    assert np.all(counts[mask] == 1)
    tracker = CosineTracker(SEED, spec.num_canaries, d, family=spec.canary_family)
    tracker.finalize(ingest.final, ingest.initial)
    if mask.any() and (~mask).any():
        assert tracker.final_cosines[mask].min() > tracker.final_cosines[~mask].max()
