"""The record-level claim tests, alarm and cause (auditor/claims/record_alarm.py, issue #37)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flaudit.auditor.claims.record_alarm import (
    RECORD_ALPHA,
    decide_record_alarm,
    record_cause,
    record_claim,
    record_design,
    record_look_level,
)
from flaudit.auditor.record_spec import RecordLevelSpec, is_record_level


def _scores(rng, seen, z_true, q, steps):
    counts = rng.binomial(steps, q, size=seen.size) * seen
    return counts / (z_true * math.sqrt(steps)) + rng.standard_normal(seen.size)


def test_look_levels_sum_to_alpha_with_most_at_the_end():
    for looks in (1, 2, 4, 11):
        levels = [record_look_level(i, looks) for i in range(1, looks + 1)]
        assert math.isclose(sum(levels), RECORD_ALPHA)
        assert levels[-1] == max(levels)
    with pytest.raises(ValueError):
        record_look_level(5, 4)


def test_the_alarm_fires_on_half_the_noise_and_not_on_the_claimed_noise():
    rng = np.random.default_rng(0)
    seen = rng.random(3000) < 0.5
    q, steps = 1 / 18, 108
    args = dict(noise_multiplier=1.0, sample_rate=q, steps=steps, look=4, num_looks=4, delta=1e-5)
    bug = decide_record_alarm(_scores(rng, seen, 0.5, q, steps), seen, **args)
    assert bug.status == "error" and bug.rejected[0]["p_value"] <= bug.rejected[0]["level"]
    correct = decide_record_alarm(_scores(rng, seen, 1.0, q, steps), seen, **args)
    assert correct.status == "ok", correct.tests
    # NaN scores (clients not trained yet) are left out, no claim means no alarm
    scores = np.full(seen.size, np.nan)
    assert decide_record_alarm(scores, seen, **args).tests[0]["p_value"] == 1.0
    assert decide_record_alarm(scores, seen, **{**args, "noise_multiplier": 0}).status == (
        "no_dp_claim"
    )


def test_the_claim_is_the_composed_poisson_subsampled_gaussian():
    from flaudit.auditor.estimators.record_level import record_level_epsilon

    claim = record_claim(1.0, 1 / 18, 108)
    pld = [e for e in record_level_epsilon(1.0, 1 / 18, 36, 1e-5, rounds_trained=3)]
    pld = next(e.epsilon for e in pld if e.details["accountant"] == "pld")
    assert claim.epsilon(1e-5) == pytest.approx(pld, rel=0.05)
    assert not record_claim(0.0, 0.5, 10).is_claim


def test_the_cause_names_noise_clipping_or_sampling():
    rng = np.random.default_rng(1)
    seen = rng.random(4000) < 0.5
    q = 0.1

    def units(noise, shift):
        n = rng.standard_normal(seen.size) * noise
        counts = rng.binomial(100, q, size=seen.size) * seen
        # noise units: projection over (lr/B) C sqrt(T); shift units: over (lr/B) C q T
        projection = shift * counts + n * math.sqrt(100)
        return projection / math.sqrt(100), projection / (q * 100)

    assert record_cause(*units(0.5, 1.0), seen, noise_multiplier=1.0).cause == "noise"
    assert record_cause(*units(1.0, 4.0), seen, noise_multiplier=1.0).cause == "clipping"
    honest = record_cause(*units(1.0, 1.0), seen, noise_multiplier=1.0)
    assert honest.cause == "sampling"
    assert honest.noise_ratio == pytest.approx(1.0, abs=0.05)
    assert honest.sensitivity_ratio == pytest.approx(1.0, abs=0.1)


def test_the_design_says_whether_the_claim_can_be_refuted():
    def design(k, runs):
        return record_design(
            num_canaries=k,
            noise_multiplier=1.0,
            sample_rate=1 / 18,
            steps=108,
            delta=1e-5,
            num_looks=4,
            runs=runs,
        )

    good = design(3400, 10)
    assert good["refutable"] and good["power"] >= 0.8
    hopeless = design(4, 2)
    assert not hopeless["refutable"] and "cannot refute" in hopeless["summary"]


def test_record_level_spec_is_chosen_by_its_level_and_refuses_other_bugs():
    assert is_record_level({"level": "record"}) and not is_record_level({"task": "digits"})
    spec = RecordLevelSpec.model_validate(
        {"level": "record", "inject_bug": {"kind": "no_clipping"}}
    )
    assert spec.inject_bug.factor == 4.0 and spec.cohort_size == spec.num_clients
    with pytest.raises(ValueError, match="cannot be injected"):
        RecordLevelSpec.model_validate(
            {
                "level": "record",
                "inject_bug": {"kind": "no_noise"} | {"kind": "extra_participation", "factor": 4},
            }
        )
    with pytest.raises(ValueError, match="clients_per_round"):
        RecordLevelSpec.model_validate(
            {"level": "record", "num_clients": 2, "clients_per_round": 3}
        )
    with pytest.raises(ValueError):
        RecordLevelSpec.model_validate({"level": "record", "unknown": 1})
