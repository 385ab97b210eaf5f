"""Replicas behind one URL, end to end (issue #41; run by scripts/replicas-e2e.sh, which checks
the prerequisites and makes the database).

Three ``flaudit serve`` replicas (uvicorn on loopback ports, ``FLAUDIT_INSTANCE_ID`` replica-1..3,
the default 30 s lease) on one PostgreSQL database, behind HAProxy routing by audit id
(``balance uri depth 2`` over ``/audits/<id>``, consistent hashing, health checks on
``/readyz``). Through the proxy, like a user's own Flower app (``engine = "external"``: claim,
initial model, each round's canary sum, the round's released update, the final model; every
request retried on connection errors and 5xx as the ServerApp's reporter does):

* two audits run rounds: an honest DP-FedAvg one and one whose noise is 50 times smaller than
  claimed (its alarm must fire);
* a third, quiet audit held by the same replica as one of them (audits are created until one
  hashes there) stops sending while that replica is down: only the background takeover of an
  expired lease gives it a new owner;
* once that running audit has ``--kill-at`` rounds acknowledged, its replica is killed with
  SIGKILL.

It fails unless every audit ends ``succeeded`` with its verdict (the honest one not refuted, the
buggy one refuted), every acknowledged round is in the database (rounds ``1..T``, no gap), the
killed replica's audits name their takeover (``owner_changes``), and each continued within 60 s
of the kill. It prints what it measured (JSON, and ``--results PATH``).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from datetime import datetime
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flaudit.protocol.wire import RUN_ID_HEADER  # noqa: E402
from flaudit.service.sealing import generate_secret_key  # noqa: E402
from flaudit.service.store import Store  # noqa: E402

API_KEY = "replicas-e2e-key-" + secrets.token_hex(8)
AUTH = {"Authorization": f"Bearer {API_KEY}"}
TAKEOVER_LIMIT = 60.0  # seconds: the bound

HAPROXY_CFG = """\
global
    maxconn 512
defaults
    mode http
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    timeout http-request 30s
    # a dead replica's requests fail (503) until the checks take it out of the ring, then go to
    # the replica the ring names (redispatching at once would pick another one first: two
    # takeovers instead of one); the run retries them
    retries 2
    retry-on conn-failure empty-response
    option http-server-close
frontend flaudit
    bind 127.0.0.1:{port}
    default_backend replicas
backend replicas
    balance uri depth 2
    hash-type consistent
    option httpchk GET /readyz
    http-check expect status 200
    default-server check inter 1s fall 2 rise 2
{servers}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def say(message: str) -> None:
    print(f"[replicas-e2e {time.monotonic() - T0:5.1f}s] {message}", flush=True)


T0 = time.monotonic()


class Failed(Exception):
    pass


