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


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_record_level_example_with_clipping_bypassed_exits_3_naming_clipping(capsys, fixed_seed):
    """no_clipping=4: the clients' DPOptimizer sums unclipped per-sample gradients and the
    canaries, sent through that same clip_and_accumulate at pre-clip norm 4 C, come out 4 C."""
    code = cli_main(["run", str(EXAMPLE), "--json", "--inject-bug", "no_clipping=4"])
    buggy = json.loads(capsys.readouterr().out)
    assert code == 3 and buggy["verdict"]["status"] == "claim_refuted", buggy["verdict"]
    assert buggy["cause"]["cause"] == "clipping", buggy["cause"]
    assert 3.0 < buggy["measured"]["sensitivity_ratio"] < 5.0, buggy["measured"]
    assert "Cause: clipping" in buggy["verdict"]["summary"]


def test_record_level_spec_errors_exit_2_before_training(tmp_path, capsys):
    data = json.loads(EXAMPLE.read_text())
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**data, "num_clients": 0}))
    assert cli_main(["run", str(path)]) == 2
    assert "num_clients" in capsys.readouterr().err
    path.write_text(json.dumps(data))
    assert cli_main(["run", str(path), "--inject-bug", "extra_participation=4"]) == 2
    assert "cannot be injected into a record-level audit" in capsys.readouterr().err
    assert cli_main(["run", str(path), "--junit", str(tmp_path / "j.xml")]) == 2
    assert "not available for record-level audits" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_record_level_evidence_is_recomputed_by_flaudit_verify(tmp_path, capsys, fixed_seed):
    """A small record-level run writes its evidence (seen set, per-look scores, revealed seed);
    `flaudit verify` recomputes design, claim, every look, the cause and the verdict, and
    catches a changed score and a seed that does not match its commitment."""
    data = json.loads(EXAMPLE.read_text())
    small = {
        **data,
        "task_options": {"hidden": 16},
        "num_clients": 2,
        "num_rounds": 2,
        "num_canaries": 400,
        "local_epochs": 1,
        "reveal_seed": True,
    }
    spec = tmp_path / "small.json"
    spec.write_text(json.dumps(small))
    bundle_path = tmp_path / "evidence.json"
    code = cli_main(["run", str(spec), "--inject-bug", "no_noise", "--evidence", str(bundle_path)])
    capsys.readouterr()
    assert code == 3
    bundle = json.loads(bundle_path.read_text())
    assert bundle["level"] == "record" and bundle["canary_seed"]["seed"] == "20261206"
    assert bundle["cause"]["cause"] == "noise"
    assert cli_main(["verify", str(bundle_path), "--allow-unsigned"]) == 0
    out = capsys.readouterr().out
    assert "ok          looks" in out and "ok          verdict" in out
    assert "ok          statistics.seen" in out

    # a score the test weighs (an included seen canary's), then a claimed signal
    for field in ("scores", "signals"):
        tampered = json.loads(json.dumps(bundle))
        first = tampered["statistics"]["looks"][0]
        j = next(j for j, lam in enumerate(first["signals"]) if lam > 0)
        first[field][j] = 0.5 * float(first[field][j])
        bundle_path.write_text(json.dumps(tampered))
        assert cli_main(["verify", str(bundle_path), "--allow-unsigned"]) == 3, field
        capsys.readouterr()
    tampered = json.loads(json.dumps(bundle))
    tampered["canary_seed"]["seed"] = "1"
    bundle_path.write_text(json.dumps(tampered))
    assert cli_main(["verify", str(bundle_path), "--allow-unsigned"]) == 5
