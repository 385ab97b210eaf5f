"""The worked bring-your-own example on a real federation (shared by
``tests/integration/test_byo_weighted_app.py`` and ``benchmarks/byo_weighted.py``): Flower's
advanced-pytorch, offline (``tests/integration/flower_weighted``), a SuperLink and 3 SuperNodes
on loopback (partitions of 64, 96 and 128 examples), a running ``flaudit serve``, audits
attached with ``flaudit attach`` (canaries ``auto``), runs submitted with ``flwr run``."""

from __future__ import annotations

import contextlib
import re
import shutil
import time
from datetime import datetime
from pathlib import Path

import httpx

from tests.integration import federation
from tests.integration.test_byo_flower_app import documented_blocks
from tests.processes import Processes

APP = Path(__file__).parent / "flower_weighted"
API_KEY = "byo-weighted-key-" + "k" * 12
NUM_NODES = 3
#: z = 1, 2 clients per round: 20 rounds is the fewest in which "auto" catches noise x 0.5
NUM_ROUNDS = 20
CLIP = 0.05
#: Training examples per partition (tests/integration/flower_weighted/pytorch_example/task.py)
PARTITION_EXAMPLES = (64, 96, 128)
ENDED = ("succeeded", "failed", "cancelled")


def copy_app(dest: Path) -> Path:
    """A copy of the worked example, checked to carry docs/flower.md's lines verbatim."""
    shutil.copytree(APP, dest, ignore=shutil.ignore_patterns("__pycache__", "outputs"))
    blocks = documented_blocks()
    server = (dest / "pytorch_example" / "server_app.py").read_text()
    pyproject = (dest / "pyproject.toml").read_text()
    for name, text in (
        ("server_app imports", server),
        ("server_app strategy", server),
        ("pyproject config", pyproject),
    ):
        assert "\n".join(blocks[name]) in text, f"the worked example lacks docs' {name!r} lines"
    return dest


class Federation:
    """A service, a SuperLink and ``NUM_NODES`` SuperNodes under ``root`` (stopped on exit).

    ``seed``: the service's audits get the canary seeds ``seed, seed + 1, ...`` in the order
    they are attached (the test-only launcher, ``tests/seeded_service.py``); None: drawn from
    the OS, as in production (the benchmark's rates)."""

    def __init__(self, root: Path, *, seed: int | None = None):
        self.root = root
        self.seed = seed
        self.env, self.link = federation.flower_home(root)
        self.app = copy_app(root / "app")
        self.bodies: list[str] = []

    def __enter__(self) -> Federation:
        self.service = federation.start_service(self.root, API_KEY, seed=self.seed)
        self.procs = Processes(self.root, cwd=self.root)
        try:
            federation.start_federation(self.procs, self.env, self.link, NUM_NODES)
            self.http = httpx.Client(base_url=self.service.url, timeout=30)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(Exception):
            self.procs.stop_all()
        self.service.stop()

    def start_run(
        self,
        name: str,
        *,
        planted_bug: str = "",
        noise_factor: float = 0.5,
        rounds: int = NUM_ROUNDS,
        seed: int = 0,
    ) -> dict:
        """``flaudit attach`` (canaries auto) and ``flwr run`` with the run config the README
        shows; returns ``{"audit": id, "run": Flower run id, "name": name}``. ``seed`` > 0: the
        run-config key ``test-seed`` (the app's noise, cohorts, canary slots, initial model and
        batches; tests only, ``pytorch_example/planted_bug.py``)."""
        slug = re.sub(r"\W", "-", name)
        token = self.root / f"{slug}.token"
        lines = federation.attach(self.service.url, self.env, API_KEY, name, token)
        config = self.root / f"{token.stem}.toml"
        values = {
            **lines,
            "noise-multiplier": 1.0,
            "clipping-norm": CLIP,
            "num-server-rounds": rounds,
            "fraction-evaluate": 0.0,
            "planted-bug": planted_bug,
            "planted-noise-factor": noise_factor,
            "test-seed": int(seed),
        }
        federation.write_run_config(config, values)
        run_id = federation.submit(self.app, config, self.env, self.root, timeout=120)
        return {"audit": lines["flaudit-audit-id"], "run": run_id, "name": name}

    def wait(
        self, runs: list[dict], *, timeout: float, start_timeout: float = 300
    ) -> dict[str, dict]:
        """Poll every run's audit until all have ended; returns ``{audit id: audit JSON}``,
        each with ``end_latency_s`` (``finished_at`` minus the last round's ``received_at``:
        how long the audit took to end after its run's last report). A run with no round
        after ``start_timeout`` seconds raises, with its ServerApp log (e.g. an app that
        failed to import)."""
        done: dict[str, dict] = {}
        begun = time.monotonic()
        deadline = begun + timeout
        while len(done) < len(runs):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"audits still running after {timeout:.0f} s: "
                    f"{[r['audit'] for r in runs if r['audit'] not in done]}"
                )
            for run in runs:
                if run["audit"] in done:
                    continue
                r = self.http.get(f"/audits/{run['audit']}")
                self.bodies.append(r.text)
                audit = r.json()
                if (
                    audit["status"] not in ENDED
                    and audit["progress"]["round"] == 0
                    and time.monotonic() - begun > start_timeout
                ):
                    raise TimeoutError(
                        f"run {run['run']} ({run['name']}) reported no round "
                        f"in {start_timeout:.0f} s:\n"
                        f"{self.run_log(run['run'])[-3000:]}"
                    )
                if audit["status"] in ENDED:
                    rounds = self.http.get(f"/audits/{run['audit']}/rounds").json()["items"]
                    last = max((_time(x["received_at"]) for x in rounds), default=None)
                    audit["end_latency_s"] = (
                        (_time(audit["finished_at"]) - last).total_seconds()
                        if last is not None and audit.get("finished_at")
                        else None
                    )
                    audit["rounds_received"] = len(rounds)
                    audit["round_weight_factors"] = [x["weight_factor"] for x in rounds]
                    done[run["audit"]] = audit
            time.sleep(2)
        return done

    def run_log(self, run_id: int) -> str:
        return federation.run_log(run_id, self.env, self.root)


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def blamed_on_noise(audit: dict) -> bool:
    """The verdict refutes the claim and names the noise as (one) cause."""
    verdict = audit.get("verdict") or {}
    return verdict.get("status") == "claim_refuted" and verdict.get("cause") in (
        "noise",
        "noise_and_weighting",
    )
