"""The verdict (auditor/claims/verdict.py): which estimates are valid bounds, one status and one
sentence per case, and the alarm's record kept once fired (auditor/claims/alerts.py)."""

from __future__ import annotations

import math

import pytest

from flaudit.auditor.claims.alerts import build_alerts, decide, first_alarm, spec_verdict
from flaudit.auditor.claims.verdict import VerdictStatus, audit_verdict, largest_valid_bound
from flaudit.auditor.spec import AuditSpec

CLAIM = {"mu": 1.0, "epsilon": 4.4, "delta": 1e-5, "description": "mu = 1"}
TESTABLE = {"testable": True, "summary": "catches noise × 0.8 or smaller in 95% of runs",
            "advice": None}
WEAK = {"testable": False, "summary": "cannot refute claims above μ = 0.6",
        "advice": "use 400 canaries or more"}


def _est(estimator, eps, correction="bonferroni", confidence=0.95, **details):
    return {"estimator": estimator, "epsilon": eps, "threat_model": "final_model",
            "delta": 1e-5, "correction": correction, "confidence": confidence,
            "details": details}


def test_the_largest_valid_bound_counts_the_bounds_valid_for_the_mechanism_audited():
    """Counted: the normal-score mu_lo (exact for DP-FedAvg with Gaussian noise) and the one-run
    bounds (any mechanism). Not counted: estimates, uncorrected maxima, and the threshold bounds,
    whose intervals take one release's scores as independent although they share its scale."""
    estimates = [
        _est("lower_bound", 9.0), _est("lower_bound", 9.5, correction="none"),
        _est("gdp_lower_bound", 8.0, mu=2.5),  # shared scale: shown, not counted
        _est("one_run", 0.3), _est("two_gaussian", 50.0, correction="n/a", confidence=None),
        _est("analytic", 4.4, correction="n/a", confidence=None),
        _est("normal_scores", 2.2, correction="n/a", mu=0.9), _est("fdp_one_run", 1.1, mu=0.5),
    ]
    bound = largest_valid_bound(estimates)
    assert bound["estimator"] == "normal_scores" and bound["epsilon"] == 2.2
    assert bound["mu"] == 0.9 and bound["confidence"] == 0.95 and bound["name"]
    estimates.append(_est("fdp_one_run", "inf", mu=math.inf))
    assert largest_valid_bound(estimates)["epsilon"] == math.inf
    assert largest_valid_bound([_est("two_gaussian", 3.0), _est("gdp_lower_bound", 3.0)]) is None


@pytest.mark.parametrize("state, design, alarm, status, start", [
    ("succeeded", TESTABLE, None, VerdictStatus.consistent, "Consistent with the claim of μ = 1"),
    ("succeeded", WEAK, None, VerdictStatus.inconclusive, "Inconclusive: this audit cannot refute"),
    ("running", TESTABLE, None, VerdictStatus.running, "Running (round 2 of 10): no evidence"),
    ("running", WEAK, None, VerdictStatus.running,
     "Running (round 2 of 10), inconclusive so far: this audit cannot refute"),
    ("running", TESTABLE, {"round": 2, "refuted_by": {"threat_model": "known_rounds",
                                                       "mu_lo": 1.6, "epsilon_lo": 7.1,
                                                       "confidence": 0.95,
                                                       "tier": "independent_canaries"}},
     VerdictStatus.claim_refuted, "Claim refuted at round 2"),
    ("succeeded", WEAK, {"round": None, "refuted_by": {"threat_model": "final_model",
                                                        "p_value": 1e-4, "confidence": 0.95}},
     VerdictStatus.claim_refuted, "Claim refuted at the end of training"),
    ("failed", TESTABLE, None, VerdictStatus.inconclusive, "Inconclusive: the run failed after 2"),
])
def test_one_status_and_one_sentence_per_case(state, design, alarm, status, start):
    verdict = audit_verdict(claim=CLAIM, design=design, alarm=alarm, state=state,
                            rounds_received=2, num_rounds=10)
    assert verdict.status is status
    assert verdict.summary.startswith(start), verdict.summary
    assert verdict.summary.count(". ") <= 1  # one sentence (and at most a gap note)
    out = verdict.to_dict()
    assert out["status"] == status.value and out["summary"] == verdict.summary


def test_a_refutation_names_the_bound_its_confidence_and_its_tier():
    alarm = {"round": 3, "refuted_by": {"test": "known_rounds_mean", "threat_model": "known_rounds",
                                        "mu_lo": 1.6, "epsilon_lo": 7.1, "confidence": 0.95,
                                        "tier": "assumption_free"}}
    verdict = audit_verdict(claim=CLAIM, design=TESTABLE, alarm=alarm, state="succeeded",
                            rounds_received=10, num_rounds=10)
    assert "at least μ = 1.6 (ε ≥ 7.1 at δ = 1e-05) at 95% confidence" in verdict.summary
    assert "valid for every mechanism that meets the claim" in verdict.summary
    assert verdict.tier == "assumption_free" and verdict.round == 3
    assert verdict.refuted_by["round"] == 3 and verdict.gaps is None


