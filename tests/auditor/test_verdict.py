"""The verdict (auditor/claims/verdict.py): which estimates are valid bounds, one status and one
sentence per case, and the alarm's record kept once fired (auditor/claims/alerts.py)."""

from __future__ import annotations

import math

import pytest

from flaudit.auditor.claims.alerts import build_alerts, decide, first_alarm, spec_verdict
from flaudit.auditor.claims.verdict import VerdictStatus, audit_verdict, largest_valid_bound
from flaudit.auditor.spec import AuditSpec

CLAIM = {"mu": 1.0, "epsilon": 4.4, "delta": 1e-5, "description": "mu = 1"}
TESTABLE = {
    "testable": True,
    "summary": "catches noise × 0.8 or smaller in 95% of runs",
    "advice": None,
}
WEAK = {
    "testable": False,
    "summary": "cannot refute claims above μ = 0.6",
    "advice": "use 400 canaries or more",
}


def _est(estimator, eps, correction="bonferroni", confidence=0.95, **details):
    return {
        "estimator": estimator,
        "epsilon": eps,
        "threat_model": "final_model",
        "delta": 1e-5,
        "correction": correction,
        "confidence": confidence,
        "details": details,
    }


def _verdict(**kw):
    """audit_verdict for a finished 10-round run of CLAIM with a testable design, unless told."""
    defaults = dict(
        claim=CLAIM, design=TESTABLE, state="succeeded", rounds_received=10, num_rounds=10
    )
    return audit_verdict(**{**defaults, **kw})


def test_the_largest_valid_bound_counts_the_bounds_valid_for_the_mechanism_audited():
    """Counted: the normal-score mu_lo (exact for DP-FedAvg with Gaussian noise) and the one-run
    bounds (any mechanism). Not counted: estimates, uncorrected maxima, and the threshold bounds,
    whose intervals take one release's scores as independent although they share its scale."""
    estimates = [
        _est("lower_bound", 9.0),
        _est("lower_bound", 9.5, correction="none"),
        _est("gdp_lower_bound", 8.0, mu=2.5),  # shared scale: shown, not counted
        _est("one_run", 0.3),
        _est("two_gaussian", 50.0, correction="n/a", confidence=None),
        _est("analytic", 4.4, correction="n/a", confidence=None),
        _est("normal_scores", 2.2, correction="n/a", mu=0.9),
        _est("fdp_one_run", 1.1, mu=0.5),
    ]
    bound = largest_valid_bound(estimates)
    assert bound["estimator"] == "normal_scores" and bound["epsilon"] == 2.2
    assert bound["mu"] == 0.9 and bound["name"]
    # the largest of three bounds at 95% each is valid only at 1 - 3 * 5% (union bound)
    assert bound["num_bounds"] == 3 and bound["confidence"] == pytest.approx(0.85)
    assert bound["each_confidence"] == 0.95 and "85% as a whole" in bound["validity"]
    estimates.append(_est("fdp_one_run", "inf", mu=math.inf))
    assert largest_valid_bound(estimates)["epsilon"] == math.inf
    assert largest_valid_bound([_est("two_gaussian", 3.0), _est("gdp_lower_bound", 3.0)]) is None


