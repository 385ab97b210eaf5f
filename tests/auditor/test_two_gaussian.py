import math

import dp_accounting
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats

from flaudit.auditor import two_gaussian_epsilon
from flaudit.auditor.estimators import hockey_stick_divergence


def test_gaussian_mechanism_calibration_points():
    assert two_gaussian_epsilon(0.0, 4.2247, 1.0, 4.2247, 1e-6) == pytest.approx(1.000, abs=5e-4)
    assert two_gaussian_epsilon(0.0, 1.0, 1.0, 1.0, 1e-2) == pytest.approx(2.3178, abs=5e-4)


@pytest.mark.parametrize("sigma", [0.3, 0.8, 2.0, 7.5])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-9])
def test_equal_variance_matches_dp_accounting(sigma, delta):
    expected = dp_accounting.get_epsilon_gaussian(sigma, delta)
    assert two_gaussian_epsilon(0.0, sigma, 1.0, sigma, delta) == pytest.approx(
        expected, rel=1e-6, abs=1e-6
    )


def _mc_hockey_stick(mu_p, s_p, mu_q, s_q, eps, n, rng):
    """H_eps(P||Q) = E_P[(1 - e^eps q/p)_+] by Monte Carlo; returns (estimate, standard error)."""
    x = rng.normal(mu_p, s_p, n)
    log_ratio = stats.norm.logpdf(x, mu_q, s_q) - stats.norm.logpdf(x, mu_p, s_p)
    values = np.maximum(0.0, 1.0 - np.exp(eps + log_ratio))
    return values.mean(), values.std() / math.sqrt(n)


@pytest.mark.parametrize(
    "params",
    [(0.0, 1.0, 0.5, 1.5), (0.0, 1.0, 1.0, 0.6), (0.2, 0.5, -0.3, 0.55), (0.0, 1.0, 0.0, 2.0)],
)
def test_unequal_variances_match_monte_carlo_hockey_stick(params):
    rng = np.random.default_rng(1)
    mu0, s0, mu1, s1 = params
    delta = 1e-2
    eps = two_gaussian_epsilon(mu0, s0, mu1, s1, delta)
    assert 0 < eps < math.inf
    # at the returned epsilon the larger direction equals delta ...
    fwd, se_f = _mc_hockey_stick(mu0, s0, mu1, s1, eps, 400_000, rng)
    bwd, se_b = _mc_hockey_stick(mu1, s1, mu0, s0, eps, 400_000, rng)
    assert max(fwd, bwd) == pytest.approx(delta, abs=5 * max(se_f, se_b) + 1e-4)
    assert max(fwd, bwd) <= delta + 5 * max(se_f, se_b)
    # ... and the closed form of each direction agrees with quadrature
    for a, sa, b, sb in ((mu0, s0, mu1, s1), (mu1, s1, mu0, s0)):

        def integrand(x, a=a, sa=sa, b=b, sb=sb):
            return max(0.0, stats.norm.pdf(x, a, sa) - math.exp(eps) * stats.norm.pdf(x, b, sb))

        quad, _ = integrate.quad(integrand, -30, 30, points=[a, b], limit=400)
        from flaudit.auditor.estimators.two_gaussian import _log_hockey_stick

        closed = math.exp(_log_hockey_stick(a, sa, b, sb, eps))
        assert closed == pytest.approx(quad, rel=1e-4, abs=1e-10)


def test_degenerate_cases():
    assert two_gaussian_epsilon(0.3, 0.2, 0.3, 0.2, 1e-6) == 0.0
    assert two_gaussian_epsilon(0.0, 0.0, 1.0, 0.0, 1e-6) == math.inf
    assert two_gaussian_epsilon(0.0, 0.0, 0.0, 1.0, 1e-6) == math.inf
    assert two_gaussian_epsilon(0.0, 0.0, 0.0, 0.0, 1e-6) == 0.0
    # already within delta at epsilon 0
    assert two_gaussian_epsilon(0.0, 1.0, 1e-9, 1.0, 1e-3) == 0.0
    # extreme separation stays finite and large, never NaN
    eps = two_gaussian_epsilon(0.0, 1.0, 60.0, 1.0, 1e-6)
    assert 1000 < eps < math.inf


@pytest.mark.parametrize(
    "args,name",
    [
        ((math.nan, 1, 0, 1, 1e-6), "mu0"),
        ((0, 1, math.inf, 1, 1e-6), "mu1"),
        ((0, -1, 0, 1, 1e-6), "sigma0"),
        ((0, 1, 0, math.nan, 1e-6), "sigma1"),
        ((0, 1, 1, 1, 0.0), "delta"),
        ((0, 1, 1, 1, 1.0), "delta"),
    ],
)
def test_bad_input_names_argument(args, name):
    with pytest.raises(ValueError, match=name):
        two_gaussian_epsilon(*args)


means = st.floats(-3, 3)
sds = st.floats(0.05, 5)
deltas = st.floats(1e-9, 0.2)


@settings(max_examples=60, deadline=None)
@given(means, sds, means, sds, deltas)
def test_symmetric_in_the_two_distributions(m0, s0, m1, s1, delta):
    a = two_gaussian_epsilon(m0, s0, m1, s1, delta)
    b = two_gaussian_epsilon(m1, s1, m0, s0, delta)
    assert a == pytest.approx(b, rel=1e-6, abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(means, sds, means, sds, deltas, st.floats(-5, 5), st.floats(0.1, 10))
def test_invariant_under_common_affine_map(m0, s0, m1, s1, delta, shift, scale):
    a = two_gaussian_epsilon(m0, s0, m1, s1, delta)
    b = two_gaussian_epsilon(shift + scale * m0, scale * s0, shift + scale * m1, scale * s1, delta)
    assert a == pytest.approx(b, rel=1e-5, abs=1e-5)


@settings(max_examples=60, deadline=None)
@given(sds, st.floats(0.01, 3), st.floats(0.01, 3), deltas, st.floats(0.5, 2))
def test_monotone_in_separation_and_delta(sigma, gap_a, gap_b, delta, ratio):
    lo_gap, hi_gap = sorted((gap_a, gap_b))
    s1 = sigma * ratio
    assert (
        two_gaussian_epsilon(0, sigma, lo_gap, s1, delta)
        <= two_gaussian_epsilon(0, sigma, hi_gap, s1, delta) + 1e-6
    )
    assert (
        two_gaussian_epsilon(0, sigma, hi_gap, s1, delta)
        >= two_gaussian_epsilon(0, sigma, hi_gap, s1, min(0.5, delta * 10)) - 1e-6
    )


@settings(max_examples=40, deadline=None)
@given(means, sds, means, sds, deltas)
def test_returned_epsilon_attains_delta(m0, s0, m1, s1, delta):
    eps = two_gaussian_epsilon(m0, s0, m1, s1, delta)
    if eps == 0.0 or math.isinf(eps):
        return
    assert hockey_stick_divergence(m0, s0, m1, s1, eps) == pytest.approx(delta, rel=1e-5)
    assert hockey_stick_divergence(m0, s0, m1, s1, eps * 0.99) > delta


@pytest.mark.parametrize("mu1, sigma1", [(0.0, 1e-160), (0.0, 1e160), (1e200, 1.0), (1.0, 1e-120)])
def test_extreme_scale_ratios_are_infinite_not_overflow(mu1, sigma1):
    # found by the summarize property test: squaring 1/sigma overflowed
    assert two_gaussian_epsilon(0.0, 1.0, mu1, sigma1, 1e-6) == math.inf
