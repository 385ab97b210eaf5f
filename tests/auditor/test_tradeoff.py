"""The f-DP picture (auditor/claims/tradeoff.py): invariants, the closed form of the claimed
curve, and the band's coverage by Monte Carlo."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from benchmarks.fidelity._common import binomial_limit
from flaudit.auditor.claims.tradeoff import empirical_tradeoff, gdp_tradeoff, tradeoff_picture

scores = st.lists(st.floats(-6, 6, allow_nan=False), min_size=1, max_size=60)


def _non_increasing(values) -> bool:
    v = np.asarray(values)
    return bool(np.all(np.diff(v) <= 1e-12))


@settings(max_examples=60, deadline=None)
@given(seen=scores, unseen=st.one_of(st.none(), scores), mu=st.floats(0, 5), mu_lo=st.floats(0, 5))
def test_curves_are_monotone_and_the_band_lies_under_the_estimate(seen, unseen, mu, mu_lo):
    p = tradeoff_picture(seen, unseen_z=unseen, claim_mu=mu, mu_lo=mu_lo, num_points=41)
    for key in ("claim", "empirical", "band", "mu_lo"):
        assert _non_increasing(p[key]), key
        assert all(0.0 <= b <= 1.0 for b in p[key]), key
    assert all(b <= e + 1e-12 for b, e in zip(p["band"], p["empirical"]))
    assert p["num_seen"] == len(seen)


@pytest.mark.parametrize("mu", [0.0, 0.5, 1.0, 3.0])
def test_claim_curve_is_the_gaussian_trade_off(mu):
    p = tradeoff_picture(None, claim_mu=mu, mu_lo=None, num_points=11)
    alpha = np.asarray(p["alpha"])
    # independent route: the FNR of the best test of N(0,1) vs N(mu,1) at FPR alpha
    expected = stats.norm.cdf(stats.norm.ppf(1 - alpha), loc=mu)
    np.testing.assert_allclose(p["claim"], expected, atol=1e-12)
    if mu == 0.0:
        np.testing.assert_allclose(p["claim"], 1 - alpha, atol=1e-12)  # no separation at all
    assert p["empirical"] is None and p["band"] is None and p["mu_lo"] is None


def test_no_claim_and_no_bound_give_no_curves():
    p = tradeoff_picture([0.1, 0.2], claim_mu=None, mu_lo=float("inf"))
    assert p["claim"] is None and p["mu_lo"] is None and p["empirical"] is not None


def test_empirical_curve_is_one_minus_the_seen_survival_at_the_null_quantile():
    rng = np.random.default_rng(0)
    seen = rng.normal(1.0, 1.0, 5000)
    alpha = np.linspace(0.01, 0.99, 50)
    beta = empirical_tradeoff(alpha, seen)
    np.testing.assert_allclose(beta, gdp_tradeoff(alpha, 1.0), atol=0.03)
    # the unseen canaries as the null give nearly the same curve
    beta_u = empirical_tradeoff(alpha, seen, rng.normal(0.0, 1.0, 5000))
    np.testing.assert_allclose(beta_u, beta, atol=0.04)


@pytest.mark.parametrize("with_unseen", [False, True])
def test_band_covers_the_true_curve_at_every_alpha_at_once(with_unseen):
    # 1400 runs, at most 96 crossing: a band with 95% simultaneous coverage fails this with
    # probability 9.7e-4, one crossing in 8% of runs with probability 0.94 (binomial_limit)
    check = binomial_limit(1400, 0.05, false_fail=1e-3, against=0.08)
    assert check.power >= 0.9, str(check)
    rng = np.random.default_rng(1)
    mu, n, trials, misses = 1.5, 200, check.runs, 0
    for _ in range(trials):
        seen = rng.normal(mu, 1.0, n)
        unseen = rng.normal(0.0, 1.0, n) if with_unseen else None
        p = tradeoff_picture(seen, unseen_z=unseen, claim_mu=mu, mu_lo=None, num_points=101)
        misses += any(b > c + 1e-12 for b, c in zip(p["band"], p["claim"]))
    assert check.passes(misses), (misses, str(check))


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="confidence"):
        tradeoff_picture([0.0], claim_mu=1.0, mu_lo=None, confidence=1.0)
    with pytest.raises(ValueError, match="num_points"):
        tradeoff_picture([0.0], claim_mu=1.0, mu_lo=None, num_points=1)


def test_band_is_no_looser_than_its_dkw_margin():
    from flaudit.auditor.claims.tradeoff import dkw_margin

    rng = np.random.default_rng(2)
    p = tradeoff_picture(rng.normal(1, 1, 400), claim_mu=1.0, mu_lo=0.5)
    gap = np.asarray(p["empirical"]) - np.asarray(p["band"])
    assert gap.max() <= dkw_margin(400, 0.05) + 1e-12 and gap.max() > 0


def test_the_picture_says_what_its_band_assumes():
    picture = tradeoff_picture(
        np.random.default_rng(3).normal(1.0, 1.0, 200), claim_mu=1.0, mu_lo=0.5
    )
    assert "independent scores" in picture["band_assumes"]
    assert "not a test" in picture["band_assumes"]