@pytest.mark.parametrize(
    "state, design, alarm, status, start",
    [
        (
            "succeeded",
            TESTABLE,
            None,
            VerdictStatus.consistent,
            "Consistent with the claim of μ = 1",
        ),
        (
            "succeeded",
            WEAK,
            None,
            VerdictStatus.inconclusive,
            "Inconclusive: this audit cannot refute",
        ),
        ("running", TESTABLE, None, VerdictStatus.running, "Running (round 2 of 10): no evidence"),
        (
            "running",
            WEAK,
            None,
            VerdictStatus.running,
            "Running (round 2 of 10), inconclusive so far: this audit cannot refute",
        ),
        (
            "running",
            TESTABLE,
            {
                "round": 2,
                "refuted_by": {
                    "threat_model": "known_rounds",
                    "mu_lo": 1.6,
                    "epsilon_lo": 7.1,
                    "confidence": 0.95,
                    "tier": "independent_canaries",
                },
            },
            VerdictStatus.claim_refuted,
            "Claim refuted at round 2",
        ),
        (
            "succeeded",
            WEAK,
            {
                "round": None,
                "refuted_by": {"threat_model": "final_model", "p_value": 1e-4, "confidence": 0.95},
            },
            VerdictStatus.claim_refuted,
            "Claim refuted at the end of training",
        ),
        (
            "failed",
            TESTABLE,
            None,
            VerdictStatus.inconclusive,
            "Inconclusive: the run failed after 2",
        ),
    ],
)
def test_one_status_and_one_sentence_per_case(state, design, alarm, status, start):
    verdict = audit_verdict(
        claim=CLAIM, design=design, alarm=alarm, state=state, rounds_received=2, num_rounds=10
    )
    assert verdict.status is status
    assert verdict.summary.startswith(start), verdict.summary
    assert verdict.summary.count(". ") <= 1  # one sentence (and at most a gap note)
    out = verdict.to_dict()
    assert out["status"] == status.value and out["summary"] == verdict.summary


def test_a_refutation_names_the_bound_its_confidence_and_its_tier():
    alarm = {
        "round": 3,
        "refuted_by": {
            "test": "known_rounds_mean",
            "threat_model": "known_rounds",
            "mu_lo": 1.6,
            "epsilon_lo": 7.1,
            "confidence": 0.95,
            "tier": "assumption_free",
        },
    }
    verdict = _verdict(alarm=alarm)
    assert "at least μ = 1.6 (ε ≥ 7.1 at δ = 1e-05) at 95% confidence" in verdict.summary
    assert "valid for every mechanism that meets the claim" in verdict.summary
    assert verdict.tier == "assumption_free" and verdict.round == 3
    assert verdict.refuted_by["round"] == 3 and verdict.gaps is None


def test_gaps_and_no_claim():
    short = _verdict(rounds_received=7, missing_rounds=[4, 5, 6])
    assert short.status is VerdictStatus.consistent
    assert short.summary.endswith(
        " Gaps: round(s) 4, 5, 6 of 10 were not reported; the "
        "audit covers the rest, with less power."
    )
    assert short.gaps["missing_rounds"] == [4, 5, 6]
    bare = _verdict(state="running", rounds_received=3, rounds_without_canaries=[2])
    assert "Gaps: round(s) 2 trained without canaries" in bare.summary
    none = audit_verdict(claim=None, state="succeeded", rounds_received=10, num_rounds=10)
    assert none.status is VerdictStatus.no_dp_claim and none.summary.startswith("No DP claim")


def _tests(p_value):
    claim = {"kind": "gaussian_dp", "mu": 1.0, "threat_model": "known_rounds"}
    return [
        {
            "p_value": p_value,
            "claim": claim,
            "threat_model": "known_rounds",
            "details": {"test": "known_rounds_normal_scores"},
        }
    ]


def test_an_error_alarm_is_kept_once_fired_with_its_round():
    spec = AuditSpec(num_canaries=100, num_clients=1000, clients_per_round=10, num_rounds=5)
    alerts = []
    for t, p in enumerate([0.5, 1e-9, 0.9, 0.9, 0.9], start=1):
        alerts = build_alerts(
            spec=spec,
            dim=None,
            rounds_stored=t,
            has_final=False,
            alarm=decide(spec, _tests(p), look=t),
            round=t,
            previous=alerts,
        )
    record = first_alarm(alerts)
    assert record is not None and record["round"] == 2
    assert sum(a["level"] == "error" for a in alerts) == 1
    verdict = spec_verdict(spec, alarm=record, state="running", rounds_received=5)
    assert verdict.status is VerdictStatus.claim_refuted and verdict.round == 2


def _refuted(mu_lo):
    return {
        "round": 3,
        "refuted_by": {
            "threat_model": "known_rounds",
            "mu_lo": mu_lo,
            "epsilon_lo": 9.0,
            "confidence": 0.95,
            "tier": "independent_canaries",
        },
    }


