"""``flaudit run examples/record-level-audit.json`` (issue #37): the built-in record-level engine
(clients train with the real Opacus PrivacyEngine plus record canaries) exits 0 on the correct run
and 3 with ``--inject-bug noise_scale=0.5``, naming the noise as the cause. The canary seed is
fixed (``new_master_seed`` replaced by a constant) so the outcome is reproducible; training draws
from the spec's public ``data_seed``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import flaudit.commands.record_run
from flaudit.commands.cli import main as cli_main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "record-level-audit.json"


@pytest.fixture
def fixed_seed(monkeypatch):
    monkeypatch.setattr(flaudit.commands.record_run, "new_master_seed", lambda: 20261206)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_record_level_example_exits_0_correct_and_3_with_half_the_noise(capsys, fixed_seed):
    code = cli_main(["run", str(EXAMPLE), "--json", "--inject-bug", "noise_scale=0.5"])
    buggy = json.loads(capsys.readouterr().out)
    assert code == 3 and buggy["verdict"]["status"] == "claim_refuted", buggy["verdict"]
    assert buggy["cause"]["cause"] == "noise", buggy["cause"]
    assert 0.4 < buggy["measured"]["noise_ratio"] < 0.7  # half the noise, gradients add a bit
    assert "Cause: noise" in buggy["verdict"]["summary"]

    code = cli_main(["run", str(EXAMPLE), "--json"])
    correct = json.loads(capsys.readouterr().out)
    assert code == 0 and correct["verdict"]["status"] == "consistent", correct["verdict"]
    assert all(look["status"] == "ok" for look in correct["looks"])
    assert 0.9 < correct["measured"]["noise_ratio"] < 1.2
    assert 0.8 < correct["measured"]["sensitivity_ratio"] < 1.2
    # the claim: dp-accounting's accountants and Opacus's over all 3 rounds' steps
    accountants = {
        row["details"]["accountant"] if "details" in row else row["accountant"]
        for row in correct["claim"]
    }
    assert accountants == {"rdp", "pld", "opacus_rdp"}
    assert correct["run"]["steps_per_round"] * 3 == correct["looks"][-1]["steps"]


def test_record_level_spec_errors_exit_2_before_training(tmp_path, capsys):
    data = json.loads(EXAMPLE.read_text())
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**data, "num_clients": 0}))
    assert cli_main(["run", str(path)]) == 2
    assert "num_clients" in capsys.readouterr().err
    path.write_text(json.dumps(data))
    assert cli_main(["run", str(path), "--inject-bug", "extra_participation=4"]) == 2
    assert "cannot be injected into a record-level audit" in capsys.readouterr().err
    assert cli_main(["run", str(path), "--evidence", str(tmp_path / "e.json")]) == 2
    assert "not available for record-level audits" in capsys.readouterr().err
