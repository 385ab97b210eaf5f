"""The record-level claim test (issue #37): the step weights against torch.optim.SGD's own
update, the claimed signal in closed form, the unconditional seen-score law against the
binomial mixture and Monte Carlo, the refusals, and the test's size on correct simulated runs
(one Monte-Carlo validity check, its runs and binomial limit stated)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import special

from benchmarks.fidelity._common import binomial_limit
from benchmarks.fidelity.record_level import Setting, claim_test, simulate_run
from flaudit.auditor.claims.record_level import (
    record_level_claim_test,
    record_level_rounds,
    record_noise_multiplier_hi,
)
from flaudit.auditor.estimators.record_claim import (
    UnsupportedRecordClaimError,
    record_level_claimed_mu,
    record_level_signals,
    record_seen_score_sf,
    record_step_weights,
)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"momentum": 0.9},
        {"momentum": 0.9, "dampening": 0.3},
        {"momentum": 0.5, "nesterov": True},
        {"momentum": 0.9, "weight_decay": 0.01},
        {"weight_decay": 0.05},
    ],
)
def test_step_weights_are_torch_sgds_own_response_to_each_steps_gradient(kwargs):
    """Feed torch.optim.SGD a unit gradient at one step (zero elsewhere, theta_0 = 0): the
    parameter's final value is -lr * w_s."""
    steps, lr = 7, 0.1
    w = record_step_weights(steps, lr=lr, **kwargs)
    for s in range(steps):
        p = torch.zeros(1, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.SGD([p], lr=lr, **kwargs)
        for t in range(steps):
            p.grad = torch.tensor([1.0 if t == s else 0.0], dtype=torch.float64)
            opt.step()
        assert -p.item() / lr == pytest.approx(w[s], rel=1e-12, abs=1e-12)


def test_claimed_mu_closed_forms():
    z, T = 1.5, 16
    # plain SGD: lam = |S| / (z sqrt(T)); at |S| = T it is the mechanism's sqrt(T)/z
    assert record_level_claimed_mu(z, [0, 5, 9], T) == pytest.approx(3 / (z * 4))
    assert record_level_claimed_mu(z, range(T), T) == pytest.approx(math.sqrt(T) / z)
    assert record_level_claimed_mu(z, [], T) == 0.0
    # momentum: w_t = (1 - b^(T-t)) / (1 - b)
    b = 0.9
    w = (1 - b ** (T - np.arange(T))) / (1 - b)
    got = record_level_claimed_mu(z, [2, 3], T, momentum=b)
    assert got == pytest.approx((w[2] + w[3]) / (z * np.linalg.norm(w)), rel=1e-12)
    # never above the mechanism's GDP towards a canary whose steps are known (Cauchy-Schwarz)
    rng = np.random.default_rng(0)
    for _ in range(50):
        steps = np.flatnonzero(rng.random(T) < 0.3)
        for kw in ({}, {"momentum": 0.9}, {"momentum": 0.5, "nesterov": True}):
            assert record_level_claimed_mu(z, steps, T, **kw) <= math.sqrt(steps.size) / z + 1e-12
    inc = rng.random((5, T)) < 0.3
    np.testing.assert_allclose(
        record_level_signals(z, inc, momentum=b),
        [record_level_claimed_mu(z, np.flatnonzero(r), T, momentum=b) for r in inc],
        rtol=1e-12,
    )


def test_unsupported_optimizers_and_clipping_are_refused_naming_what_is_supported():
    for optimizer in ("adam", "adamw", "rmsprop"):
        with pytest.raises(UnsupportedRecordClaimError, match="torch.optim.SGD") as info:
            record_level_claimed_mu(1.0, [0], 4, optimizer=optimizer)
        assert optimizer in str(info.value)
    for clipping in ("per_layer", "ghost", "adaptive"):
        with pytest.raises(UnsupportedRecordClaimError, match="flat per-example clipping"):
            record_level_signals(1.0, np.ones((2, 4), bool), clipping=clipping)
    with pytest.raises(ValueError, match="noise_multiplier must be > 0"):
        record_level_claimed_mu(0.0, [0], 4)
    with pytest.raises(ValueError, match="included steps"):
        record_level_claimed_mu(1.0, [4], 4)
    with pytest.raises(ValueError, match="nesterov"):
        record_step_weights(4, nesterov=True)


def test_seen_score_law_is_the_binomial_mixture_and_matches_monte_carlo():
    z, q, T = 0.8, 0.1, 20
    x = np.linspace(-3, 6, 19)
    a = 1 / (z * math.sqrt(T))
    k = np.arange(T + 1)
    pmf = special.comb(T, k) * q**k * (1 - q) ** (T - k)
    expected = special.ndtr(k[None, :] * a - x[:, None]) @ pmf
    np.testing.assert_allclose(record_seen_score_sf(x, z, q, T), expected, atol=1e-12)
    # momentum: Gil-Pelaez inversion against 400 000 draws (4.5 binomial SDs)
    rng = np.random.default_rng(7)
    b = 0.9
    w = record_step_weights(T, momentum=b)
    draws = rng.standard_normal(400_000) + (rng.random((400_000, T)) < q) @ (
        w / (z * np.linalg.norm(w))
    )
    got = record_seen_score_sf(x, z, q, T, momentum=b)
    mc = (draws[None, :] > x[:, None]).mean(axis=1)
    assert np.all(np.abs(got - mc) <= 4.5 * np.sqrt(got * (1 - got) / draws.size) + 1e-6)
    # and the inversion agrees with the binomial form where the weights are (nearly) equal
    np.testing.assert_allclose(record_seen_score_sf(x, z, q, T, momentum=1e-9), expected, atol=1e-8)


def test_the_test_is_the_exact_linear_test_with_a_known_scale():
    """dof = inf: the statistic is sum_r (R_r - ||lam_r||) / sqrt(n), R_r = lam.t / ||lam||."""
    rng = np.random.default_rng(3)
    z = 1.2
    lams = [np.abs(rng.normal(0.3, 0.2, 30)) * (rng.random(30) < 0.7) for _ in range(5)]
    scores = [lam + rng.standard_normal(lam.size) for lam in lams]
    test = record_level_claim_test(scores, lams, noise_multiplier=z, dof=math.inf)
    r = [float(lam @ t) / np.linalg.norm(lam) - np.linalg.norm(lam) for lam, t in zip(lams, scores)]
    assert test.z == pytest.approx(sum(r) / math.sqrt(len(r)), rel=1e-12)
    assert test.p_value == pytest.approx(special.ndtr(-test.z), rel=1e-12)
    # mu_lo inverts it in the per-inclusion signal; 1 / mu_lo bounds the noise multiplier
    lo = test.mu_lo(0.05)
    at = record_level_claim_test(
        scores, [lam * lo * z for lam in lams], noise_multiplier=z, dof=math.inf
    )
    assert at.z == pytest.approx(special.ndtri(0.95), abs=1e-6)
    assert record_noise_multiplier_hi(test, 0.05) == pytest.approx(1 / lo)
    # a release with nothing included is left out; canaries with lam = 0 carry no weight
    rounds = record_level_rounds(
        [np.array([5.0, 1.0]), np.array([9.0])],
        [np.array([0.0, 0.5]), np.zeros(1)],
        noise_multiplier=z,
        dof=math.inf,
    )
    assert rounds.sums.tolist() == [1.0] and rounds.weights.tolist() == pytest.approx([0.5 * z])
    with pytest.raises(ValueError, match="NaN"):
        record_level_rounds([np.array([np.nan])], [np.array([0.5])], noise_multiplier=z, dof=10.0)


#: 1400 seeded correct runs: count <= 96. A correct 5% procedure fails this with probability
#: 9.7e-4, one whose true rate is 8% with probability 0.94 (binomial_limit).
VALIDITY = binomial_limit(1400, 0.05, false_fail=1e-3, against=0.08)


def test_the_validity_check_is_designed_to_catch_an_8_percent_procedure():
    assert VALIDITY.false_fail <= 1e-3 and VALIDITY.power >= 0.9, str(VALIDITY)


@pytest.mark.timeout(240)
def test_correct_dp_sgd_runs_are_refuted_at_most_at_the_level_and_half_noise_is_caught():
    """Simulated correct runs (momentum 0.9, Poisson q = 0.1, T = 10, 3 releases of 60
    canaries, d = 1500, studentized on the d - k coordinates outside the canaries as the
    orthogonal family does, then the shipped scoring): the claim is rejected at 5%
    in at most VALIDITY.limit of VALIDITY.runs runs; with the noise halved in 40 runs, in all."""
    setting = Setting(
        dim=1500,
        canaries=60,
        steps=10,
        sample_rate=0.1,
        momentum=0.9,
        releases=3,
        studentize="exact",
    )
    rng = np.random.default_rng(20261206)
    rejections = sum(
        claim_test(setting, simulate_run(rng, setting))[0].p_value < 0.05
        for _ in range(VALIDITY.runs)
    )
    assert VALIDITY.passes(rejections), (rejections, str(VALIDITY))
    caught = sum(
        claim_test(setting, simulate_run(rng, setting, noise_scale=0.5))[0].p_value < 0.05
        for _ in range(40)
    )
    assert caught == 40
