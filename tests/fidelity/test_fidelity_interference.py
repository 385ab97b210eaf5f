"""Interference between canaries: bias grows with k/d, as the effective-noise formula predicts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flaudit.auditor.claims.gaussian import gaussian_mechanism_cosines
from flaudit.auditor.estimators import final_model_epsilon
from flaudit.auditor.estimators.analytic import (
    gaussian_epsilon_for_sigma,
    gaussian_sigma_for_epsilon,
)
from flaudit.auditor.estimators.interference import effective_noise_multiplier, interference_warning

DELTA = 1e-5


def _mean_estimate(sigma, d, k, reps, seed, family="gaussian"):
    return float(
        np.mean(
            [
                final_model_epsilon(
                    gaussian_mechanism_cosines(sigma, d, k, seed=seed + r, family=family), d, DELTA
                ).epsilon
                for r in range(reps)
            ]
        )
    )


def test_bias_grows_with_k_over_d_and_matches_effective_noise():
    sigma = gaussian_sigma_for_epsilon(30.0, DELTA)
    d = 5000
    estimates = {k: _mean_estimate(sigma, d, k, 6, 100 * k) for k in (25, 150, 500)}  # 0.5%..10%
    assert estimates[25] > estimates[150] > estimates[500]
    for k, value in estimates.items():
        predicted = gaussian_epsilon_for_sigma(
            effective_noise_multiplier(k, d, noise_multiplier=sigma), DELTA
        )
        assert value == pytest.approx(predicted, rel=0.1), k
    assert estimates[500] < 0.6 * 30.0  # strongly biased at k/d = 10%, low noise


@pytest.mark.parametrize("k", [150, 500, 2500])  # k/d = 3%, 10%, 50%
def test_orthogonal_canaries_do_not_interfere(k):
    sigma = gaussian_sigma_for_epsilon(30.0, DELTA)
    d = 5000
    estimate = _mean_estimate(sigma, d, k, 6, 100 * k, family="orthogonal")
    assert estimate == pytest.approx(30.0, rel=0.05)
    assert effective_noise_multiplier(k, d, noise_multiplier=sigma, family="orthogonal") == sigma
    assert interference_warning(k, d, noise_multiplier=sigma, family="orthogonal") is None


def test_warning_thresholds():
    assert interference_warning(10, 100_000) is None
    msg = interference_warning(2_000, 100_000)
    assert msg is not None and "k/d = 2.00%" in msg
    assert interference_warning(1000, 1_000_000, noise_multiplier=1.0) is None
    assert interference_warning(1000, 10_000, noise_multiplier=0.2) is not None
    assert "no noise" in interference_warning(1000, 100_000, noise_multiplier=0.0)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_canaries": -1, "dim": 10}, "num_canaries"),
        ({"num_canaries": 5, "dim": 1}, "dim"),
        ({"num_canaries": 5, "dim": 10, "noise_multiplier": -0.1}, "noise_multiplier"),
        ({"num_canaries": 5, "dim": 10, "ratio_threshold": 0.0}, "ratio_threshold"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, name):
    with pytest.raises(ValueError, match=name):
        interference_warning(**kwargs)


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(0, 10**6),
    extra=st.integers(1, 10**5),
    d=st.integers(2, 10**7),
    z=st.one_of(st.none(), st.floats(0.0, 20.0)),
)
def test_warning_is_monotone_in_the_number_of_canaries(k, extra, d, z):
    if interference_warning(k, d, noise_multiplier=z) is not None:
        assert interference_warning(k + extra, d, noise_multiplier=z) is not None


@given(k=st.integers(0, 10**6), d=st.integers(2, 10**7), z=st.floats(0.0, 20.0))
def test_effective_noise_is_at_least_the_configured_noise(k, d, z):
    z_eff = effective_noise_multiplier(k, d, noise_multiplier=z)
    assert z_eff >= z
    assert z_eff == pytest.approx(math.hypot(z, math.sqrt(k / d)))
