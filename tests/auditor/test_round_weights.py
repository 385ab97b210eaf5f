"""Issue #38 (c): a weighted FedAvg whose heaviest client appears late. Testing every round at
the running maximum weight W loses power; testing round t at its own weight W_t
(``RoundSums.with_weights(W_t / W)`` with the claim at W) keeps the level exact and recovers it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from flaudit.auditor.claims import NormalScoreTest, RoundSums, normal_score_test

Z, C, T = 1.0, 4, 20
#: the late-heavy ramp: weight factor 1 for 16 rounds, then 2
RAMP = np.array([1.0] * 16 + [2.0] * 4)


def _sums(rng, reps, noise_scale, dof=math.inf):
    """(reps, T) per-round sums: c seen participants of signal W_t / (z s) each."""
    delta = math.sqrt(C) * RAMP / (Z * noise_scale)
    if math.isinf(dof):
        return delta + rng.standard_normal((reps, T))
    return (delta + rng.standard_normal((reps, T))) / np.sqrt(rng.chisquare(dof, (reps, T)) / dof)


def _rejects(sums, *, own_weight, dof=math.inf, alpha=0.05):
    heaviest = RAMP.max()
    out = []
    for row in sums:
        rounds = RoundSums(row, np.full(T, C), dof)
        if own_weight:
            rounds = rounds.with_weights(RAMP / heaviest)
        out.append(normal_score_test(rounds, claim_mu=heaviest / Z).p_value <= alpha)
    return float(np.mean(out))


def test_own_weights_keep_the_level_exact():
    rng = np.random.default_rng(38)
    rate = _rejects(_sums(rng, 4000, 1.0), own_weight=True)
    assert abs(rate - 0.05) < 3 * math.sqrt(0.05 * 0.95 / 4000)


def test_own_weights_keep_the_level_exact_with_an_estimated_scale():
    rng = np.random.default_rng(39)
    rate = _rejects(_sums(rng, 600, 1.0, dof=50), own_weight=True, dof=50)
    assert abs(rate - 0.05) < 3.5 * math.sqrt(0.05 * 0.95 / 600)


def test_own_weights_recover_the_power_the_running_maximum_loses():
    rng = np.random.default_rng(40)
    sums = _sums(rng, 2000, 0.8)
    at_max, own = _rejects(sums, own_weight=False), _rejects(sums, own_weight=True)
    assert own > at_max + 0.2  # about 0.8 against 0.1 here
    # at the maximum the correct run is far below the level (the power went there)
    assert _rejects(_sums(rng, 2000, 1.0), own_weight=False) < 0.01


def test_weights_of_one_change_nothing_and_survive_the_details():
    rng = np.random.default_rng(41)
    row = _sums(rng, 1, 0.7)[0]
    plain = normal_score_test(RoundSums(row, np.full(T, C), math.inf), claim_mu=1.0)
    ones = normal_score_test(RoundSums(row, np.full(T, C), math.inf, np.ones(T)), claim_mu=1.0)
    assert ones.p_value == plain.p_value and ones.mu_lo(0.05) == pytest.approx(plain.mu_lo(0.05))
    weighted = normal_score_test(
        RoundSums(row, np.full(T, C), 40.0).with_weights(RAMP / 2), claim_mu=2.0
    )
    again = NormalScoreTest.from_details(weighted.to_details())
    assert (
        again.p_value == weighted.p_value and again.rounds.weights.tolist() == (RAMP / 2).tolist()
    )
    with pytest.raises(ValueError, match="weights"):
        RoundSums(row, np.full(T, C), math.inf, np.zeros(T))
