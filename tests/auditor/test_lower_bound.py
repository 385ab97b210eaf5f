import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auditor import epsilon_lower_bound
from auditor.estimators import Bonferroni, NoCorrection, Split, gaussian_sigma_for_epsilon, jeffreys_upper
from auditor.results import Correction, Estimator


def _mechanism_scores(eps, d, n, rng):
    """Cosines of seen canaries for a Gaussian mechanism that is exactly (eps, 1e-6)-DP."""
    sigma = gaussian_sigma_for_epsilon(eps, 1e-6)
    return rng.normal(1 / (sigma * math.sqrt(d)), 1 / math.sqrt(d), n)


def test_result_has_provenance_and_details():
    rng = np.random.default_rng(0)
    d = 10**6
    seen = _mechanism_scores(10.0, d, 500, rng)
    r = epsilon_lower_bound(seen, d=d, delta=1e-6)
    assert r.estimator is Estimator.lower_bound and r.correction is Correction.none
    assert r.confidence == 0.95 and r.threat_model == "final_model"
    assert 2.0 < r.epsilon < 10.0
    det = r.details
    assert det["fpr"] == "exact null" and 0 < det["fnr_upper"] < 1 and 0 < det["fpr_upper"] < 1
    recomputed = max(math.log((1 - 1e-6 - det["fpr_upper"]) / det["fnr_upper"]),
                     math.log((1 - 1e-6 - det["fnr_upper"]) / det["fpr_upper"]))
    assert r.epsilon == pytest.approx(recomputed, rel=1e-9)


def _coverage_failures(correction, true_eps, trials=100):
    """How often the 95% bound exceeds the true epsilon, over ``trials`` repetitions with the
    exact null FPR and ``trials`` with the Jeffreys FPR on unseen canaries (2 * trials bounds)."""
    rng = np.random.default_rng(1)
    d = 10**6
    fails = 0
    for _ in range(trials):
        if true_eps == 0:  # nothing leaks: seen canaries look exactly like the null
            seen = rng.normal(0, 1 / math.sqrt(d), 300)
        else:
            seen = _mechanism_scores(true_eps, d, 300, rng)
        unseen = rng.normal(0, 1 / math.sqrt(d), 300)
        lb_exact = epsilon_lower_bound(seen, d=d, delta=1e-6, correction=correction)
        lb_jeff = epsilon_lower_bound(seen, unseen, delta=1e-6, correction=correction)
        fails += (lb_exact.epsilon > true_eps) + (lb_jeff.epsilon > true_eps)
    return fails


@pytest.mark.parametrize("true_eps", [0.0, 2.0])
@pytest.mark.parametrize("correction", [Bonferroni(), Split(0.5, 3)])
def test_valid_corrections_cover_the_true_epsilon(correction, true_eps):
    """A 95% lower bound must stay below the true epsilon in >= ~95% of repetitions."""
    # binomial(200, 0.05) exceeds 20 with prob < 1%
    assert _coverage_failures(correction, true_eps) <= 20


def test_the_coverage_check_catches_the_uncorrected_bound():
    """The same check has power: at true epsilon 0 the paper's uncorrected maximum over
    thresholds exceeds the truth far more often than 5% (docs/fidelity.md)."""
    assert _coverage_failures(NoCorrection(), 0.0) > 20


def test_no_leakage_gives_small_bound_and_corrections_are_more_conservative():
    rng = np.random.default_rng(2)
    d = 5000
    seen = rng.normal(0, 1 / math.sqrt(d), 400)
    unseen = rng.normal(0, 1 / math.sqrt(d), 400)
    none = epsilon_lower_bound(seen, unseen, delta=1e-5)
    bonf = epsilon_lower_bound(seen, unseen, delta=1e-5, correction=Bonferroni(10))
    assert none.epsilon < 0.5
    assert bonf.epsilon <= 0.3


@settings(max_examples=30, deadline=None)
@given(st.floats(0.0, 5.0), st.floats(0.0, 2.0))
def test_monotone_in_a_shift_of_the_seen_cosines(shift, extra):
    rng = np.random.default_rng(5)
    d = 10**4
    base = rng.normal(0, 1, 200) / math.sqrt(d)
    a = epsilon_lower_bound(base + shift / math.sqrt(d), d=d, delta=1e-6).epsilon
    b = epsilon_lower_bound(base + (shift + extra) / math.sqrt(d), d=d, delta=1e-6).epsilon
    assert b >= a - 1e-9


def test_jeffreys_upper_bound_coverage_by_simulation():
    rng = np.random.default_rng(3)
    p, n = 0.1, 80
    x = rng.binomial(n, p, 4000)
    upper = jeffreys_upper(x, n, 0.05)
    assert 0.93 <= np.mean(upper >= p) <= 0.99
    assert jeffreys_upper(n, n, 0.05) == 1.0


def test_bad_input():
    with pytest.raises(ValueError, match="d is required"):
        epsilon_lower_bound([0.1, 0.2], delta=1e-6)
    with pytest.raises(ValueError, match="seen"):
        epsilon_lower_bound([], d=10, delta=1e-6)
    with pytest.raises(ValueError, match="unseen"):
        epsilon_lower_bound([0.1], [math.nan], delta=1e-6)
    with pytest.raises(ValueError, match="delta"):
        epsilon_lower_bound([0.1], d=10, delta=0)
    with pytest.raises(ValueError, match="d must"):
        epsilon_lower_bound([0.1], d=1, delta=1e-6)
    with pytest.raises(ValueError, match="confidence"):
        epsilon_lower_bound([0.1], d=10, delta=1e-6, confidence=1.0)
    with pytest.raises(ValueError, match="frac"):
        Split(1.5)


def test_split_with_too_few_canaries_is_defined():
    r = epsilon_lower_bound([0.5], d=10, delta=1e-6, correction=Split(0.5, 0))
    assert r.epsilon == 0.0 and r.correction is Correction.split
