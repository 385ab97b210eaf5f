import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from benchmarks.fidelity._common import binomial_limit
from flaudit.auditor.estimators import gaussian_sigma_for_epsilon
from flaudit.auditor.estimators.sequential import (
    SequentialDPTest,
    mmd_threshold,
    sequential_epsilon_lower_bound,
)
from flaudit.auditor.results import Correction, Estimator

DELTA = 1e-5
#: Type-I error checks: 1400 seeded runs of 100 steps, at most 96 rejections. A correct 5% test
#: fails this with probability 9.7e-4, one whose true size is 8% with probability 0.94
#: (binomial_limit; docs/fidelity.md, "Validity tests").
LEVEL = binomial_limit(1400, 0.05, false_fail=1e-3, against=0.08)
REPS, STEPS = LEVEL.runs, 100


def _gaussian_mmd(mu: float, h: float) -> float:
    """Closed-form MMD between N(0,1) and N(mu,1) for k = exp(-(x-y)^2 / (2 h^2))."""
    s = h / math.sqrt(h * h + 2.0)
    return math.sqrt(max(0.0, 2.0 * s * (1.0 - math.exp(-mu * mu / (2.0 * (h * h + 2.0))))))


def _randomized_response(eps: float, n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Binary randomized response on neighbours 1 and 0: exactly eps-DP and tight."""
    p = math.exp(eps) / (1.0 + math.exp(eps))
    return (rng.random(n) < p).astype(float), (rng.random(n) < 1.0 - p).astype(float)


def _run(x, y, eps, **kw):
    test = SequentialDPTest(eps, DELTA, **kw)
    test.update_many(x, y)
    return test


# -- the MMD threshold ----------------------------------------------------------------------


def test_threshold_formula_and_limits():
    assert mmd_threshold(0.0, DELTA) == pytest.approx(math.sqrt(2) * DELTA)
    e = math.exp(1.0)
    assert mmd_threshold(1.0, 0.01) == pytest.approx(math.sqrt(2) * (e - 1 + 0.02) / (e + 1))
    assert mmd_threshold(1000.0, DELTA) == pytest.approx(math.sqrt(2))
    assert mmd_threshold(1.0, 0.01, kernel_bound=2.0) == pytest.approx(
        2 / math.sqrt(2) * mmd_threshold(1.0, 0.01)
    )


@settings(max_examples=60, deadline=None)
@given(
    eps=st.floats(0.0, 10.0),
    d_eps=st.floats(1e-3, 2.0),
    delta=st.floats(1e-9, 0.4),
)
def test_threshold_increases_in_epsilon_and_delta(eps, d_eps, delta):
    tau = mmd_threshold(eps, delta)
    assert 0.0 < tau <= math.sqrt(2)
    assert mmd_threshold(eps + d_eps, delta) >= tau
    assert mmd_threshold(eps, min(0.9, 2 * delta)) >= tau


@settings(max_examples=60, deadline=None)
@given(eps=st.floats(0.05, 4.0), h=st.floats(0.05, 20.0))
def test_gaussian_mechanism_mmd_stays_below_threshold(eps, h):
    # independent route for Thm 3.1: the (eps, delta)-DP Gaussian mechanism's closed-form MMD
    mu = 1.0 / gaussian_sigma_for_epsilon(eps, DELTA)
    assert _gaussian_mmd(mu, h) <= mmd_threshold(eps, DELTA)


def test_randomized_response_attains_threshold_for_a_narrow_kernel():
    # MMD^2 = 2 TV^2 (1 - k(0, 1)), TV = tanh(eps/2): tau is tight as delta -> 0, h -> 0
    eps, h = 1.3, 0.05
    tv = math.tanh(eps / 2)
    mmd = math.sqrt(2 * tv * tv * (1 - math.exp(-1 / (2 * h * h))))
    assert mmd == pytest.approx(mmd_threshold(eps, 1e-12), rel=1e-9)
    # Monte Carlo check of the same MMD with the plug-in estimator
    rng = np.random.default_rng(7)
    x, y = _randomized_response(eps, 4000, rng)
    mmd_hat = abs(x.mean() - y.mean()) * math.sqrt(2 * (1 - math.exp(-1 / (2 * h * h))))
    assert mmd_hat == pytest.approx(mmd, abs=0.04)


# -- type-I error under H0 (over REPS seeded repetitions) -----------------------------------


def test_same_distribution_rarely_rejects():
    rng = np.random.default_rng(101)
    rejections = 0
    for _ in range(REPS):
        x, y = rng.normal(size=STEPS), rng.normal(size=STEPS)
        test = _run(x, y, 0.0, max_terms=150)
        rejections += test.rejected
        assert test.min_factor >= 0.5
    assert LEVEL.passes(rejections), (rejections, str(LEVEL))


def test_calibrated_gaussian_mechanism_rarely_rejects():
    eps = 1.0
    mu = 1.0 / gaussian_sigma_for_epsilon(eps, DELTA)  # exactly (1, 1e-5)-DP
    rng = np.random.default_rng(202)
    rejections = 0
    for _ in range(REPS):
        x, y = rng.normal(mu, 1.0, STEPS), rng.normal(0.0, 1.0, STEPS)
        rejections += _run(x, y, eps, max_terms=150).rejected
    assert LEVEL.passes(rejections), (rejections, str(LEVEL))


def test_tight_randomized_response_rarely_rejects_but_a_smaller_claim_is_caught():
    # the hardest null: MMD equals tau (up to delta), so a wrong constant c would show here
    rng = np.random.default_rng(303)
    rejections = 0
    for _ in range(REPS):
        x, y = _randomized_response(1.0, STEPS, rng)
        rejections += _run(x, y, 1.0, bandwidth=0.1, max_terms=150).rejected
    assert LEVEL.passes(rejections), (rejections, str(LEVEL))
    # the same mechanism tested at half its epsilon is rejected (the test is not vacuous)
    caught = 0
    for _ in range(20):
        x, y = _randomized_response(1.0, 600, rng)
        caught += _run(x, y, 0.5, bandwidth=0.1, max_terms=150).rejected
    assert caught >= 16


# -- power ----------------------------------------------------------------------------------


def test_clear_violation_is_rejected_within_a_few_hundred_steps():
    rng = np.random.default_rng(404)
    times = []
    for _ in range(50):
        x, y = rng.normal(5.0, 1.0, 300), rng.normal(0.0, 1.0, 300)
        test = _run(x, y, 0.5)
        times.append(test.stopping_time)
    assert sum(t is not None for t in times) >= 49
    assert np.median([t for t in times if t is not None]) < 100


def test_vector_observations():
    rng = np.random.default_rng(505)
    shift = np.array([3.0, -3.0, 0.0])
    test = SequentialDPTest(0.5, DELTA)
    test.update_many(rng.normal(size=(300, 3)) + shift, rng.normal(size=(300, 3)))
    assert test.rejected
    with pytest.raises(ValueError, match="x has dimension"):
        test.update(np.zeros(2), np.zeros(3))


# -- wealth, witness and bookkeeping invariants ---------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    xs=st.lists(st.floats(-50, 50), min_size=30, max_size=120),
    shift=st.floats(-10, 10),
    eps=st.floats(0, 5),
    max_terms=st.integers(1, 40),
)
def test_wealth_positive_witness_bounded_norm_tracked(xs, shift, eps, max_terms):
    x = np.asarray(xs)
    y = x[::-1] + shift
    test = SequentialDPTest(eps, DELTA, bandwidth=1.0, max_terms=max_terms)
    for a, b in zip(x, y):
        test.update(a, b)
        assert test.wealth > 0.0
        assert 0.0 <= test.stake <= 1.0 / (2.0 * (2.0 + test.tau)) + 1e-15
    assert test.min_factor >= 0.5 - 1e-12
    assert test.witness_norm <= 1.0 + 1e-9
    grid = np.linspace(-60, 60, 241)
    assert np.all(np.abs(test.witness(grid)) <= 1.0 + 1e-9)
    # reproducing property: ||g||^2 = sum_i c_i (g(x_i) - g(y_i)), an independent route
    n = test._count
    coef = test._coef[:n]
    gx, gy = test.witness(test._px[:n]), test.witness(test._py[:n])
    assert float(coef @ (gx - gy)) == pytest.approx(test.witness_norm**2, abs=1e-8)


def test_stopping_time_is_first_crossing_and_sticky():
    rng = np.random.default_rng(606)
    alpha = 0.05
    test = SequentialDPTest(0.5, DELTA, alpha=alpha, bandwidth=1.0)
    log_wealth = []
    for a, b in zip(rng.normal(4.0, 1.0, 200), rng.normal(0.0, 1.0, 200)):
        test.update(a, b)
        log_wealth.append(test.log_wealth)
    first = next(i + 1 for i, w in enumerate(log_wealth) if w >= math.log(1 / alpha))
    assert test.stopping_time == first
    assert test.rejected  # still rejected after the wealth kept moving
    assert test.num_tested == 200


def test_calibration_pairs_are_not_tested():
    rng = np.random.default_rng(707)
    xs, ys = rng.normal(size=20), rng.normal(2.0, 1.0, size=20)
    test = SequentialDPTest(0.5, DELTA, calibration=20)
    for a, b in zip(xs, ys):
        assert test.bandwidth is None
        test.update(a, b)
    assert test.num_tested == 0 and test.log_wealth == 0.0
    pooled = np.concatenate([xs, ys])
    assert test.bandwidth == pytest.approx(
        np.median(np.abs(pooled[:, None] - pooled[None, :])[np.triu_indices(40, 1)])
    )
    test.update(0.0, 0.0)
    assert test.num_tested == 1


def test_deterministic():
    rng = np.random.default_rng(808)
    x, y = rng.normal(1.0, 1.0, 150), rng.normal(0.0, 1.0, 150)
    assert _run(x, y, 0.2).log_wealth == _run(x, y, 0.2).log_wealth


# -- input validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"epsilon": float("nan"), "delta": DELTA}, "epsilon"),
        ({"epsilon": -1.0, "delta": DELTA}, "epsilon"),
        ({"epsilon": 1.0, "delta": 0.0}, "delta"),
        ({"epsilon": 1.0, "delta": 1.0}, "delta"),
        ({"epsilon": 1.0, "delta": DELTA, "alpha": 0.0}, "alpha"),
        ({"epsilon": 1.0, "delta": DELTA, "alpha": 1.5}, "alpha"),
        ({"epsilon": 1.0, "delta": DELTA, "bandwidth": 0.0}, "bandwidth"),
        ({"epsilon": 1.0, "delta": DELTA, "bandwidth": float("inf")}, "bandwidth"),
        ({"epsilon": 1.0, "delta": DELTA, "calibration": 1}, "calibration"),
        ({"epsilon": 1.0, "delta": DELTA, "max_terms": 0}, "max_terms"),
        ({"epsilon": 1.0, "delta": DELTA, "max_terms": "many"}, "max_terms"),
        ({"epsilon": 1.0, "delta": DELTA, "calibration": 2.5}, "calibration"),
    ],
)
def test_constructor_validation_names_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SequentialDPTest(**kwargs)


def test_update_rejects_nan_and_leaves_state_unchanged():
    test = SequentialDPTest(1.0, DELTA, bandwidth=1.0)
    test.update(0.1, 0.2)
    before = test.log_wealth, test.num_tested
    with pytest.raises(ValueError, match="x must be finite"):
        test.update(float("nan"), 0.0)
    with pytest.raises(ValueError, match="y must be finite"):
        test.update(0.0, float("inf"))
    assert (test.log_wealth, test.num_tested) == before


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"xs": [0.0, float("nan")], "ys": [0.0, 1.0], "delta": DELTA}, "xs"),
        ({"xs": [0.0, 1.0], "ys": [0.0], "delta": DELTA}, "same length"),
        ({"xs": [0.0], "ys": [0.0], "delta": 2.0}, "delta"),
        ({"xs": [0.0], "ys": [0.0], "delta": DELTA, "alpha": 0.0}, "alpha"),
        ({"xs": [0.0], "ys": [0.0], "delta": DELTA, "grid": []}, "grid"),
        ({"xs": [0.0], "ys": [0.0], "delta": DELTA, "grid": [-1.0]}, "grid"),
    ],
)
def test_lower_bound_validation_names_argument(kwargs, name):
    xs, ys = kwargs.pop("xs"), kwargs.pop("ys")
    with pytest.raises(ValueError, match=name):
        sequential_epsilon_lower_bound(xs, ys, **kwargs)


# -- the epsilon lower bound over a grid ----------------------------------------------------


def test_lower_bound_is_largest_rejected_grid_value_with_bonferroni():
    rng = np.random.default_rng(909)
    x, y = _randomized_response(2.0, 800, rng)
    grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0]
    result = sequential_epsilon_lower_bound(x, y, delta=DELTA, alpha=0.05, grid=grid, bandwidth=0.1)
    assert result.estimator is Estimator.sequential
    assert result.correction is Correction.bonferroni
    assert result.confidence == pytest.approx(0.95)
    assert result.details["alpha_per_test"] == pytest.approx(0.05 / len(grid))
    singles = [_run(x, y, e, alpha=0.05 / len(grid), bandwidth=0.1).rejected for e in grid]
    expected = max((e for e, r in zip(grid, singles) if r), default=0.0)
    assert result.epsilon == expected
    assert result.details["num_rejected"] == sum(singles)
    assert 0.5 <= result.epsilon < 2.0  # finds leakage, never above the truth here
    assert result.to_dict()["estimator"] == "sequential"


def test_lower_bound_rarely_exceeds_the_truth():
    # RR is exactly eps-DP: a bound above eps_true is a family-wise error (rate <= alpha).
    # A smoke check only: 30 runs (<= 6) fail a bound above the truth in 8% of runs with
    # probability 0.01; the validity check (1400 runs, <= 96, power 0.94 against 8%) is
    # `python -m benchmarks.fidelity.sequential_validity` (a minute; docs/fidelity.md).
    rng = np.random.default_rng(1010)
    grid = [0.5, 1.0, 1.5, 2.0]
    over = 0
    for _ in range(30):
        x, y = _randomized_response(1.0, 300, rng)
        res = sequential_epsilon_lower_bound(
            x, y, delta=DELTA, grid=grid, bandwidth=0.1, max_terms=100
        )
        over += res.epsilon > 1.0
    assert over <= int(stats.binom.ppf(0.999, 30, 0.05))


def test_lower_bound_zero_without_leakage():
    rng = np.random.default_rng(1111)
    result = sequential_epsilon_lower_bound(
        rng.normal(size=300), rng.normal(size=300), delta=DELTA, grid=[0.0, 1.0]
    )
    assert result.epsilon == 0.0
    assert result.details["stopping_time"] is None


def test_simulated_canaries_fed_as_seen_unseen_pairs():
    # how docs/estimators.md feeds it: seen vs unseen canary cosines of a simulated Gaussian mechanism
    from flaudit.server.simulated_audit import gaussian_mechanism_scores

    calibrated = gaussian_sigma_for_epsilon(1.0, DELTA)
    for seed in range(5):
        for sigma, eps, should_reject in [(0.5, 0.5, True), (calibrated, 1.0, False)]:
            scores, seen = gaussian_mechanism_scores(sigma, 20000, 600, seed=seed)
            n = min(seen.sum(), (~seen).sum())
            test = SequentialDPTest(eps, DELTA)
            test.update_many(scores[seen][:n], scores[~seen][:n])
            assert test.rejected is should_reject


def test_median_bandwidth_matches_brute_force_for_vectors():
    from flaudit.auditor.estimators.sequential import median_bandwidth

    rng = np.random.default_rng(1212)
    xs, ys = rng.normal(size=(15, 4)), rng.normal(1.0, 2.0, size=(15, 4))
    pooled = np.vstack([xs, ys])
    brute = [np.linalg.norm(pooled[i] - pooled[j]) for i in range(30) for j in range(i + 1, 30)]
    assert median_bandwidth(xs, ys) == pytest.approx(np.median(brute), rel=1e-9)
    assert median_bandwidth([1.0, 1.0], [1.0]) == 1.0  # all points equal
