import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flaudit.auditor.claims import AuditLook, AuditSummary, summarize
from flaudit.auditor.results import Correction, Estimator, VarianceTreatment


def _cosines(k=1000, d=10**6, sigma=1.54, seed=0):
    rng = np.random.default_rng(seed)
    seen = rng.random(k) < 0.5
    final = rng.normal(0, 1 / math.sqrt(d), k) + seen / (sigma * math.sqrt(d))
    maxc = rng.normal(3, 0.4, k) / math.sqrt(d) + seen / (sigma * math.sqrt(d))
    return seen, final, maxc, d


def test_summary_reports_every_estimator_with_provenance():
    seen, final, maxc, d = _cosines()
    s = summarize(
        AuditLook(
            seen=seen,
            dim=d,
            delta=1e-6,
            max_cosines=maxc,
            final_cosines=final,
            one_run=True,
            bootstrap=20,
        )
    )
    assert isinstance(s, AuditSummary)
    kinds = {(e.threat_model, e.estimator, e.variance, e.correction) for e in s.estimates}
    assert (
        "final_model",
        Estimator.two_gaussian,
        VarianceTreatment.null,
        Correction.not_applicable,
    ) in kinds
    assert (
        "final_model",
        Estimator.two_gaussian,
        VarianceTreatment.fitted,
        Correction.not_applicable,
    ) in kinds
    assert (
        "final_model",
        Estimator.lower_bound,
        VarianceTreatment.not_applicable,
        Correction.none,
    ) in kinds
    assert (
        "final_model",
        Estimator.lower_bound,
        VarianceTreatment.not_applicable,
        Correction.bonferroni,
    ) in kinds
    assert any(
        e.threat_model == "all_iterates" and e.estimator is Estimator.two_gaussian
        for e in s.estimates
    )
    assert any(e.estimator is Estimator.one_run for e in s.estimates)
    # a signal at the paper's sigma=1.54 (eps=3) must be visible
    est = next(e for e in s.estimates if e.variance is VarianceTreatment.null)
    assert 2.0 < est.epsilon < 4.0
    for e in s.estimates:
        if e.estimator is Estimator.lower_bound:
            assert e.confidence == 0.95 and e.epsilon <= est.epsilon + 1.5
    names = {g.name for g in s.diagnostics}
    assert {
        "anderson_darling_seen_final",
        "unseen_vs_null",
        "bootstrap_final_model_epsilon",
    } <= names
    h = s.histograms["final_model"]
    assert sum(h.seen_counts) == seen.sum() and sum(h.unseen_counts) == (~seen).sum()
    assert len(h.bin_edges) == len(h.seen_counts) + 1 == len(h.null_density) + 1
    json.dumps(s.to_dict())  # JSON-serialisable (inf as "inf")


def test_summary_per_round_only_max_cosines_and_no_round_yet():
    seen, _, maxc, d = _cosines(k=200)
    s = summarize(AuditLook(seen=seen, dim=d, delta=1e-6, max_cosines=maxc))
    assert {e.threat_model for e in s.estimates} == {"all_iterates"}
    empty = summarize(AuditLook(seen=seen, dim=d, delta=1e-6, max_cosines=np.full(200, -np.inf)))
    assert empty.estimates == [] and empty.histograms == {}


@pytest.mark.parametrize(
    "seen,values",
    [
        (np.array([True]), np.array([0.1])),  # one canary
        (np.ones(5, bool), np.zeros(5)),  # all seen, zero variance
        (np.zeros(5, bool), np.full(5, 0.3)),  # none seen
        (
            np.array([True, True, False, False]),
            np.array([0.2, 0.2, 0.0, 0.0]),
        ),  # separated, constant
    ],
)
def test_summary_degenerate_inputs_never_crash_or_nan(seen, values):
    s = summarize(
        AuditLook(
            seen=seen,
            dim=50,
            delta=1e-5,
            max_cosines=values,
            final_cosines=values,
            one_run=True,
            bootstrap=5,
        )
    )
    for e in s.estimates:
        assert not math.isnan(e.epsilon) and e.epsilon >= 0
    for g in s.diagnostics:
        assert not math.isnan(g.value)
    json.dumps(s.to_dict())