@pytest.mark.parametrize("factor", [None, 1.0, 1.0 + 1e-9])
def test_equal_weights_add_nothing_to_the_verdict(factor):
    plain = _verdict(alarm=_refuted(2.5))
    weighted = _verdict(alarm=_refuted(2.5), weight_factor=factor)
    assert weighted.summary == plain.summary and "weight" not in plain.summary


def _refuted_at(mu_lo, tested_mu):
    alarm = _refuted(mu_lo)
    alarm["refuted_by"]["claim_mu"] = tested_mu
    return alarm


def test_an_alarm_tested_at_the_heaviest_influence_blames_the_noise():
    """The alarm's tests ran at W x mu (the record's claim_mu): an alarm is evidence that the
    noise falls short for the weighting used, whatever mu_lo is measured; a weighting that
    breaks the claim is said too (cause noise_and_weighting)."""
    kw = dict(weight_factor=3.2)
    verdict = _verdict(alarm=_refuted_at(3.5, 3.2), **kw)
    assert verdict.status is VerdictStatus.claim_refuted and verdict.cause == "noise_and_weighting"
    assert verdict.summary.startswith("Claim refuted at round 3")
    assert (
        "the noise falls short: tested at the heaviest client's influence (3.2×" in verdict.summary
    )
    assert "correct noise gives μ = 3.2" in verdict.summary
    assert "The weighting breaks the claim too" in verdict.summary
    assert "not the noise" not in verdict.summary
    assert verdict.weighting == {
        "weight_factor": 3.2,
        "claim_mu": 1.0,
        "heaviest_mu": 3.2,
        "breaks_claim": True,
        "tested_mu": 3.2,
        "matters": True,
    }
    # a weighting within the tolerance: tested there, blamed on the noise alone
    slight = _verdict(alarm=_refuted_at(1.4, 1.005), **{**kw, "weight_factor": 1.005})
    assert slight.cause == "noise" and "weighting breaks" not in slight.summary
    assert slight.weighting["breaks_claim"] is False and slight.weighting["matters"] is False
    # issue #38 (d): equal partitions (360 vs 359 examples: W = 1.002) say nothing about the
    # weighting, and never "1×"
    even = _verdict(alarm=_refuted_at(1.4, 1.002), **{**kw, "weight_factor": 1.002})
    plain = _verdict(alarm=_refuted(1.4), **{**kw, "weight_factor": None})
    assert even.summary == plain.summary and "1×" not in even.summary
    assert "falls short" not in even.summary and even.cause == "noise"


def test_an_alarm_before_any_heavier_canary_round_still_names_the_noise():
    """A weighted run whose alarm fired before any canary round had a heavier reply: the test
    ran at the C/n the noise is calibrated for (claim_mu = mu), which is a test of the noise;
    the sentence names the noise as falling short there (the CI run of 2026-11-27 fired at
    round 2 with noise x 0.25 and said only "the run does not meet its claim")."""
    verdict = _verdict(
        alarm=_refuted_at(3.57, 1.0), rounds_received=20, num_rounds=20, weight_factor=1.6
    )
    assert verdict.cause == "noise_and_weighting"
    assert "the noise falls short: tested at the C/n the noise is calibrated for" in verdict.summary
    assert "heaviest client's influence (" not in verdict.summary
    assert "The weighting breaks the claim too" in verdict.summary


def test_the_sentence_quotes_the_final_valid_bound_and_the_alarms_round():
    """The tile's bound (the final valid one), not the alarm round's mu_lo, is the leakage the
    sentence states; the alarm's round is when it fired."""
    estimates = [_est("normal_scores", 12.0, correction="n/a", mu=3.85)]
    verdict = _verdict(alarm=_refuted_at(1.1, 1.5), estimates=estimates, weight_factor=1.5)
    assert verdict.largest_valid_bound["mu"] == 3.85
    assert "the leakage is at least μ = 3.85" in verdict.summary
    assert "μ = 1.1" not in verdict.summary
    assert "the alarm fired at round 3" in verdict.summary


