"""The record-level claim tests, alarm and cause (auditor/claims/record_alarm.py, issue #37)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from benchmarks.fidelity._common import binomial_limit
from benchmarks.fidelity.record_level import EngineSetting, alarm_looks
from flaudit.auditor.claims.record_alarm import (
    RECORD_ALPHA,
    decide_record_alarm,
    record_cause,
    record_claim,
    record_design,
    record_look_level,
    record_signals,
)
from flaudit.auditor.record_spec import RecordLevelSpec, is_record_level

#: A small engine-shaped audit: 3 clients, 3 rounds of 10 steps, 4 looks.
SMALL = EngineSetting(dim=300, canaries=120, clients=3, rounds=3, steps=10, sample_rate=0.1)


def test_look_levels_sum_to_alpha_with_most_at_the_end():
    for looks in (1, 2, 4, 11):
        levels = [record_look_level(i, looks) for i in range(1, looks + 1)]
        assert math.isclose(sum(levels), RECORD_ALPHA)
        assert levels[-1] == max(levels)
    with pytest.raises(ValueError):
        record_look_level(5, 4)


def test_the_alarm_fires_on_half_the_noise_and_names_the_noise_bound():
    rng = np.random.default_rng(0)
    for momentum in (0.0, 0.9):
        setting = replace(SMALL, momentum=momentum)
        final = alarm_looks(rng, setting, noise_scale=0.5)[-1]
        assert final.status == "error"
        (test,) = final.rejected
        assert test["test"] == "record_exact" and test["p_value"] <= test["level"]
        # the upper bound on the noise multiplier the steps carried is below the claimed z = 1
        assert 0 < test["noise_multiplier_hi"] < 1.0


def test_signals_are_the_step_weights_over_the_claimed_noise():
    # canary 0 (client 0) in steps of weight 1 and 3; client 0: sum ||w||^2 = 16; z = 2
    lam = record_signals([4.0, 0.0, 1.0], [16.0, 0.0], [0, 1, 0], noise_multiplier=2.0)
    np.testing.assert_allclose(lam, [4.0 / (2 * 4), 0.0, 1.0 / (2 * 4)])


def test_the_alarm_refuses_inconsistent_inputs_and_skips_what_has_no_signal():
    seen = np.array([True, False, True, False])
    owners = np.array([0, 1, 0, 1])
    args = dict(
        owners=owners,
        dim=100,
        noise_multiplier=1.0,
        sample_rate=0.1,
        steps=10,
        look=1,
        num_looks=2,
        delta=1e-5,
    )
    cos = np.array([0.1, np.nan, 0.05, np.nan])  # client 1 not trained yet
    ok = decide_record_alarm(cos, seen, signals=[0.5, 0, 0.2, 0], **args)
    assert ok.status == "ok" and "2 included canaries" in ok.tests[0]["method"]
    none = decide_record_alarm(cos, seen, signals=np.zeros(4), **args)
    assert none.tests[0]["p_value"] == 1.0 and none.status == "ok"
    with pytest.raises(ValueError, match="0 for every unseen canary"):
        decide_record_alarm(cos, seen, signals=[0.5, 0.1, 0.2, 0], **args)
    with pytest.raises(ValueError, match="no score"):
        decide_record_alarm(np.full(4, np.nan), seen, signals=[0.5, 0, 0.2, 0], **args)
    off = decide_record_alarm(cos, seen, signals=np.zeros(4), **{**args, "noise_multiplier": 0})
    assert off.status == "no_dp_claim"


#: 1400 correct runs, alarm at any look: a correct 5% alarm fails the limit with probability
#: 9.7e-4, one whose true rate over the looks is 8% with probability 0.94 (binomial_limit;
#: docs/fidelity.md sections 11 and 12).
LOOK_RUNS = 1400


def test_false_alarm_rate_over_every_look_on_the_claim():
    check = binomial_limit(LOOK_RUNS, RECORD_ALPHA, false_fail=1e-3, against=0.08)
    assert check.false_fail <= 1e-3 and check.power >= 0.9
    rng = np.random.default_rng(37)
    alarms = 0
    for run in range(LOOK_RUNS):
        # plain SGD and momentum in turn: the shipped decide_record_alarm at every look
        setting = replace(SMALL, momentum=0.0 if run % 2 else 0.9)
        looks = alarm_looks(rng, setting)
        assert len(looks) == SMALL.rounds + 1
        alarms += any(look.status == "error" for look in looks)
    assert check.passes(alarms), f"{alarms} of {LOOK_RUNS} correct runs alarmed ({check})"


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
    hopeless = record_design(
        num_canaries=2,
        noise_multiplier=1.0,
        sample_rate=1e-4,
        steps=1,
        delta=1e-5,
        num_looks=4,
        runs=10,
    )
    assert not hopeless["refutable"] and "cannot tell" in hopeless["summary"]


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