def test_summary_rejects_bad_input_naming_argument():
    seen, final, maxc, d = _cosines(k=50)
    with pytest.raises(ValueError, match="final_cosines"):
        summarize(AuditLook(seen=seen, dim=d, delta=1e-6, final_cosines=final[:-1]))
    with pytest.raises(ValueError, match="max_cosines"):
        summarize(AuditLook(seen=seen, dim=d, delta=1e-6, max_cosines=np.where(seen, np.nan, maxc)))
    with pytest.raises(ValueError, match="delta"):
        summarize(AuditLook(seen=seen, dim=d, delta=1.5, final_cosines=final))
    with pytest.raises(ValueError, match="dim"):
        summarize(AuditLook(seen=seen, dim=1, delta=1e-6, final_cosines=final))
    with pytest.raises(ValueError, match="threat_models"):
        summarize(
            AuditLook(seen=seen, dim=d, delta=1e-6, final_cosines=final, threat_models=("nope",))
        )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_summary_never_crashes_or_returns_nan_on_legal_input(data):
    k = data.draw(st.integers(1, 25))
    d = data.draw(st.sampled_from([2, 3, 7, 999, 1000, 10**6]))
    seen = np.array(data.draw(st.lists(st.booleans(), min_size=k, max_size=k)))
    cos = st.floats(-1, 1, allow_nan=False)
    final = np.array(data.draw(st.lists(cos, min_size=k, max_size=k)))
    maxc = np.array(data.draw(st.lists(cos, min_size=k, max_size=k)))
    delta = data.draw(st.sampled_from([1e-9, 1e-5, 0.3]))
    s = summarize(
        AuditLook(
            seen=seen,
            dim=d,
            delta=delta,
            max_cosines=maxc,
            final_cosines=final,
            one_run=True,
            bootstrap=3,
        )
    )
    for e in s.estimates:
        assert not math.isnan(e.epsilon) and e.epsilon >= 0
        assert not any(isinstance(v, float) and math.isnan(v) for v in e.details.values()), e
    for g in s.diagnostics:
        assert not math.isnan(g.value)
    json.dumps(s.to_dict(), allow_nan=False)  # strict JSON: inf appears as the string "inf"


def test_cosines_of_exactly_plus_and_minus_one_give_finite_normal_scores():
    """Found by the property test above: at d = 2, seen cosines of exactly 1 and -1 studentize
    to +inf and -inf, whose sum was NaN (a crash). They are read to float64 resolution."""
    seen = np.zeros(12, dtype=bool)
    seen[[5, 11]] = True
    final = np.zeros(12)
    final[5], final[11] = 1.0, -1.0
    s = summarize(
        AuditLook(
            seen=seen,
            dim=2,
            delta=1e-9,
            max_cosines=np.zeros(12),
            final_cosines=final,
            one_run=True,
            bootstrap=3,
        )
    )
    assert all(not math.isnan(e.epsilon) for e in s.estimates)
    json.dumps(s.to_dict(), allow_nan=False)


def test_summary_splits_the_level_across_the_bounds_the_headline_chooses_from():
    """Issue #38: the headline is the largest valid bound, so the valid bounds share the 5%:
    final model (normal scores, one-run, f-DP one-run) and all iterates (one-run) are m = 4,
    each at 1 - 5%/4; the known-rounds bound makes m = 5; the threshold bounds keep 95%."""
    from flaudit.auditor.claims import largest_valid_bound
    from flaudit.auditor.claims.verdict import is_valid_bound

    seen, final, maxc, d = _cosines(k=200)
    s = summarize(
        AuditLook(seen=seen, dim=d, delta=1e-6, max_cosines=maxc, final_cosines=final, one_run=True)
    )
    rows = [e.to_dict() for e in s.estimates]
    valid = [e for e in rows if is_valid_bound(e)]
    assert len(valid) == 4 and all(e["confidence"] == pytest.approx(1 - 0.05 / 4) for e in valid)
    assert all(
        e["confidence"] == 0.95
        for e in rows
        if e["estimator"] in ("lower_bound", "gdp_lower_bound")
    )
    assert largest_valid_bound(rows)["confidence"] == pytest.approx(0.95)
    known = np.where(seen, 1.0, 0.0) + np.random.default_rng(1).standard_normal(seen.size)
    s = summarize(
        AuditLook(
            seen=seen,
            dim=d,
            delta=1e-6,
            final_cosines=final,
            max_cosines=maxc,
            known_rounds_scores=known,
            one_run=True,
            confidence=0.9,
        )
    )
    valid = [e.to_dict() for e in s.estimates if is_valid_bound(e.to_dict())]
    assert len(valid) == 5 and all(e["confidence"] == pytest.approx(1 - 0.1 / 5) for e in valid)
    assert largest_valid_bound(valid)["confidence"] == pytest.approx(0.9)
