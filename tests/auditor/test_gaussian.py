import math

import numpy as np
import pytest
from scipy import stats

from flaudit.auditor import gaussian_mechanism_audit
from flaudit.auditor.claims.gaussian import gaussian_mechanism_cosines
from flaudit.auditor.estimators.gdp import gdp_epsilon


def test_projected_simulation_matches_materialised_canaries_in_distribution():
    """The O(k^2) Bartlett simulation and real d-dimensional canaries give the same law of
    (mean, std) of the cosines."""
    d, k, sigma, runs = 200, 12, 0.8, 150
    fast = np.array([gaussian_mechanism_cosines(sigma, d, k, seed=s) for s in range(runs)])
    slow = np.array(
        [
            gaussian_mechanism_cosines(sigma, d, k, seed=10_000 + s, method="canaries")
            for s in range(runs)
        ]
    )
    for stat in (lambda g: g.mean(axis=1), lambda g: g.std(axis=1), lambda g: g[:, 0]):
        assert stats.ks_2samp(stat(fast), stat(slow)).pvalue > 1e-3
    # and both agree with the theory: E[sqrt(d) mu_hat] ~ 1/sigma for k << d
    assert math.sqrt(d) * fast.mean() == pytest.approx(1 / sigma, rel=0.1)


def test_table2_setting_small_sample():
    """sigma = 1.54, d = 10^6, k = 1000 (Table 2), 40 seeded runs. The estimate is the Gaussian
    mechanism's epsilon at mu_hat sqrt(d) (closed form, gdp_epsilon), and sqrt(k) (mu_hat sqrt(d)
    - 1/sigma) is N(0, 1) up to O(k / (sigma^2 d)): its mean and its sum of squares stay within
    limits a correct simulation exceeds with probability 1e-3 each."""
    sigma, d, k, runs = 1.54, 10**6, 1000, 40
    audits = [gaussian_mechanism_audit(sigma, d, k, 1e-6, seed=s) for s in range(runs)]
    z = np.array([(r.mu_hat * math.sqrt(d) - 1 / sigma) * math.sqrt(k) for r in audits])
    assert abs(z.mean()) * math.sqrt(runs) <= stats.norm.isf(0.0005), z.mean()
    assert stats.chi2.ppf(0.0005, runs) <= np.sum(z**2) <= stats.chi2.isf(0.0005, runs), np.sum(
        z**2
    )
    for r in audits:
        assert r.analytic_epsilon == pytest.approx(3.0, abs=0.02)
        assert r.epsilon == r.epsilon_null_variance
        assert r.epsilon == pytest.approx(gdp_epsilon(r.mu_hat * math.sqrt(d), 1e-6), rel=1e-6)
        # Bonferroni over the thresholds never reports more than their uncorrected maximum
        assert r.epsilon_lo_valid <= r.epsilon_lo
        assert {e.threat_model for e in r.estimates} == {"gaussian_mechanism"}
    # the bounds' coverage (how often they exceed the truth) is tested with binomial limits in
    # tests/fidelity/test_fidelity_validity.py (1400 runs)


def test_fitted_variance_and_reproducibility():
    a = gaussian_mechanism_audit(4.22, 10**5, 200, 1e-6, seed=5, variance="fitted")
    b = gaussian_mechanism_audit(4.22, 10**5, 200, 1e-6, seed=5, variance="fitted")
    assert a.epsilon == b.epsilon == a.epsilon_fitted_variance
    assert a.to_dict()["variance"] == "fitted"
    assert "seed" not in repr(a) and "seed" not in a.to_dict()


def test_no_noise_and_k_at_least_d():
    r = gaussian_mechanism_audit(0.0, 50, 10, 1e-6, seed=1)
    assert r.analytic_epsilon == math.inf and r.epsilon > 5
    small = gaussian_mechanism_audit(1.0, 8, 10, 1e-6, seed=1)  # falls back to real canaries
    assert not math.isnan(small.epsilon)


@pytest.mark.parametrize(
    "args,kwargs,name",
    [
        ((1.0, 1, 10, 1e-6), {}, "d"),
        ((1.0, 100, 1, 1e-6), {}, "k"),
        ((-1.0, 100, 10, 1e-6), {}, "sigma"),
        ((1.0, 100, 10, 0.0), {}, "delta"),
        ((1.0, 100, 10, 1e-6), {"variance": "bogus"}, "bogus"),
        ((1.0, 100, 10, 1e-6), {"method": "bogus"}, "method"),
    ],
)
def test_bad_input(args, kwargs, name):
    with pytest.raises(ValueError, match=name):
        gaussian_mechanism_audit(*args, seed=0, **kwargs)