def test_correct_noise_under_a_heavy_weighting_is_refuted_by_the_weighting_not_the_noise():
    for state, design, noise in [
        ("succeeded", TESTABLE, "The noise is consistent with the claim for the weighting used"),
        ("succeeded", WEAK, "Whether the noise is right for the weighting used is untested"),
        ("failed", TESTABLE, "The noise: no claim test rejected"),
    ]:
        verdict = _verdict(design=design, state=state, weight_factor=2.0)
        assert verdict.status is VerdictStatus.claim_refuted and verdict.cause == "weighting"
        assert verdict.summary.startswith(
            "Claim refuted by the weighting, not the noise: the "
            "weighted average gives the heaviest client 2×"
        )
        assert "protected only at μ = 2" in verdict.summary and noise in verdict.summary
        assert verdict.refuted_by is None and verdict.round is None
    # the tests ran at the heaviest influence the canaries carried, which the sentence names
    carried = _verdict(weight_factor=2.0, canary_weight_factor=1.25)
    assert "the heaviest influence the canaries carried (μ = 1.25)" in carried.summary
    assert carried.weighting["tested_mu"] == 1.25 and carried.weighting["heaviest_mu"] == 2.0


def test_a_running_weighted_run_says_what_the_weighting_does():
    verdict = _verdict(state="running", rounds_received=4, weight_factor=2.0)
    assert verdict.status is VerdictStatus.running and verdict.cause is None
    assert (
        "Weighting: the weighted average gives the heaviest client 2× the influence"
        in verdict.summary
    )
    assert "the claim tests run at that influence" in verdict.summary
    # within the tolerance: nothing to say, and the verdict is the unweighted one
    slight = _verdict(weight_factor=1.005)
    assert slight.status is VerdictStatus.consistent and "weight" not in slight.summary


def test_unweighted_refutations_blame_the_noise_and_consistent_verdicts_nothing():
    refuted = _verdict(alarm=_refuted(2.5))
    assert refuted.cause == "noise" and refuted.weighting is None
    assert "falls short" not in refuted.summary  # tested at the claim itself
    consistent = _verdict()
    assert consistent.cause is None and consistent.to_dict()["cause"] is None


def test_the_headline_bound_states_the_confidence_left_after_splitting_the_level():
    """Bounds computed at 1 - 5%/m each: their largest is valid at 95% as a whole, and the
    verdict's sentence says the level was split; one bound alone keeps its own level."""
    each = 1 - 0.05 / 3
    estimates = [
        _est("normal_scores", 2.2, correction="n/a", confidence=each, mu=0.9),
        _est("one_run", 0.3, confidence=each),
        _est("fdp_one_run", 1.1, confidence=each, mu=0.5),
    ]
    bound = largest_valid_bound(estimates)
    assert bound["confidence"] == pytest.approx(0.95) and bound["num_bounds"] == 3
    assert "95% as a whole" in bound["validity"]
    only = largest_valid_bound(estimates[:1])
    assert only["num_bounds"] == 1 and only["confidence"] == pytest.approx(each)
    verdict = audit_verdict(
        claim={"mu": 0.5, "epsilon": 2.0, "delta": 1e-5},
        alarm={
            "round": 3,
            "refuted_by": {"test": "known_rounds_normal_scores", "confidence": 0.95},
        },
        estimates=estimates,
        state="succeeded",
        rounds_received=5,
        num_rounds=5,
    )
    assert "95% confidence (as a whole: the level is split across 3 bounds)" in verdict.summary


def test_an_alarm_under_a_mismatch_says_the_noise_falls_short_of_the_mechanism_run():
    """Issue #38: a round noised for 0.85x its clip norm; the claim tests ran on the mechanism
    actually run (claim_mu = mu / 0.85), so an alarm says the noise falls short even of that."""
    ended = {"state": "succeeded", "rounds_received": 10, "num_rounds": 10}
    alarm = _refuted_at(2.5, 1 / 0.85)
    verdict = audit_verdict(
        claim=CLAIM, design=TESTABLE, alarm=alarm, noise_clip_factor=0.85, **ended
    )
    assert verdict.cause == "noise"
    assert "the noise falls short even of the mechanism actually run" in verdict.summary
    assert "down to 0.850× it" in verdict.summary and "μ = 1.18" in verdict.summary
