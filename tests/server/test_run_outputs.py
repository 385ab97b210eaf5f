"""`flaudit run --junit FILE --evidence FILE` (issue #30): JUnit XML with one test case per claim
test (a refuted claim is exactly one failure, carrying the verdict sentence), and an unsigned
evidence bundle that `flaudit verify --allow-unsigned` recomputes."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from flaudit.auditor.claims.evidence import seed_commitment
from flaudit.commands.cli import main as cli_main
from tests.server.test_run_command import SPEC, STOP_SPEC

# a fixture, re-exported for pytest (`as` marks it used; the tests' parameters take its value)
from tests.server.test_run_command import in_process_simulation as in_process_simulation


def _cases(path):
    root = ET.parse(path).getroot()
    assert root.tag == "testsuite"
    cases = root.findall("testcase")
    assert int(root.get("tests")) == len(cases) >= 2
    return root, cases


def test_a_refuted_claim_is_one_failing_case_and_its_bundle_verifies(
    tmp_path, capsys, in_process_simulation
):
    spec = tmp_path / "audit.toml"
    spec.write_text(STOP_SPEC)
    junit, evidence = tmp_path / "audit.xml", tmp_path / "evidence.json"
    code = cli_main(
        [
            "run",
            str(spec),
            "--inject-bug",
            "no_noise",
            "--json",
            "--junit",
            str(junit),
            "--evidence",
            str(evidence),
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert code == 3 and data["verdict"]["status"] == "claim_refuted"
    root, cases = _cases(junit)
    failures = [c.find("failure") for c in cases if c.find("failure") is not None]
    assert len(failures) == 1 and root.get("failures") == "1"
    assert failures[0].get("message") == data["verdict"]["summary"]
    assert all(c.get("name") and c.get("classname") == "flaudit.cli-test" for c in cases)

    bundle = json.loads(evidence.read_text())
    assert bundle["verdict"] == data["verdict"] and "signature" not in bundle
    assert cli_main(["verify", str(evidence)]) == 4  # unsigned: refused unless allowed
    assert "not signed" in capsys.readouterr().err
    assert cli_main(["verify", str(evidence), "--allow-unsigned"]) == 0, capsys.readouterr()
    assert "verified" in capsys.readouterr().out
    bundle["estimates"][1]["epsilon"] = 123.0
    evidence.write_text(json.dumps(bundle))
    assert cli_main(["verify", str(evidence), "--allow-unsigned"]) == 3
    assert "mismatch: estimates[1].epsilon" in capsys.readouterr().err


def test_a_run_that_is_not_refuted_has_no_failing_case_and_reveals_its_seed_if_asked(
    tmp_path, capsys, in_process_simulation
):
    spec = tmp_path / "audit.toml"
    spec.write_text("reveal_seed = true\n" + SPEC)
    junit, evidence = tmp_path / "audit.xml", tmp_path / "evidence.json"
    assert cli_main(["run", str(spec), "--junit", str(junit), "--evidence", str(evidence)]) == 4
    out, err = capsys.readouterr()
    root, cases = _cases(junit)
    assert root.get("failures") == "0" and all(c.find("failure") is None for c in cases)
    bundle = json.loads(evidence.read_text())
    seed = in_process_simulation[-1]
    assert bundle["canary_seed"]["seed"] == str(seed) and str(seed) not in out + err
    commitment = bundle["canary_seed"]["commitment"]
    assert f"canary seed commitment: {commitment}" in err  # published before training
    assert seed_commitment(seed, bytes.fromhex(bundle["canary_seed"]["salt"])) == commitment
    assert cli_main(["verify", str(evidence), "--allow-unsigned"]) == 0
    assert "ok          statistics.seen" in capsys.readouterr().out
