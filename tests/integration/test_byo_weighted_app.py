"""The bring-your-own worked example, run as a new user would (issue #28, "Keep the
bring-your-own docs true"): Flower's advanced-pytorch, offline (tests/integration/flower_weighted,
see its README), weighted FedAvg over partitions of 64, 96 and 128 examples behind Flower's
``DifferentialPrivacyServerSideFixedClipping`` (z = 1, C = 0.05), with docs/flower.md's lines
verbatim, on a SuperLink with 3 SuperNodes on loopback (2 sampled per round, 20 rounds: the
fewest in which the audit, canaries ``auto``, promises to catch noise x 0.5), attached with
``flaudit attach`` to a running ``flaudit serve``.

Two runs side by side on one SuperLink: the planted bug (``planted-bug = "short-noise"``: the DP
wrapper adds a quarter of the noise it claims, issue #28's "noise 4x smaller") is refuted and
blamed on the noise ("the noise falls short"; with these weights the weighting breaks the claim
too, so the cause is ``noise_and_weighting``); the correct run is never blamed on the noise
(refuted by the weighting alone, as its heaviest client is protected at 1.33 mu). Both audits
end, promptly.

Why x 0.25 here and not x 0.5: the audit is sized to catch noise x 0.5 in 95% of runs, so a CI
test on one x 0.5 run would fail in about one CI run in twenty by design (it did once, on
2026-11-27: "refuted by the weighting, not the noise"). The rate at x 0.5 is measured over many
pairs by ``benchmarks/byo_weighted.py`` (docs/flower.md: 6 of 6 blamed on the noise); this test
checks the wiring and the attribution on a bug the design catches with near certainty.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.integration.byo_weighted import (
    CLIP, NUM_NODES, NUM_ROUNDS, Federation, blamed_on_noise)

pytestmark = pytest.mark.slow


@pytest.mark.timeout(1800)
def test_worked_example_catches_short_noise_and_spares_correct_noise(tmp_path):
    started = time.monotonic()
    with Federation(tmp_path) as fed:
        runs = [fed.start_run("short noise", planted_bug="short-noise", noise_factor=0.25),
                fed.start_run("correct noise")]
        audits = fed.wait(runs, timeout=1500)
        logs = {run["name"]: fed.run_log(run["run"]) for run in runs}
    elapsed = time.monotonic() - started
    (tmp_path / "audits.json").write_text(json.dumps(audits, indent=1))  # for a failure
    bug, good = (audits[run["audit"]] for run in runs)
    for run in runs:
        audit = audits[run["audit"]]
        print(f"{run['name']}: {audit['status']} {audit['verdict']['status']} / "
              f"{audit['verdict']['cause']}, ended {audit['end_latency_s']} s after its last "
              f"round; max weight factor {audit['max_weight_factor']}\n  "
              f"{audit['verdict']['summary']}")
    print(f"design: {bug['verdict']['design']['summary']}\nboth runs took {elapsed:.0f} s")

    for run in runs:
        audit, log = audits[run["audit"]], logs[run["name"]]
        assert audit["status"] == "succeeded", (audit["reason"], log[-3000:])
        assert audit["rounds_received"] == NUM_ROUNDS
        spec = audit["spec"]  # the claim came from the app
        assert (spec["noise_multiplier"], spec["clip_norm"], spec["num_rounds"]) == (
            1.0, CLIP, NUM_ROUNDS)
        assert spec["num_clients"] == NUM_NODES and spec["clients_per_round"] == 2
        # the design promises to catch noise x 0.5 (auto chose the canaries) ...
        design = audit["verdict"]["design"]
        assert design["testable"] and design["detectable_noise_scale"] >= 0.5, design
        assert design["summary"].startswith("Catches noise × "), design
        # ... and says so in the ServerApp's log before round 1
        lines = log.splitlines()
        said = [i for i, line in enumerate(lines) if "flaudit: audit design: " in line
                and "Catches noise × " in line and "Not testable" not in line]
        first = [i for i, line in enumerate(lines) if "[ROUND 1/" in line]
        assert said and first and said[0] < first[0], log[-3000:]
        # unequal partitions (64, 96, 128): a round's factor is the run's heaviest weight so far
        # against the round's total, 2 x 128 / (64 + 96) = 1.6 at most (a client of 128 could
        # have been sampled), 1.33 for a round the heaviest node trains in; never 1
        assert 1.3 <= audit["max_weight_factor"] <= 1.6 + 1e-9, audit["max_weight_factor"]
        # the audit ended promptly after the run's last report (issue #28: <= 3 minutes)
        assert audit["end_latency_s"] is not None and audit["end_latency_s"] <= 180

    # the planted bug: refuted, the noise named as falling short
    assert blamed_on_noise(bug), bug["verdict"]
    assert "the noise falls short" in bug["verdict"]["summary"], bug["verdict"]["summary"]
    # correct noise: never blamed on the noise (the weighting alone may refute the claim)
    assert not blamed_on_noise(good), good["verdict"]
    assert good["verdict"]["cause"] in (None, "weighting"), good["verdict"]
    assert "the noise falls short" not in good["verdict"]["summary"]
    for text in fed.bodies:  # the run tokens reach no response
        for token in tmp_path.glob("*.token"):
            assert token.read_text().strip() not in text
