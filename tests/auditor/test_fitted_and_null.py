import math

import numpy as np
import pytest
from scipy import integrate, stats

from flaudit.auditor.estimators import (
    all_iterates_estimate,
    final_model_epsilon,
    final_model_estimates,
    gaussian_sigma_for_epsilon,
    null_cdf,
    null_logsf,
    null_pdf,
    null_sf,
)
from flaudit.auditor.estimators.two_gaussian import two_gaussian_epsilon
from flaudit.auditor.results import VarianceTreatment


def _sphere_cosines(d, n, rng):
    z = rng.standard_normal((n, d))
    return z[:, 0] / np.linalg.norm(z, axis=1)


@pytest.mark.parametrize("d", [3, 10, 50])
def test_exact_null_matches_simulated_cosines(d):
    rng = np.random.default_rng(d)
    cos = _sphere_cosines(d, 20000, rng)
    assert stats.kstest(cos, lambda t: null_cdf(t, d)).pvalue > 1e-3
    # density integrates to 1 with variance exactly 1/d
    assert integrate.quad(lambda t: null_pdf(t, d), -1, 1)[0] == pytest.approx(1, abs=1e-8)
    assert integrate.quad(lambda t: t * t * null_pdf(t, d), -1, 1)[0] == pytest.approx(
        1 / d, rel=1e-6
    )
    assert null_sf(0.0, d) == pytest.approx(0.5)


def test_final_model_estimate_recovers_the_calibrated_epsilon():
    """40 replicates of 20000 seen cosines: the replicates' mean is within 4 of its standard
    errors (the Monte-Carlo spread) of its reference. Null variance: the true epsilon (the
    estimate is epsilon(mu_hat sqrt(d)), mu_hat unbiased). Fitted variance: the true epsilon plus
    the plug-in bias a fitted standard deviation brings at delta = 1e-6 (E over the chi law of
    sigma_hat of the two-Gaussian epsilon at the true mean; about +0.1 here)."""
    rng = np.random.default_rng(0)
    d, n, reps, delta = 10**6, 20000, 40, 1e-6
    null_sd = 1 / math.sqrt(d)
    for eps in (1.0, 3.0):
        sigma = gaussian_sigma_for_epsilon(eps, delta)
        mu = 1 / (sigma * math.sqrt(d))
        seen = rng.normal(mu, null_sd, (reps, n))
        pairs = [final_model_estimates(row, d, delta) for row in seen]
        null_var, fitted = pairs[0]
        assert (
            null_var.variance is VarianceTreatment.null
            and fitted.variance is VarianceTreatment.fitted
        )
        assert null_var.details["null"] == "gaussian"
        sd_hat = null_sd * np.sqrt(stats.chi2.ppf((np.arange(200) + 0.5) / 200, n - 1) / (n - 1))
        fitted_ref = eps + np.mean(
            [two_gaussian_epsilon(0.0, null_sd, mu, s, delta) - eps for s in sd_hat]
        )
        for values, ref in (
            ([a.epsilon for a, _ in pairs], eps),
            ([b.epsilon for _, b in pairs], fitted_ref),
        ):
            values = np.asarray(values)
            se = values.std(ddof=1) / math.sqrt(reps)
            assert abs(values.mean() - ref) <= 4 * se, (eps, values.mean(), ref, se)


def test_exact_null_below_1000_is_continuous_with_the_gaussian_null():
    rng = np.random.default_rng(1)
    z = rng.standard_normal(3000)
    results = {}
    for d in (999, 1000):
        seen = (z + 1 / 1.54) / math.sqrt(d)
        results[d] = final_model_epsilon(seen, d, 1e-6)
    assert results[999].details["null"] == "exact" and results[1000].details["null"] == "gaussian"
    assert results[999].epsilon == pytest.approx(results[1000].epsilon, abs=0.02)


def test_small_dimension_never_nan():
    for seen in ([0.0, 0.0], [0.1, 0.3, 0.2], [-0.9, 0.95]):
        for v in ("null", "fitted"):
            r = final_model_epsilon(seen, 5, 1e-6, variance=v)
            assert r.epsilon >= 0 and not math.isnan(r.epsilon)


def test_all_iterates_estimate():
    rng = np.random.default_rng(2)
    same = all_iterates_estimate(rng.normal(3, 1, 5000), rng.normal(3, 1, 5000), 1e-6)
    assert same.epsilon < 0.5
    shifted = all_iterates_estimate(rng.normal(4, 1, 5000), rng.normal(3, 1, 5000), 1e-6)
    assert 3.5 < shifted.epsilon < 5.5  # sigma = 1 Gaussian mechanism at delta=1e-6 is ~4.4
    assert shifted.threat_model == "all_iterates"