def test_gaps_and_no_claim():
    short = audit_verdict(claim=CLAIM, design=TESTABLE, state="succeeded", rounds_received=7,
                          num_rounds=10, missing_rounds=[4, 5, 6])
    assert short.status is VerdictStatus.consistent
    assert short.summary.endswith(" Gaps: round(s) 4, 5, 6 of 10 were not reported; the "
                                  "audit covers the rest, with less power.")
    assert short.gaps["missing_rounds"] == [4, 5, 6]
    bare = audit_verdict(claim=CLAIM, design=TESTABLE, state="running", rounds_received=3,
                         num_rounds=10, rounds_without_canaries=[2])
    assert "Gaps: round(s) 2 trained without canaries" in bare.summary
    none = audit_verdict(claim=None, state="succeeded", rounds_received=10, num_rounds=10)
    assert none.status is VerdictStatus.no_dp_claim and none.summary.startswith("No DP claim")


def _tests(p_value):
    claim = {"kind": "gaussian_dp", "mu": 1.0, "threat_model": "known_rounds"}
    return [{"p_value": p_value, "claim": claim, "threat_model": "known_rounds",
             "details": {"test": "known_rounds_normal_scores"}}]


def test_an_error_alarm_is_kept_once_fired_with_its_round():
    spec = AuditSpec(num_canaries=100, num_clients=1000, clients_per_round=10, num_rounds=5)
    alerts = []
    for t, p in enumerate([0.5, 1e-9, 0.9, 0.9, 0.9], start=1):
        alerts = build_alerts(spec=spec, dim=None, rounds_stored=t, has_final=False,
                              alarm=decide(spec, _tests(p), look=t), round=t, previous=alerts)
    record = first_alarm(alerts)
    assert record is not None and record["round"] == 2
    assert sum(a["level"] == "error" for a in alerts) == 1
    verdict = spec_verdict(spec, alarm=record, state="running", rounds_received=5)
    assert verdict.status is VerdictStatus.claim_refuted and verdict.round == 2


def _refuted(mu_lo):
    return {"round": 3, "refuted_by": {"threat_model": "known_rounds", "mu_lo": mu_lo,
                                       "epsilon_lo": 9.0, "confidence": 0.95,
                                       "tier": "independent_canaries"}}


@pytest.mark.parametrize("factor", [None, 1.0, 1.0 + 1e-9])
def test_equal_weights_add_nothing_to_the_verdict(factor):
    plain = audit_verdict(claim=CLAIM, design=TESTABLE, alarm=_refuted(2.5), state="succeeded",
                          rounds_received=10, num_rounds=10)
    weighted = audit_verdict(claim=CLAIM, design=TESTABLE, alarm=_refuted(2.5),
                             state="succeeded", rounds_received=10, num_rounds=10,
                             weight_factor=factor)
    assert weighted.summary == plain.summary and "weight" not in plain.summary


def test_a_refutation_within_the_weighting_blames_the_weighting_not_the_noise():
    """Correct noise with a client weighted 3.2x C/n protects it at 3.2 x mu: a measured
    mu_lo of 2.5 (claim 1) is what that weighting allows, so the weighting breaks the claim;
    a mu_lo of 4 is more than the weighting explains, so the noise is short too."""
    kw = dict(claim=CLAIM, design=TESTABLE, state="succeeded", rounds_received=10,
              num_rounds=10, weight_factor=3.2)
    weighting = audit_verdict(alarm=_refuted(2.5), **kw)
    assert weighting.status is VerdictStatus.claim_refuted
    assert weighting.summary.startswith("Claim refuted at round 3")
    assert "The weighting, not the noise, breaks the claim" in weighting.summary
    assert "3.2× the influence (C/n)" in weighting.summary
    assert "protected only at μ = 3.2" in weighting.summary
    assert weighting.summary.endswith("cap the weights or weight uniformly.")
    both = audit_verdict(alarm=_refuted(4.0), **kw)
    assert "Not the weighting alone" in both.summary and "the noise falls short too" in both.summary
    assert "not the noise" not in both.summary
    # the boundary: mu_lo exactly at what the weighting allows is still the weighting's
    assert "not the noise" in audit_verdict(alarm=_refuted(3.2), **kw).summary


def test_an_unrefuted_weighted_run_still_says_what_the_weighting_does():
    for state, design, status in [("succeeded", TESTABLE, VerdictStatus.consistent),
                                  ("succeeded", WEAK, VerdictStatus.inconclusive),
                                  ("running", TESTABLE, VerdictStatus.running)]:
        verdict = audit_verdict(claim=CLAIM, design=design, state=state, rounds_received=4,
                                num_rounds=10, weight_factor=2.0)
        assert verdict.status is status
        assert "Weighting: the weighted average gives the heaviest client 2× the influence" \
            in verdict.summary
        assert "protected only at μ = 2" in verdict.summary
