"""Through real Flower: `flaudit run` on a built-in task raises the DP alarm when the noise is
halved behind the claim's back (``--inject-bug noise_scale=0.5``), and stays silent on the
correct run (issue #10, "Through real Flower")."""

from __future__ import annotations

import json

import pytest

import flaudit.commands.run
import flaudit.server.simulation
from flaudit.auditor.canaries import seen_mask
from flaudit.commands.cli import main as cli_main

pytestmark = pytest.mark.slow

# z = 1, r = 1: the claim is mu = 1 (known rounds). Halving the noise makes the true mu = 2. With
# k = 400 canaries the known-rounds claim tests reject at p ~ 1e-4 (per-test level 0.0125 at the
# final look) and stay at p = 1 on the correct run (in-process runs with noise seeds 0-3).
# Uniform participation: the only claim is the known-rounds one (a Poisson claim would also be
# tested, and the canaries' fixed periods are not Poisson sampling).
SPEC = """
name = "bug-alarm"
task = "synthetic"
num_rounds = 2
num_clients = 250
clients_per_round = 6
participation = "uniform"
num_canaries = 400
canary_repeats = 1
noise_multiplier = 1.0
clip_norm = 1.0
delta = 1e-5
data_seed = 1

[task_options]
dim = 8000
test_size = 100
"""

# fixed secret-looking seeds (never printed) with a balanced split, and a fixed noise seed, so
# the test is deterministic
CANARY_SEED = 0x5EED_0BAD_CAFE_1234_5678_9ABC_DEF0


@pytest.fixture
def fixed_seeds(monkeypatch):
    assert 160 <= int(seen_mask(CANARY_SEED, 400).sum()) <= 240
    # where `flaudit run` draws it: commands/run.py holds its own name for new_master_seed, so
    # patching flaudit.auditor.canaries fixed nothing once another test had imported it (issue #39)
    drawn = []
    monkeypatch.setattr(
        flaudit.commands.run, "new_master_seed", lambda: drawn.append(CANARY_SEED) or CANARY_SEED
    )
    real = flaudit.server.simulation.run_simulation_audit

    def with_noise_seed(spec, **kwargs):  # the real Flower simulation, reproducible noise
        kwargs.setdefault("noise_seed", 11)
        kwargs["max_supernodes"] = 2
        return real(spec, **kwargs)

    monkeypatch.setattr(flaudit.server.simulation, "run_simulation_audit", with_noise_seed)
    return drawn


def _run(path, capsys, *extra, code):
    assert cli_main(["run", str(path), "--json", *extra]) == code  # 3 refuted, 0 consistent
    out, err = capsys.readouterr()
    assert str(CANARY_SEED) not in out + err
    return json.loads(out)


@pytest.mark.timeout(240)
def test_flaudit_run_alarms_on_halved_noise_and_not_on_the_correct_run(
    tmp_path, capsys, fixed_seeds
):
    path = tmp_path / "audit.toml"
    path.write_text(SPEC)

    buggy = _run(path, capsys, "--inject-bug", "noise_scale=0.5", code=3)
    assert buggy["bug_injected"].startswith("bug injected: noise_scale=0.5")
    assert buggy["verdict"]["status"] == "claim_refuted"
    errors = [a for a in buggy["alerts"] if a["level"] == "error"]
    assert (
        errors and "possible DP bug or wrong claim: the known-rounds claim" in errors[0]["message"]
    )
    assert "at most 5%" in buggy["alarm_guarantee"]
    # the claim stays honest: the analytic known-rounds epsilon is that of z = 1
    assert buggy["spec"]["noise_multiplier"] == 1.0

    correct = _run(path, capsys, code=0)
    assert correct["bug_injected"] is None
    assert correct["alarm"]["status"] == "ok" and correct["alarm"]["rejected"] == []
    assert not [a for a in correct["alerts"] if a["level"] in ("error", "warning")]
    assert correct["alarm_guarantee"] == buggy["alarm_guarantee"]
    assert fixed_seeds == [CANARY_SEED] * 2  # both runs had the fixed seed, not a drawn one
