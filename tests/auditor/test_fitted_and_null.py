import math

import numpy as np
import pytest
from scipy import integrate, stats

from auditor.estimators import (
    all_iterates_estimate,
    final_model_epsilon,
    final_model_estimates,
    gaussian_sigma_for_epsilon,
    null_cdf,
    null_logsf,
    null_pdf,
    null_sf,
)
from auditor.results import VarianceTreatment


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
    assert integrate.quad(lambda t: t * t * null_pdf(t, d), -1, 1)[0] == pytest.approx(1 / d, rel=1e-6)
    assert null_sf(0.0, d) == pytest.approx(0.5)


def test_final_model_estimate_recovers_the_calibrated_epsilon():
    rng = np.random.default_rng(0)
    d = 10**6
    for eps in (1.0, 3.0):
        sigma = gaussian_sigma_for_epsilon(eps, 1e-6)
        seen = rng.normal(1 / (sigma * math.sqrt(d)), 1 / math.sqrt(d), 20000)
        null_var, fitted = final_model_estimates(seen, d, 1e-6)
        assert null_var.variance is VarianceTreatment.null and fitted.variance is VarianceTreatment.fitted
        assert null_var.epsilon == pytest.approx(eps, abs=0.12)
        assert fitted.epsilon == pytest.approx(eps, abs=0.4)
        assert null_var.details["null"] == "gaussian"


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
    from auditor.estimators.null import null_probit

    rng = np.random.default_rng(d)
    cos = _sphere_cosines(d, 4000, rng)
    y = null_probit(cos, d)
    assert stats.kstest(y, "norm").pvalue > 1e-3
    assert np.all(np.diff(null_probit(np.linspace(-1, 1, 101), d)) > 0)  # monotone, finite at +-1
    # unseen-like "seen" cosines (no leakage) give a small estimate even at tiny d
    assert final_model_epsilon(cos[:500], d, 1e-6).epsilon < 0.6
