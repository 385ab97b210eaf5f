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

Seeded (issue #39, "no green by luck"): the service's canary seeds through the test-only
launcher (``tests/seeded_service.py``), each run's noise, cohorts (the nodes listed in the order
of their partitions: the SuperLink draws node ids at random), canary slots, initial model and
batches through the app's tests-only run-config key ``test-seed``; so the verdicts below are the
same every run. The weight factors are checked against the ones the planted partitions allow.
Left unseeded: the order in which replies arrive (Flower sums them in that order; float
rounding only).
"""

from __future__ import annotations

import itertools
import json
import math
import time

import pytest

from flaudit.auditor.claims.verdict import WEIGHTING_TOLERANCE
from tests.integration.byo_weighted import (
    CLIP,
    NUM_NODES,
    NUM_ROUNDS,
    PARTITION_EXAMPLES,
    Federation,
    blamed_on_noise,
)

pytestmark = pytest.mark.slow

#: The service's canary seeds (the short-noise audit gets CANARY_SEED, the correct one + 1)
CANARY_SEED = 0x39_5EED_B40_0000_0000_0000_0000_0001
#: Each run's test-seed (its noise, cohorts, canary slots, initial model, batches)
RUN_SEEDS = {"short noise": 3901, "correct noise": 3902}
CLIENTS_PER_ROUND = 2


def attainable_weight_factors(weights, per_round: int) -> list[float]:
    """Every round weight factor the wrapper can record (``CanaryAudit.canary_weight``): the
    heaviest weight seen so far ``m`` (some partition's), ``per_round`` replies of which some
    are distinct partitions no heavier than ``m`` and the rest canaries weighing ``m``:
    ``m * per_round / total``."""
    factors = set()
    for m in weights:
        lighter = [w for w in weights if w <= m]
        for reals in range(per_round + 1):
            for combo in itertools.combinations(lighter, reals):
                factors.add(m * per_round / (sum(combo) + (per_round - reals) * m))
    return sorted(factors)


@pytest.mark.timeout(1800)
def test_worked_example_catches_short_noise_and_spares_correct_noise(tmp_path):
    started = time.monotonic()
    with Federation(tmp_path, seed=CANARY_SEED) as fed:
        runs = [
            fed.start_run(
                "short noise",
                planted_bug="short-noise",
                noise_factor=0.25,
                seed=RUN_SEEDS["short noise"],
            ),
            fed.start_run("correct noise", seed=RUN_SEEDS["correct noise"]),
        ]
        audits = fed.wait(runs, timeout=1500)
        logs = {run["name"]: fed.run_log(run["run"]) for run in runs}
    elapsed = time.monotonic() - started
    (tmp_path / "audits.json").write_text(json.dumps(audits, indent=1))  # for a failure
    bug, good = (audits[run["audit"]] for run in runs)
    for run in runs:
        audit = audits[run["audit"]]
        print(
            f"{run['name']}: {audit['status']} {audit['verdict']['status']} / "
            f"{audit['verdict']['cause']}, ended {audit['end_latency_s']} s after its last "
            f"round; max weight factor {audit['max_weight_factor']}\n  "
            f"{audit['verdict']['summary']}"
        )
    print(f"design: {bug['verdict']['design']['summary']}\nboth runs took {elapsed:.0f} s")

    for run in runs:
        audit, log = audits[run["audit"]], logs[run["name"]]
        assert audit["status"] == "succeeded", (audit["reason"], log[-3000:])
        assert audit["rounds_received"] == NUM_ROUNDS
        spec = audit["spec"]  # the claim came from the app
        assert (spec["noise_multiplier"], spec["clip_norm"], spec["num_rounds"]) == (
            1.0,
            CLIP,
            NUM_ROUNDS,
        )
        assert spec["num_clients"] == NUM_NODES and spec["clients_per_round"] == 2
        # the design promises to catch noise x 0.5 (auto chose the canaries) ...
        design = audit["verdict"]["design"]
        assert design["testable"] and design["detectable_noise_scale"] >= 0.5, design
        assert design["summary"].startswith("Catches noise × "), design
        # ... and says so in the ServerApp's log before round 1
        lines = log.splitlines()
        said = [
            i
            for i, line in enumerate(lines)
            if "flaudit: audit design: " in line
            and "Catches noise × " in line
            and "Not testable" not in line
        ]
        first = [i for i, line in enumerate(lines) if "[ROUND 1/" in line]
        assert said and first and said[0] < first[0], log[-3000:]
        # unequal partitions (64, 96, 128): a round's factor is the run's heaviest weight so far
        # against the round's total; each one a factor those weights allow (at most
        # 2 x 128 / (64 + 96) = 1.6), the audit's maximum their largest, and above 1 by more than
        # the verdict's tolerance (so the weighting breaks the claim: the causes below)
        factors = [f for f in audit["round_weight_factors"] if f is not None]
        allowed = attainable_weight_factors(PARTITION_EXAMPLES, CLIENTS_PER_ROUND)
        assert len(factors) == NUM_ROUNDS, audit["round_weight_factors"]
        for factor in factors:
            assert any(math.isclose(factor, a, rel_tol=1e-9) for a in allowed), (factor, allowed)
        assert math.isclose(audit["max_weight_factor"], max(factors), rel_tol=1e-12), factors
        assert audit["max_weight_factor"] > 1 + WEIGHTING_TOLERANCE, factors
        # the audit ended promptly after the run's last report (issue #28: <= 3 minutes)
        assert audit["end_latency_s"] is not None and audit["end_latency_s"] <= 180

    # the planted bug: refuted, the noise named as falling short, the weighting too
    assert blamed_on_noise(bug), bug["verdict"]
    assert bug["verdict"]["cause"] == "noise_and_weighting", bug["verdict"]
    assert "the noise falls short" in bug["verdict"]["summary"], bug["verdict"]["summary"]
    # correct noise: refuted by the weighting alone, its noise consistent with the claim
    assert good["verdict"]["status"] == "claim_refuted", good["verdict"]
    assert good["verdict"]["cause"] == "weighting", good["verdict"]
    assert "The noise is consistent with the claim" in good["verdict"]["summary"], good["verdict"]
    assert "the noise falls short" not in good["verdict"]["summary"]
    for audit in (bug, good):  # the heaviest client's protection: the recorded factor x claim
        weighting = audit["verdict"]["weighting"]
        assert math.isclose(
            weighting["heaviest_mu"], audit["max_weight_factor"] * weighting["claim_mu"]
        ), weighting
    for text in fed.bodies:  # the run tokens reach no response
        for token in tmp_path.glob("*.token"):
            assert token.read_text().strip() not in text
