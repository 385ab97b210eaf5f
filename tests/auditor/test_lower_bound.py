import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.fidelity._common import binomial_limit
from flaudit.auditor import epsilon_lower_bound
from flaudit.auditor.estimators import (
    Bonferroni,
    NoCorrection,
    Split,
    gaussian_sigma_for_epsilon,
    jeffreys_upper,
)
from flaudit.auditor.results import Correction, Estimator


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
    recomputed = max(
        math.log((1 - 1e-6 - det["fpr_upper"]) / det["fnr_upper"]),
        math.log((1 - 1e-6 - det["fnr_upper"]) / det["fpr_upper"]),
    )
    assert r.epsilon == pytest.approx(recomputed, rel=1e-9)


def _coverage_failures(correction, true_eps, trials):
    """How often the 95% bound exceeds the true epsilon over ``trials`` repetitions: with the
    exact null FPR and with the Jeffreys FPR on unseen canaries (two counts, same runs)."""
    rng = np.random.default_rng(1)
    d = 10**6
    exact = jeffreys = 0
    for _ in range(trials):
        if true_eps == 0:  # nothing leaks: seen canaries look exactly like the null
            seen = rng.normal(0, 1 / math.sqrt(d), 300)
        else:
            seen = _mechanism_scores(true_eps, d, 300, rng)
        unseen = rng.normal(0, 1 / math.sqrt(d), 300)
        exact += (
            epsilon_lower_bound(seen, d=d, delta=1e-6, correction=correction).epsilon > true_eps
        )
        jeffreys += (
            epsilon_lower_bound(seen, unseen, delta=1e-6, correction=correction).epsilon > true_eps
        )
    return exact, jeffreys


#: 1400 runs, at most 96 above the truth: a correct 95% bound fails with probability 9.7e-4, one
#: above the truth in 8% of runs with probability 0.94 (binomial_limit; docs/fidelity.md)
COVERAGE = binomial_limit(1400, 0.05, false_fail=1e-3, against=0.08)


@pytest.mark.parametrize("true_eps", [0.0, 2.0])
def test_split_covers_the_true_epsilon(true_eps):
    """A 95% lower bound must stay below the true epsilon in >= 95% of repetitions (Split here;
    Bonferroni, the default, in tests/fidelity/test_fidelity_validity.py with the same limit)."""
    assert COVERAGE.power >= 0.9 and COVERAGE.false_fail <= 1e-3, str(COVERAGE)
    exact, jeffreys = _coverage_failures(Split(0.5, 3), true_eps, COVERAGE.runs)
    assert COVERAGE.passes(exact) and COVERAGE.passes(jeffreys), (exact, jeffreys, str(COVERAGE))


def test_the_coverage_check_catches_the_uncorrected_bound():
    """The same kind of check has power: at true epsilon 0 the paper's uncorrected maximum over
    thresholds with the exact null exceeds the truth far more often than 5% (docs/fidelity.md):
    past the limit of 100 runs (<= 13)."""
    check = binomial_limit(100, 0.05, false_fail=1e-3)
    exact, _ = _coverage_failures(NoCorrection(), 0.0, check.runs)
    assert not check.passes(exact), exact


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


# -- NoCorrection(paper_exact=True): the rule of the authors' code ---------------------------
# Regression cases of the authors' test (google-research/federated, one_shot_epe's
# empirical_privacy_estimation_lib_test.py): seed 0xBAD5EED, 100 seen cosines ~ N(sigma, sigma^2)
# (and 100 unseen ~ N(0, sigma^2) drawn next from the same generator), alpha = delta = 1e-2.
# The expected values are the ones written in that test file, not numbers printed by our code.
_AUTHORS_SEED = 0xBAD5EED
_PAPER = NoCorrection(paper_exact=True)


def test_paper_exact_reproduces_the_authors_seen_unseen_regression():
    rng = np.random.default_rng(_AUTHORS_SEED)
    seen = rng.normal(loc=1.0, scale=1.0, size=100)
    unseen = rng.normal(loc=0.0, scale=1.0, size=100)
    result = epsilon_lower_bound(seen, unseen, delta=1e-2, confidence=0.99, correction=_PAPER)
    assert result.epsilon == pytest.approx(0.6839449, abs=1e-6)
    assert result.details["rule"] == "paper_exact" and "authors' rule" in result.method


@pytest.mark.parametrize("d, expected", [(200, 1.394838), (2000, 1.3880321)])
def test_paper_exact_reproduces_the_authors_closed_form_null_regression(d, expected):
    sigma = d**-0.5
    seen = np.random.default_rng(_AUTHORS_SEED).normal(loc=sigma, scale=sigma, size=100)
    result = epsilon_lower_bound(seen, d=d, delta=1e-2, confidence=0.99, correction=_PAPER)
    assert result.epsilon == pytest.approx(expected, abs=1e-6)


def test_the_default_rule_differs_from_the_authors_and_is_more_conservative():
    rng = np.random.default_rng(_AUTHORS_SEED)
    seen, unseen = rng.normal(1.0, 1.0, 100), rng.normal(0.0, 1.0, 100)
    ours = epsilon_lower_bound(seen, unseen, delta=1e-2, confidence=0.99).epsilon
    assert ours < 0.6839449 - 0.05
    assert NoCorrection() == NoCorrection(paper_exact=False)


@settings(max_examples=40)
@given(st.integers(0, 2**32 - 1), st.floats(0.0, 3.0), st.sampled_from([None, 50, 500]))
def test_paper_exact_is_never_below_the_default(seed, shift, d):
    """alpha per rate instead of alpha/2, and seen == a no longer a false negative: each
    threshold's bound can only grow (below d = 1000 both use the exact null)."""
    rng = np.random.default_rng(seed)
    if d is None:
        seen, unseen = rng.normal(shift, 1.0, 40).round(1), rng.normal(0.0, 1.0, 40).round(1)
        kwargs = {}
    else:
        seen, unseen, kwargs = rng.normal(shift, 1.0, 40).round(1) * d**-0.5, None, {"d": d}
    default = epsilon_lower_bound(seen, unseen, delta=1e-3, **kwargs).epsilon
    paper = epsilon_lower_bound(seen, unseen, delta=1e-3, correction=_PAPER, **kwargs).epsilon
    assert paper >= default - 1e-12


def test_paper_exact_is_invariant_to_an_affine_map_of_the_scores():
    rng = np.random.default_rng(3)
    seen, unseen = rng.normal(1.0, 0.5, 100), rng.normal(0.0, 0.5, 100)
    one = epsilon_lower_bound(seen, unseen, delta=1e-5, correction=_PAPER).epsilon
    two = epsilon_lower_bound(
        seen * 2.71828 + 3.14159, unseen * 2.71828 + 3.14159, delta=1e-5, correction=_PAPER
    ).epsilon
    assert one == pytest.approx(two, rel=1e-9) and one > 0


def test_tied_seen_scores_are_not_all_false_negatives():
    """A run without noise can put every seen score at the same value (a cosine of exactly 1.0):
    the Bonferroni thresholds must still count those canaries as positives."""
    rng = np.random.default_rng(0)
    seen = np.ones(500)
    unseen = rng.normal(0.0, 0.01, 500)
    bound = epsilon_lower_bound(seen, unseen, delta=1e-5, correction=Bonferroni())
    assert bound.epsilon > 3.0
    final = epsilon_lower_bound(seen, d=10_000, delta=1e-5, correction=Bonferroni())
    assert final.epsilon > 3.0
