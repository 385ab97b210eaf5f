"""`flaudit run --junit FILE --evidence FILE` (issue #30): JUnit XML with one test case per claim
test (a refuted claim is exactly one failure, carrying the verdict sentence), and an unsigned
evidence bundle that `flaudit verify --allow-unsigned` recomputes."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from flaudit.auditor.claims.evidence import cosine_summaries, seed_commitment
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
    out = capsys.readouterr().out
    assert "verified" in out
    # the alarm fired during training: its look's statistics are in the bundle and its p-value
    # is recomputed from them, not taken as recorded (issue #40)
    at_look = bundle["statistics"]["alarm_statistics"]
    assert at_look is not None and at_look["round"] == bundle["alarm"]["round"] >= 1
    assert len(at_look["max_cosines"]) == len(bundle["statistics"]["max_cosines"])
    assert f"fired at round {at_look['round']}: recomputed from that look's statistics" in out
    assert "taken as recorded" not in out
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


def _resign(bundle: dict) -> dict:
    """``bundle`` signed with a key of one's own (what an attacker who edited it can do)."""
    import base64

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from flaudit.auditor.claims.evidence import CANONICALIZATION, canonical_json, digest

    bundle = {key: value for key, value in bundle.items() if key != "signature"}
    key = Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    bundle["signature"] = {
        "algorithm": "Ed25519",
        "key_id": "attacker",
        "public_key": base64.b64encode(public).decode("ascii"),
        "canonicalization": CANONICALIZATION,
        "digest": digest(bundle),
        "value": base64.b64encode(key.sign(canonical_json(bundle))).decode("ascii"),
    }
    return bundle


def test_an_edited_cosine_is_caught_by_recomputation_under_a_signature_of_ones_own(
    tmp_path, capsys, in_process_simulation
):
    """Issue #40: every per-canary statistic in a bundle is recomputed from, so one edited
    number fails `flaudit verify` even when the bundle is signed again after the edit (the
    signature then only shows who signed, not that the service did)."""
    spec = tmp_path / "audit.toml"
    spec.write_text(STOP_SPEC)
    evidence = tmp_path / "evidence.json"
    code = cli_main(
        ["run", str(spec), "--inject-bug", "no_noise", "--json", "--evidence", str(evidence)]
    )
    assert code == 3, capsys.readouterr()
    capsys.readouterr()
    original = json.loads(evidence.read_text())
    resigned = tmp_path / "resigned.json"
    resigned.write_text(json.dumps(_resign(original)))
    assert cli_main(["verify", str(resigned)]) == 0, capsys.readouterr()  # signed by its own key
    assert "signed by key attacker" in capsys.readouterr().out
    stats = original["statistics"]
    assert set(stats["cosine_summaries"]) == {"max_cosines", "final_cosines", "final_model_cosines"}
    seen = [j for j, s in enumerate(stats["seen"]) if s]
    j = seen[0]
    edits = {
        # no estimate reads the final model's own cosines: their summary is recomputed
        "final_model_cosines": "statistics.cosine_summaries.final_model_cosines.seen.",
        # the final-model tests read these: the estimates recomputed from them differ first
        "final_cosines": "estimates",
    }
    for name, named in edits.items():
        bundle = json.loads(json.dumps(original))
        bundle["statistics"][name][j] = float(bundle["statistics"][name][j]) - 0.25
        resigned.write_text(json.dumps(_resign(bundle)))
        assert cli_main(["verify", str(resigned)]) == 3, name
        err = capsys.readouterr().err
        assert f"mismatch: {named}" in err, err
    # the look the alarm fired at (round 1: the known-rounds test refuted the claim there):
    # its statistic made ten times weaker, the recomputed look raises no alarm
    bundle = json.loads(json.dumps(original))
    assert bundle["alarm"]["refuted_by"]["test"] == "known_rounds_normal_scores"
    at_look = bundle["statistics"]["alarm_statistics"]["known_rounds"]
    at_look["round_sums"] = [float(v) / 10 for v in at_look["round_sums"]]
    resigned.write_text(json.dumps(_resign(bundle)))
    assert cli_main(["verify", str(resigned)]) == 3
    err = capsys.readouterr().err
    assert err.startswith("flaudit verify: mismatch: alarm: recorded {") and err.rstrip().endswith(
        "recomputed None"
    ), err
    # and a last-round cosine above its maximum over rounds cannot be
    bundle = json.loads(json.dumps(original))
    bundle["statistics"]["last_cosines"] = [
        float(m) + (0.1 if i == j else 0.0) for i, m in enumerate(stats["max_cosines"])
    ]
    bundle["statistics"]["cosine_summaries"] = cosine_summaries(bundle["statistics"])
    resigned.write_text(json.dumps(_resign(bundle)))
    assert cli_main(["verify", str(resigned)]) == 3
    err = capsys.readouterr().err
    assert f"mismatch: statistics.last_cosines[{j}] (at most statistics.max_cosines[{j}])" in err