def test_bad_input():
    with pytest.raises(ValueError, match="seen"):
        final_model_epsilon([0.1], 100, 1e-6)
    with pytest.raises(ValueError, match="d must"):
        final_model_epsilon([0.1, 0.2], 1, 1e-6)
    with pytest.raises(ValueError, match="variance"):
        final_model_epsilon([0.1, 0.2], 10, 1e-6, variance="n/a")
    with pytest.raises(ValueError, match="unseen"):
        all_iterates_estimate([0.1, 0.2], [0.1], 1e-6)


def test_null_log_tail_is_finite_and_continuous_far_out():
    from scipy import special

    d = 10**6
    t = np.linspace(0.02, 0.2, 200)
    logsf = null_logsf(t, d)
    assert np.all(np.isfinite(logsf)) and np.all(np.diff(logsf) < 0)
    # where betaincc is still representable, it agrees with the value we return
    a = (d - 1) / 2
    ok = special.betaincc(a, a, (t + 1) / 2) > 1e-280  # the switch point
    assert ok.any() and (~ok).any()
    assert np.allclose(logsf[ok], np.log(special.betaincc(a, a, (t[ok] + 1) / 2)), rtol=1e-9)
    # no jump at the switch to the asymptotic tail
    i = int(np.argmin(ok)) - 1
    assert abs((logsf[i + 1] - logsf[i]) - (logsf[i] - logsf[i - 1])) < 1.0


@pytest.mark.parametrize("d", [4, 30, 600])
def test_probit_map_makes_the_exact_null_standard_normal_and_no_leak_small(d):
    from flaudit.auditor.estimators.null import null_probit

    rng = np.random.default_rng(d)
    cos = _sphere_cosines(d, 4000, rng)
    y = null_probit(cos, d)
    assert stats.kstest(y, "norm").pvalue > 1e-3
    assert np.all(np.diff(null_probit(np.linspace(-1, 1, 101), d)) > 0)  # monotone, finite at +-1
    # unseen-like "seen" cosines (no leakage) give a small estimate even at tiny d
    assert final_model_epsilon(cos[:500], d, 1e-6).epsilon < 0.6


# -- all iterates: the max-of-T null map ---------------------------------------------------


@pytest.mark.parametrize("d", [30, 5000])
def test_max_null_probit_makes_the_maximum_of_null_cosines_standard_normal(d):
    """Monte Carlo: the maximum over T rounds of exact null cosines maps to N(0, 1)."""
    from scipy import stats

    from flaudit.auditor.estimators.fitted import max_null_probit
    from flaudit.server.simulated_audit import sample_null_cosines

    rng = np.random.default_rng(7)
    rounds = 40
    maxima = sample_null_cosines(d, 4000 * rounds, rng=rng).reshape(4000, rounds).max(axis=1)
    y = max_null_probit(maxima, d, rounds)
    assert stats.kstest(y, "norm").pvalue > 1e-3
    assert abs(np.mean(y)) < 0.1 and abs(np.std(y) - 1) < 0.05
    # monotone and finite far in both tails
    grid = np.linspace(-0.99, 0.99, 401)
    mapped = max_null_probit(grid, d, rounds)
    assert np.all(np.isfinite(mapped)) and np.all(np.diff(mapped) > 0)


@pytest.mark.parametrize("mu", [3.0, 10.0, 20.0])
def test_mapped_all_iterates_estimate_is_near_and_below_the_known_round_epsilon(mu):
    """A seen canary shifts one of T null rounds by mu/sqrt(d) (the Gaussian mechanism at
    sigma = 1/mu in that round); the max statistic cannot beat knowing the round, so its
    estimate should sit below that epsilon, and near it. The raw Gaussian fit to the maxima
    (the paper's literal recipe) overshoots it."""
    from flaudit.auditor.estimators import gaussian_epsilon_for_sigma

    d, rounds, k = 100_000, 50, 1000
    rng = np.random.default_rng(1)
    unseen = rng.standard_normal((k, rounds)).max(axis=1) / math.sqrt(d)
    seen = np.maximum(
        rng.standard_normal(k) + mu, rng.standard_normal((k, rounds - 1)).max(axis=1)
    ) / math.sqrt(d)
    truth = gaussian_epsilon_for_sigma(1 / mu, 1e-5)
    mapped = all_iterates_estimate(seen, unseen, 1e-5, num_rounds=rounds, d=d)
    raw = all_iterates_estimate(seen, unseen, 1e-5)
    assert 0.6 * truth < mapped.epsilon < 1.05 * truth
    assert raw.epsilon > 1.5 * truth
    assert "F_null^T" in mapped.method and mapped.details["scale"] == "max-of-50 null probit"
