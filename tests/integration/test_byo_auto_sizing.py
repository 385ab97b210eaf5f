"""The audit sizes itself on a real Flower federation (issue #28, "Done when"): Flower's
quickstart app with the documented lines, 3 SuperNodes on loopback, 2 sampled per round, 10
rounds, z = 1, attached with `flaudit attach` and no `--canaries` (the default, "auto"): no
refusal, the design line in the ServerApp log before round 1, and an honest verdict (the
federation holds 20 canaries, fewer than z = 1 needs: inconclusive, advising rounds or sampled
clients, never more canaries than fit). A second run asks for 100 canaries in 5 rounds: its
audit fails at once with the reason, and the ServerApp log says so in one line.

Seeded (issue #39): the service's canary seeds (the test-only launcher, tests/seeded_service.py)
and the app's noise, cohorts and canary slots (lines this test adds to its copy of the app), so
the verdict is one outcome: a correct run ends refuted by chance in a few percent of runs, which
benchmarks measure, not this test."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.integration import federation
from tests.integration.test_byo_flower_app import API_KEY, CLIP, make_app
from tests.processes import Processes, wait_for, wait_for_audit

pytestmark = pytest.mark.slow

CANARY_SEED = 0x39_A070_5EED_0000_0000_0000_0000_0001
APP_SEED = 39
#: Tests only: the app's random draws (Flower's cohort: ``random``; its DP noise: NumPy's
#: global generator; the canaries' cohort slots: the wrapper's own generator) from APP_SEED
SEEDING = (
    f"    random.seed({APP_SEED}); np.random.seed({APP_SEED}); torch.manual_seed({APP_SEED})\n"
    f"    strategy.audit._slot_rng = np.random.default_rng({APP_SEED})\n"
)


def _seed_app(app) -> None:
    server = app / "pytorchexample" / "server_app.py"
    text = server.read_text()
    anchor = (
        "    strategy = CanaryAuditStrategy.from_env(strategy, run_config=context.run_config)\n"
    )
    assert text.count(anchor) == 1 and text.startswith('"""')
    text = text.replace(anchor, anchor + SEEDING)
    head, rest = text.split("\n\n", 1)  # the module docstring, then the imports
    server.write_text(f"{head}\n\nimport random\n\nimport numpy as np\n{rest}")


@pytest.mark.timeout(900)
def test_auto_sizes_a_three_node_federation_and_an_impossible_request_fails_at_once(tmp_path):
    env, marker = federation.flower_home(tmp_path)
    service = federation.start_service(tmp_path, API_KEY, seed=CANARY_SEED)
    procs = Processes(tmp_path, cwd=tmp_path)
    started = time.monotonic()
    try:
        federation.start_federation(procs, env, marker, 3)
        http = httpx.Client(base_url=service.url, timeout=30)
        app = tmp_path / "app"
        make_app(app, extra_client_metric=False)
        _seed_app(app)
        runs = {}
        for name, rounds, extra in (("auto", 10, ()), ("too many", 5, ("--canaries", "100"))):
            token = tmp_path / f"{name}.token"
            lines = federation.attach(service.url, env, API_KEY, name, token, *extra)
            config = federation.write_run_config(
                tmp_path / f"{name}.toml",
                {
                    "noise-multiplier": 1.0,
                    "clipping-norm": CLIP,
                    "num-sampled-clients": 2,
                    "num-server-rounds": rounds,
                    "fraction-evaluate": 0.0,
                    **lines,
                },
            )
            runs[name] = (lines["flaudit-audit-id"], federation.submit(app, config, env, tmp_path))

        refused_id, refused_run = runs["too many"]
        refused = wait_for(
            lambda: (a := http.get(f"/audits/{refused_id}").json())["status"] != "running" and a,
            timeout=300,
            interval=1,
            what="the impossible audit to end",
        )
        audit_id, run_id = runs["auto"]
        audit = wait_for_audit(http, audit_id, timeout=600, bodies=[], what="the auto-sized audit")
        auto_log = federation.run_log(run_id, env, tmp_path)
        refused_log = federation.run_log(refused_run, env, tmp_path)
    finally:
        procs.stop_all()
        service.stop()
    print(f"auto-sized run and refused run took {time.monotonic() - started:.1f} s")

    assert refused["status"] == "failed" and "at most 10 canaries" in refused["reason"]
    assert refused["reason"].startswith("refused before round 1: ")
    assert "Running" not in refused["verdict"]["summary"]
    errors = [
        line
        for line in refused_log.splitlines()
        if "flaudit: the audit service refused this run's claim" in line
    ]
    assert len(errors) == 1 and "at most 10 canaries" in errors[0], refused_log[-3000:]

    assert audit["status"] == "succeeded", audit["reason"]
    assert audit["spec"]["num_canaries"] == 20 and audit["spec"]["clients_per_round"] == 2
    design = [
        i
        for i, line in enumerate(auto_log.splitlines())
        if "flaudit: audit design: 20 canaries" in line
    ]
    first_round = [i for i, line in enumerate(auto_log.splitlines()) if "[ROUND 1/" in line]
    assert design and first_round and design[0] < first_round[0], auto_log[-3000:]
    verdict = audit["verdict"]
    print(
        f"design line: {auto_log.splitlines()[design[0]]}\nverdict: {verdict['summary']}\n"
        f"refused: {errors[0]}"
    )
    # 20 canaries cannot test z = 1 in 10 rounds: inconclusive, advising rounds, not canaries
    assert verdict["status"] == "inconclusive" and verdict["cause"] is None, verdict
    assert verdict["summary"].startswith("Inconclusive: this audit cannot refute its claim"), (
        verdict
    )
    assert "train 20 rounds" in verdict["summary"] and "use at least" not in verdict["summary"]
