"""The alarm: alpha-spending over looks, union over tests, levels, no-DP-claim, and the
false-alarm rate of a correct mechanism over every look by Monte Carlo."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flaudit.auditor.estimators import summarize
from flaudit.auditor.estimators.alarm import alarm_guarantee, decide_alarm, look_level
from flaudit.auditor.estimators.gdp import GaussianDPClaim, NoDPClaim, audit_claims, claim_test
from flaudit.auditor.spec import AuditSpec


def test_levels_sum_to_alpha():
    for looks in (1, 2, 21):
        total = sum(look_level(t, looks, alpha=0.05) for t in range(1, looks + 1))
        assert total == pytest.approx(0.05)
    assert look_level(21, 21) == pytest.approx(0.025)
    with pytest.raises(ValueError, match="look"):
        look_level(22, 21)


def _test(p, threat_model="known_rounds"):
    return {"p_value": p, "claim": {"kind": "gaussian_dp", "threat_model": threat_model}}


def test_error_warning_ok_and_union_over_tests():
    level = look_level(3, 11) / 2
    both = dict(look=3, num_looks=11, poisson_warning=True)
    assert decide_alarm([_test(level * 0.9), _test(1.0, "poisson_subsampled")], **both).status == "error"
    assert decide_alarm([_test(1.0), _test(level * 0.9, "poisson_subsampled")], **both).status == "warning"
    # just above the per-test level: nothing fires (the level is split over the two tests)
    ok = decide_alarm([_test(level * 1.1), _test(1.0, "poisson_subsampled")], **both)
    assert ok.status == "ok" and ok.level_per_test == pytest.approx(level)


def test_poisson_claim_is_reported_not_alarming_by_default():
    """Canaries in fixed periods are not Poisson clients: by default only the known-rounds
    claim alarms, and it gets the whole look's level."""
    level = look_level(3, 11)
    tests = [_test(level * 0.9), _test(0.0, "poisson_subsampled")]
    decision = decide_alarm(tests, look=3, num_looks=11)
    assert decision.status == "error" and decision.level_per_test == pytest.approx(level)
    assert [t["claim"]["threat_model"] for t in decision.rejected] == ["known_rounds"]
    assert decide_alarm([_test(1.0), _test(0.0, "poisson_subsampled")], look=3,
                        num_looks=11).status == "ok"


def test_no_dp_claim():
    spec = AuditSpec(noise_multiplier=0.0, num_canaries=20)
    claims = audit_claims(spec)
    tests = [claim_test(np.ones(5), np.zeros(5), claim=c) for c in claims]
    decision = decide_alarm(tests, look=1, num_looks=21, claims=claims)
    assert decision.status == "no_dp_claim" and "No DP claim" in decision.guarantee
    assert decide_alarm(tests, look=1, num_looks=21).status == "no_dp_claim"


def test_guarantee_sentence_names_claim_looks_and_level():
    spec = AuditSpec(noise_multiplier=1.0, canary_repeats=4, num_canaries=20, num_rounds=20)
    text = alarm_guarantee(audit_claims(spec), num_looks=21)
    assert "2-Gaussian DP" in text and "21 looks" in text and "5%" in text
    assert "error alarm" in text and "Poisson" not in text
    assert "Poisson-subsampled" in alarm_guarantee(audit_claims(spec), num_looks=21,
                                                   poisson_warning=True)


def test_false_alarm_rate_over_every_look_on_the_claim():
    """Known-rounds scores exactly on a mu = 1 claim, growing round by round; count runs where
    any of the 11 looks alarms. Must be <= 5% (with Monte Carlo margin)."""
    rng = np.random.default_rng(0)
    claim = GaussianDPClaim(1.0)
    k, looks, runs = 200, 11, 100
    alarms = 0
    for _ in range(runs):
        seen = rng.random(k) < 0.5
        fired = False
        for look in range(1, looks + 1):
            n = max(20, k * look // looks)  # more canaries scored at later looks
            sub = np.arange(n)
            scores = rng.normal(0, 1, k) + seen * claim.mu
            s, u = scores[sub][seen[sub]], scores[sub][~seen[sub]]
            decision = decide_alarm([claim_test(s, u, claim=claim)], look=look, num_looks=looks)
            fired |= decision.status != "ok"
        alarms += fired
    assert alarms <= 9


def test_summarize_reports_gdp_bounds_and_claim_tests():
    rng = np.random.default_rng(1)
    k, d = 400, 5000
    seen = rng.random(k) < 0.5
    final = rng.normal(0, 1 / math.sqrt(d), k) + seen * 3 / math.sqrt(d)
    known = rng.normal(0, 1, k) + seen * 2.0
    known[:5] = np.nan  # not yet scored
    spec = AuditSpec(noise_multiplier=1.0, num_canaries=20)
    claims = audit_claims(spec)
    summary = summarize(seen=seen, dim=d, delta=1e-5, final_cosines=final, max_cosines=final,
                        known_rounds_scores=known, claims=claims, one_run=True)
    kinds = {(e.threat_model, e.estimator.value) for e in summary.estimates}
    assert {("final_model", "gdp_lower_bound"), ("all_iterates", "gdp_lower_bound"),
            ("known_rounds", "gdp_lower_bound"), ("final_model", "fdp_one_run")} <= kinds
    tests = {(t.threat_model, t.claim.threat_model) for t in summary.claim_tests}
    assert ("known_rounds", "known_rounds") in tests and ("final_model", "poisson_subsampled") in tests
    known_test = next(t for t in summary.claim_tests if t.threat_model == "known_rounds")
    assert known_test.p_value < 1e-6  # mu 2 against a mu 1 claim, 400 canaries
    assert decide_alarm(summary.claim_tests, look=21, num_looks=21, claims=claims).status == "error"
    assert "claim_tests" in summary.to_dict()
    with pytest.raises(ValueError, match="known_rounds_scores"):
        summarize(seen=seen, dim=d, delta=1e-5, known_rounds_scores=known[:3])
    no_claim = summarize(seen=seen, dim=d, delta=1e-5, known_rounds_scores=known,
                         claims=[NoDPClaim()])
    assert all(t.p_value == 1.0 for t in no_claim.claim_tests)