def wait_until(check, *, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Failed(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


class Run:
    """One external audit driven like a user's Flower app: a thread posting its rounds."""

    def __init__(self, name: str, proxy: str, args, *, noise: float, quiet: bool = False):
        self.name = name
        self.args = args
        self.noise = noise  # the noise actually added, in units of the claimed one
        self.quiet = quiet
        self.http = httpx.Client(base_url=proxy, timeout=30)
        self.run_headers = {RUN_ID_HEADER: secrets.token_hex(8)}
        self.acks: list[tuple[int, float]] = []  # (round, when acknowledged: time.time())
        self.retries = 0
        self.errors: list[str] = []
        self.rng = np.random.default_rng(zlib.crc32(name.encode()))
        self.model = np.zeros(args.dim, dtype=np.float32)
        self.paused = threading.Event()  # the quiet run waits while set
        self.idle = threading.Event()  # ... and says when it is waiting (no request in flight)
        self.resumed_at: float | None = None
        self.thread: threading.Thread | None = None
        self.failure: str | None = None
        self.final_ack: float | None = None

    # -- requests, retried as the reporter does (connection errors, 5xx) ---------------------
    def request(self, method: str, path: str, **kwargs) -> httpx.Response:
        deadline = time.monotonic() + 120
        while True:
            try:
                response = self.http.request(method, path, **kwargs)
                if response.status_code < 500:
                    if response.status_code >= 400:
                        raise Failed(
                            f"{self.name}: {method} {path} refused: HTTP "
                            f"{response.status_code} {response.text[:300]}"
                        )
                    return response
                problem = f"HTTP {response.status_code}"
            except httpx.TransportError as exc:
                problem = type(exc).__name__
            self.retries += 1
            if len(self.errors) < 20:
                self.errors.append(f"{time.time():.1f} {method} {path}: {problem}")
            if time.monotonic() > deadline:
                raise Failed(f"{self.name}: {method} {path} failed for 120 s ({problem})")
            time.sleep(0.2)

    def token(self) -> dict:
        return {**self.run_headers, "Authorization": f"Bearer {self.run_token}"}

    def put_vector(self, path: str, vector: np.ndarray, **params) -> dict:
        return self.request(
            "PUT",
            path,
            content=np.ascontiguousarray(vector, "<f4").tobytes(),
            params=params,
            headers={**self.token(), "Content-Type": "application/octet-stream"},
        ).json()

    # -- the run --------------------------------------------------------------------------
    def create(self) -> None:
        a = self.args
        created = self.request(
            "POST",
            "/audits",
            json={
                "name": self.name,
                "engine": "external",
                "num_canaries": a.canaries,
                "canary_repeats": 1,
                "max_canary_fraction": 1.0,
                "delta": 1e-5,
            },
            headers=AUTH,
        ).json()
        self.audit_id = created["id"]
        self.run_token = created["environment"]["FLAUDIT_RUN_TOKEN"]
        self.base = f"/audits/{self.audit_id}"
        self.request(
            "PUT",
            f"{self.base}/claim",
            json={
                "noise_multiplier": 1.0,
                "clip_norm": 1.0,
                "num_rounds": a.rounds,
                "num_clients": a.cohort,  # all clients every round
                "clients_per_round": a.cohort,
            },
            headers=self.token(),
        )
        self.put_vector(f"{self.base}/initial-model", self.model)

    def round(self, t: int) -> None:
        a = self.args
        served = self.request("GET", f"{self.base}/rounds/{t}/canary-sum", headers=self.token())
        count = int(served.headers["X-Canary-Count"])
        canaries = np.frombuffer(served.content, "<f4")
        # DP-FedAvg with clip norm 1: the cohort's clipped replies (c canaries, the rest benign
        # and random here) plus Gaussian noise of std noise_multiplier * C, averaged over n
        benign = self.rng.standard_normal(a.dim, dtype=np.float32) * np.float32(
            np.sqrt((a.cohort - count) / a.dim)
        )
        noise = self.rng.standard_normal(a.dim, dtype=np.float32) * np.float32(self.noise)
        delta = (canaries + benign + noise) / np.float32(a.cohort)
        ack = self.put_vector(
            f"{self.base}/rounds/{t}",
            delta,
            clip_norm=1.0,
            cohort_size=a.cohort,
            num_failures=0,
            num_canaries_inserted=count,
        )
        if ack.get("round") != t:
            raise Failed(f"{self.name}: round {t} acknowledged as {ack}")
        self.acks.append((t, time.time()))
        self.model += delta

    def main(self) -> None:
        try:
            for t in range(1, self.args.rounds + 1):
                if self.paused.is_set():
                    # quiet: no request at all until the test resumes it
                    self.idle.set()
                    while self.paused.is_set():
                        time.sleep(0.1)
                    self.idle.clear()
                    self.resumed_at = time.time()
                self.round(t)
                time.sleep(self.args.round_seconds)
            self.put_vector(f"{self.base}/final-model", self.model)
            self.final_ack = time.time()
        except Exception as exc:  # reported by the checks
            self.failure = f"{type(exc).__name__}: {exc}"

    def start(self) -> None:
        self.thread = threading.Thread(target=self.main, name=self.name, daemon=True)
        self.thread.start()


def owner_of(store: Store, audit_id: str) -> str | None:
    audit = store.get_audit(audit_id)
    return None if audit is None else audit.owner_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True, help="a fresh PostgreSQL database")
    parser.add_argument("--haproxy", default="haproxy")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--dim", type=int, default=20_000)
    parser.add_argument("--canaries", type=int, default=40)
    parser.add_argument("--cohort", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--round-seconds", type=float, default=0.3)
    parser.add_argument(
        "--kill-at", type=int, default=8, help="rounds of the victim's audit acked before the kill"
    )
    parser.add_argument("--results", default=None, help="write the measurements here (JSON)")
    args = parser.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="flaudit-replicas-"))
    proxy_port = free_port()
    proxy = f"http://127.0.0.1:{proxy_port}"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "FLAUDIT_API_KEY": API_KEY,
        "FLAUDIT_SECRET_KEY": generate_secret_key(),  # one key: every replica opens the seeds
        "FLAUDIT_PUBLIC_URL": proxy,
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_HOME": str(tmp / "flwr"),
    }
    env.pop("FLAUDIT_LEASE_SECONDS", None)  # the default lease is what is measured
    processes: dict[str, subprocess.Popen] = {}
    ports: dict[str, int] = {}
    logs: dict[str, Path] = {}
    runs: list[Run] = []
    results: dict = {"replicas": args.replicas, "dim": args.dim, "rounds": args.rounds}
    try:
        # the database's schema first, once (the replicas would race to create it)
        Store(args.database_url).dispose()
        for i in range(1, args.replicas + 1):
            name = f"replica-{i}"
            ports[name] = free_port()
            logs[name] = tmp / f"{name}.log"
            processes[name] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "flaudit.commands.cli",
                    "serve",
                    "--port",
                    str(ports[name]),
                    "--database-url",
                    args.database_url,
                    "--log-level",
                    "info",
                ],
                cwd=ROOT,
                env={**env, "FLAUDIT_INSTANCE_ID": name},
                stdout=logs[name].open("wb"),
                stderr=subprocess.STDOUT,
            )
        servers = "\n".join(f"    server {n} 127.0.0.1:{p}" for n, p in ports.items())
        config = tmp / "haproxy.cfg"
        config.write_text(HAPROXY_CFG.format(port=proxy_port, servers=servers))
        checked = subprocess.run(
            [args.haproxy, "-c", "-f", str(config)], capture_output=True, text=True
        )
        if checked.returncode != 0:
            raise Failed(f"haproxy refuses the configuration: {checked.stdout}{checked.stderr}")
        logs["haproxy"] = tmp / "haproxy.log"
        processes["haproxy"] = subprocess.Popen(
            [args.haproxy, "-db", "-f", str(config)],
            stdout=logs["haproxy"].open("wb"),
            stderr=subprocess.STDOUT,
        )
        for name, port in ports.items():
            wait_until(
                lambda port=port, name=name: (
                    answers(f"http://127.0.0.1:{port}/readyz") or processes[name].poll() is not None
                ),
                timeout=90,
                what=f"{name} to answer /readyz",
            )
            if processes[name].poll() is not None:
                raise Failed(f"{name} exited with {processes[name].returncode}")
        wait_until(lambda: answers(f"{proxy}/readyz"), timeout=20, what="the proxy")
        say(f"{args.replicas} replicas and HAProxy up (proxy {proxy}); database {tmp}")
        store = Store(args.database_url)

        honest = Run("honest", proxy, args, noise=1.0)
        buggy = Run("buggy", proxy, args, noise=0.02)
        for run in (honest, buggy):
            run.create()
        for run in (honest, buggy):
            wait_until(
                lambda run=run: owner_of(store, run.audit_id),
                timeout=10,
                what=f"the lease of {run.name!r}",
            )
        # a quiet audit held by the same replica as a running one (the victim): audits are
        # created until one hashes to a replica that holds honest or buggy
        active = {owner_of(store, run.audit_id): run for run in (buggy, honest)}
        quiet = None
        for attempt in range(12):
            candidate = Run(f"quiet-{attempt}", proxy, args, noise=1.0, quiet=True)
            candidate.create()
            if owner_of(store, candidate.audit_id) in active:
                quiet = candidate
                break
            candidate.request("POST", f"{candidate.base}/cancel", headers=AUTH)
        if quiet is None:
            raise Failed(f"no audit of 12 hashed to {sorted(active)}")
        victim = owner_of(store, quiet.audit_id)
        first = active[victim]  # the running audit of the replica killed (honest if both are)
        runs = [honest, buggy, quiet]
        owners = {run.name: owner_of(store, run.audit_id) for run in runs}
        say(f"audits {[(r.name, r.audit_id) for r in runs]}, owners {owners}; victim {victim}")
        for run in runs:
            run.start()
        wait_until(
            lambda: len(first.acks) >= args.kill_at and len(quiet.acks) >= 2,
            timeout=60,
            what=f"{args.kill_at} rounds of {first.name!r}",
            interval=0.02,
        )
        quiet.paused.set()  # from now on the quiet run sends nothing until resumed
        wait_until(quiet.idle.is_set, timeout=30, what="the quiet run to pause", interval=0.02)
        os.kill(processes[victim].pid, signal.SIGKILL)
        killed_at = time.time()
        processes[victim].wait()
        acked_before = {run.name: len(run.acks) for run in runs}
        say(f"SIGKILL {victim} (pid {processes[victim].pid}); rounds acked so far {acked_before}")

        # the quiet audit: no request reaches it; a live replica takes its expired lease over
        wait_until(
            lambda: owner_of(store, quiet.audit_id) not in (victim, None),
            timeout=TAKEOVER_LIMIT + 15,
            what="the background takeover of the quiet audit",
            interval=0.25,
        )
        quiet_taken = time.time() - killed_at
        say(
            f"quiet audit taken over by {owner_of(store, quiet.audit_id)} after {quiet_taken:.1f} s"
        )
        quiet.paused.clear()
        for run in runs:
            run.thread.join(timeout=150)
            if run.thread.is_alive():
                raise Failed(f"{run.name}: still running after 150 s")

        # --- the checks ------------------------------------------------------------------
        problems = []
        per_audit = {}
        for run in runs:
            if run.failure:
                problems.append(f"{run.name}: the run failed: {run.failure}")
                continue
            audit = store.get_audit(run.audit_id)
            stored = [r.round for r in store.list_rounds(run.audit_id)]
            acked = [t for t, _ in run.acks]
            view = httpx.get(f"{proxy}/audits/{run.audit_id}", timeout=30).json()
            lost = sorted(set(acked) - set(stored))
            after = [when - killed_at for _, when in run.acks if when > killed_at]
            changes = audit.owner_changes or []
            per_audit[run.name] = {
                "audit_id": run.audit_id,
                "owner_before_kill": owners[run.name],
                "status": audit.status,
                "verdict": view["verdict"]["status"],
                "verdict_summary": view["verdict"]["summary"],
                "rounds_acknowledged": len(acked),
                "rounds_stored": len(stored),
                "acknowledged_rounds_lost": lost,
                "gaps": audit.gaps or [],
                "owner_changes": changes,
                "first_ack_after_kill_s": round(after[0], 2) if after else None,
                "requests_retried": run.retries,
                "retried": run.errors[:5],
            }
            if audit.status != "succeeded":
                problems.append(f"{run.name}: {audit.status} ({audit.reason})")
            if lost:
                problems.append(f"{run.name}: acknowledged rounds {lost} are not in the database")
            if stored != list(range(1, args.rounds + 1)):
                problems.append(f"{run.name}: rounds stored {stored}")
            if audit.gaps:
                problems.append(f"{run.name}: gaps {audit.gaps}")
            if owners[run.name] == victim:
                moved = [c for c in changes if c["from"] == victim]
                if not moved:
                    problems.append(f"{run.name}: no owner change from {victim} recorded")
                elif not any("took this audit over" in a["message"] for a in view["alerts"]):
                    problems.append(f"{run.name}: the takeover is not named in its alerts")
                else:
                    at = datetime.fromisoformat(moved[0]["at"]).timestamp()
                    per_audit[run.name]["owner_changed_after_kill_s"] = round(at - killed_at, 1)
                continued = quiet_taken if run is quiet else (after[0] if after else None)
                if continued is None or continued > TAKEOVER_LIMIT:
                    problems.append(f"{run.name}: did not continue within {TAKEOVER_LIMIT:g} s")
        if per_audit.get("honest", {}).get("verdict") == "claim_refuted":
            problems.append("honest: the claim was refuted (false alarm)")
        if per_audit.get("buggy", {}).get("verdict") != "claim_refuted":
            problems.append("buggy: its alarm did not fire (its noise was 50 times too small)")
        results.update(
            victim=victim,
            killed_after_round={first.name: acked_before[first.name]},
            killed_at=datetime.fromtimestamp(killed_at).astimezone().isoformat(),
            quiet_background_takeover_s=round(quiet_taken, 1),
            audits=per_audit,
            lease_seconds=30,
        )
        print(json.dumps(results, indent=1))
        if args.results:
            Path(args.results).write_text(json.dumps(results, indent=1))
        if problems:
            raise Failed("; ".join(problems))
        gap = per_audit[first.name]["first_ack_after_kill_s"]
        say(
            f"PASSED: {victim} killed after round {acked_before[first.name]} of {first.name!r}; "
            f"it continued on {owner_of(store, first.audit_id) or 'another replica'} "
            f"{gap:.1f} s after the kill, the quiet audit was taken over after "
            f"{quiet_taken:.1f} s (lease 30 s); 0 acknowledged rounds lost of "
            f"{sum(len(r.acks) for r in runs)}; verdicts "
            + ", ".join(f"{n}: {a['verdict']}" for n, a in per_audit.items())
        )
        store.dispose()
        return 0
    except Failed as exc:
        say(f"FAILED: {exc}")
        for name, path in logs.items():
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-15:]
                print(f"--- {name} ({path}), last lines:\n" + "\n".join(tail), flush=True)
        return 1
    finally:
        for run in runs:
            run.paused.clear()
        for process in processes.values():
            if process.poll() is None:
                process.terminate()
        for process in processes.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()


if __name__ == "__main__":
    sys.exit(main())
