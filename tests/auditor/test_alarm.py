"""The DP alarm (flaudit.auditor.claims.alarm): levels, decisions, and its false-alarm guarantee
over every look on scores that sit exactly on the claim."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.fidelity._common import binomial_limit
from benchmarks.fidelity.alarm_power import (
    new_alarm_first_look,
    normal_score_claim_test,
    simulate_scores,
)
from flaudit.auditor.claims import (
    AlarmTest,
    AuditLook,
    GaussianDPClaim,
    NoDPClaim,
    ValidityTier,
    alarm_guarantee,
    audit_claims,
    decide_alarm,
    look_level,
    summarize,
)
from flaudit.auditor.claims.fdp import fdp_claim_test
from flaudit.auditor.spec import AuditSpec


def test_levels_sum_to_alpha_over_every_look_and_test():
    for looks in (1, 2, 11, 21):
        total = sum(
            look_level(test, t, looks, alpha=0.05)
            for test in AlarmTest
            for t in range(1, looks + 1)
        )
        assert math.isclose(total, 0.05, rel_tol=1e-12)
    # the known-rounds test is the only one spending at the per-round looks
    assert look_level(AlarmTest.known_rounds_normal_scores, 1, 11) > 0
    assert look_level(AlarmTest.final_model_normal_scores, 1, 11) == 0
    with pytest.raises(ValueError, match="look"):
        look_level(AlarmTest.known_rounds_normal_scores, 12, 11)


def _summary(seen, known, counts, d=5000, final=None, claims=None):
    spec = AuditSpec(noise_multiplier=1.0, num_canaries=seen.size, num_clients=10 * seen.size)
    claims = audit_claims(spec) if claims is None else claims
    return summarize(
        AuditLook(
            seen=seen,
            dim=d,
            delta=1e-5,
            known_rounds_scores=known,
            known_rounds_participations=counts,
            final_cosines=final,
            threat_models=["final_model"] if final is not None else [],
            claims=claims,
        )
    ), claims


def test_decision_names_the_refuting_test_tier_and_bound():
    rng = np.random.default_rng(0)
    k = 400
    seen = rng.random(k) < 0.5
    known = rng.normal(0, 1, k) + seen * 2.0  # mu 2 against a mu 1 claim
    summary, claims = _summary(seen, known, np.ones(k, dtype=int))
    decision = decide_alarm(summary.claim_tests, look=11, num_looks=11, claims=claims, delta=1e-5)
    assert decision.status == "error"
    ref = decision.refuted_by
    assert ref["claim_mu"] == 1.0 and ref["tier"] in {t.value for t in ValidityTier}
    assert ref["mu_lo"] > 1.0 and ref["epsilon_lo"] > 0 and ref["confidence"] == 0.95
    assert ref["p_value"] <= ref["level"]
    # on the claim: no alarm, and the bound stays below the truth
    ok = rng.normal(0, 1, k) + seen * 1.0
    summary, claims = _summary(seen, ok, np.ones(k, dtype=int))
    assert decide_alarm(summary.claim_tests, look=11, num_looks=11, claims=claims).status == "ok"


def test_no_dp_claim():
    spec = AuditSpec(noise_multiplier=0.0, num_canaries=20)
    claims = audit_claims(spec)
    decision = decide_alarm([], look=1, num_looks=21, claims=claims)
    assert decision.status == "no_dp_claim" and "No DP claim" in decision.guarantee


def test_guarantee_sentence_names_claim_looks_and_level():
    spec = AuditSpec(noise_multiplier=1.0, canary_repeats=4, num_canaries=20, num_rounds=20)
    text = alarm_guarantee(audit_claims(spec), num_looks=21)
    assert "2-Gaussian DP" in text and "21 looks" in text and "5%" in text


#: 1400 runs, false alarms <= 96: a correct 5% alarm fails with probability 9.7e-4, one whose
#: true rate is 8% with probability 0.94 (binomial_limit; docs/fidelity.md, "Validity tests")
FALSE_ALARM_LIMIT = binomial_limit(1400, 0.05, false_fail=1e-3, against=0.08)


def test_false_alarm_rate_over_every_look_on_the_claim():
    """Scores exactly on a mu = 1 claim (r = 1, T = 10, k = 100), accumulating round by round;
    count runs where decide_alarm fires at any of the 11 looks on any of its three tests."""
    lim = FALSE_ALARM_LIMIT
    assert lim.false_fail <= 1e-3 and lim.power >= 0.9, str(lim)
    rng = np.random.default_rng(1)
    alarms = sum(
        new_alarm_first_look(
            simulate_scores(rng, k=100, num_rounds=10, noise_scale=1.0),
            num_rounds=10,
            with_fdp=True,
        )
        is not None
        for _ in range(lim.runs)
    )
    assert lim.passes(alarms), (alarms, str(lim))


def test_the_validity_runs_feed_decide_alarm_what_summarize_does():
    """The claim tests behind the false-alarm count above (built directly, for speed) are the
    ones summarize hands to decide_alarm: same p-values and the same decision at every look."""
    rng = np.random.default_rng(7)
    claim = GaussianDPClaim(1.0, threat_model="known_rounds")
    fired = 0
    for shift in (1.0, 1.0, 1.6, 2.0, 2.5):
        run = simulate_scores(rng, k=100, num_rounds=10, noise_scale=1.0 / shift)
        seen, rounds, known = run["seen"], run["rounds"], run["known"]
        for look in range(1, 12):
            scored = rounds <= min(look, 10)
            summary, claims = _summary(
                seen, np.where(scored, known, np.nan), scored.astype(int), claims=[claim]
            )
            by_name = {t.details.get("test"): t for t in summary.claim_tests}
            direct = [
                normal_score_claim_test(
                    known[seen & scored],
                    claim,
                    "known_rounds",
                    AlarmTest.known_rounds_normal_scores,
                ),
                fdp_claim_test(known[scored], seen[scored], claim=claim),
            ]
            for test in direct:
                shipped = by_name[test.details["test"]]
                assert test.p_value == pytest.approx(shipped.p_value, rel=1e-9, abs=1e-15)
            status = decide_alarm(
                summary.claim_tests, look=look, num_looks=11, claims=claims
            ).status
            assert decide_alarm(direct, look=look, num_looks=11).status == status
            fired += status == "error"
    assert fired > 0  # the comparison covered alarms, not only silence


def test_summarize_reports_normal_score_tests_and_bounds():
    rng = np.random.default_rng(2)
    k, d = 400, 5000
    seen = rng.random(k) < 0.5
    final = rng.normal(0, 1 / math.sqrt(d), k) + seen * 3 / math.sqrt(d)
    known = rng.normal(0, 1, k) + seen * 2.0
    known[:5] = np.nan  # not yet scored
    summary, claims = _summary(seen, known, np.where(np.isnan(known), 0, 1), d=d, final=final)
    names = {t.details.get("test") for t in summary.claim_tests}
    assert {a.value for a in AlarmTest} <= names
    kinds = {(e.threat_model, e.estimator.value) for e in summary.estimates}
    assert {("known_rounds", "normal_scores"), ("final_model", "normal_scores")} <= kinds
    known_test = next(
        t
        for t in summary.claim_tests
        if t.details.get("test") == AlarmTest.known_rounds_normal_scores.value
    )
    assert known_test.p_value < 1e-10
    no_claim = summarize(
        AuditLook(seen=seen, dim=d, delta=1e-5, known_rounds_scores=known, claims=[NoDPClaim()])
    )
    assert all(t.p_value == 1.0 for t in no_claim.claim_tests)


def test_fdp_tier_rejects_perfect_separation_and_not_the_claim():
    rng = np.random.default_rng(3)
    k = 400
    seen = rng.random(k) < 0.5
    claim = GaussianDPClaim(0.5, threat_model="known_rounds")
    perfect = np.where(seen, 10.0, 0.0) + rng.normal(0, 0.01, k)
    assert fdp_claim_test(perfect, seen, claim=claim).p_value < 1e-3
    on_claim = rng.normal(0, 1, k) + seen * 0.5
    assert fdp_claim_test(on_claim, seen, claim=claim).p_value > 1e-3
