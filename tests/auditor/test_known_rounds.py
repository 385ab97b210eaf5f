"""KnownRoundsStatistic: Monte Carlo against N(sqrt(r)/z, 1) / N(0, 1) with the exact null,
the robust noise-scale diagnostic, resume from state."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flaudit.auditor.claims.known_rounds import KnownRoundsState, KnownRoundsStatistic, noise_scale


def _rounds(rng, *, k, num_rounds, repeats):
    """Rounds of every canary: ``repeats`` periods, one uniform round in each (as the schedule)."""
    bounds = np.linspace(0, num_rounds, repeats + 1).astype(int)
    rounds = np.stack(
        [rng.integers(bounds[i], bounds[i + 1], size=k) for i in range(repeats)], axis=1
    )
    part = np.zeros((num_rounds, k), dtype=bool)
    for i in range(repeats):
        part[rounds[:, i], np.arange(k)] = True
    return part


D = 20_000


def _simulate(stat, rng, *, z, seen, part):
    """Per-round cosines of DP-FedAvg projected on the canaries in dimension D: the noise
    projects as N(0, 1/D) (the cosine null), a seen participant adds 1/z noise units."""
    for t in range(part.shape[0]):
        signal = np.where(seen & part[t], 1.0 / z, 0.0)
        cos = (signal + rng.standard_normal(seen.size)) / math.sqrt(D)
        stat.update(cos, part[t], ~seen)


@pytest.mark.parametrize("z,repeats", [(1.0, 1), (2.0, 4), (0.5, 2)])
def test_scores_follow_the_gaussian_dp_law(z, repeats):
    rng = np.random.default_rng(1)
    k, num_rounds = 2000, 8
    seen = rng.random(k) < 0.5
    part = _rounds(rng, k=k, num_rounds=num_rounds, repeats=repeats)
    stat = KnownRoundsStatistic(k, dim=D)
    _simulate(stat, rng, z=z, seen=seen, part=part)
    scores = stat.scores
    assert np.all(stat.num_participations == repeats)
    mu = math.sqrt(repeats) / z
    s, u = scores[seen], scores[~seen]
    # 1000 draws: standard error of the mean 0.032, of the std ~0.023
    assert abs(s.mean() - mu) < 0.12 + 0.02 * mu
    assert abs(u.mean()) < 0.15
    assert abs(s.std() - 1) < 0.12
    assert abs(u.std() - 1) < 0.12


def test_unseen_scores_are_standard_normal_ks():
    from scipy import stats

    rng = np.random.default_rng(5)
    k = 3000
    seen = rng.random(k) < 0.5
    part = _rounds(rng, k=k, num_rounds=4, repeats=2)
    stat = KnownRoundsStatistic(k, dim=D)
    _simulate(stat, rng, z=1.0, seen=seen, part=part)
    assert stats.kstest(stat.scores[~seen], "norm").pvalue > 1e-3


def test_noise_scale_is_robust_to_a_few_outliers():
    rng = np.random.default_rng(2)
    x = 0.01 * rng.standard_normal(500)
    clean = noise_scale(x)
    assert abs(clean / 0.01 - 1) < 0.1
    dirty = x.copy()
    dirty[:5] = 1.0  # five huge cosines (e.g. mislabelled seen canaries)
    assert abs(noise_scale(dirty) / clean - 1) < 0.03
    assert np.std(dirty) > 5 * clean  # the plain std is ruined


def test_noise_scale_unbiased_monte_carlo():
    rng = np.random.default_rng(3)
    est = [noise_scale(rng.standard_normal(400)) for _ in range(300)]
    assert abs(np.mean(est) - 1) < 0.01
    assert np.isnan(noise_scale(np.array([])))
    assert noise_scale(np.zeros(10)) == 0.0


def test_resume_from_state_equals_uninterrupted():
    rng = np.random.default_rng(4)
    k, num_rounds = 300, 10
    seen = rng.random(k) < 0.5
    part = _rounds(rng, k=k, num_rounds=num_rounds, repeats=2)
    cos = rng.standard_normal((num_rounds, k)) * 0.01
    whole = KnownRoundsStatistic(k, dim=D)
    for t in range(num_rounds):
        whole.update(cos[t], part[t], ~seen)
    first = KnownRoundsStatistic(k, dim=D)
    for t in range(4):
        first.update(cos[t], part[t], ~seen)
    state = first.state()
    resumed = KnownRoundsStatistic(
        k,
        dim=D,
        state=KnownRoundsState(
            sums=list(state.sums), counts=list(state.counts), num_rounds=state.num_rounds
        ),
    )
    for t in range(4, num_rounds):
        resumed.update(cos[t], part[t], ~seen)
    np.testing.assert_array_equal(resumed.scores, whole.scores)
    np.testing.assert_array_equal(resumed.num_participations, whole.num_participations)
    assert resumed.num_rounds == whole.num_rounds == num_rounds
    state.sums[0] = 123.0  # the state is a copy
    assert first.state().sums[0] != 123.0


def test_nan_before_participation_and_bad_input_changes_nothing():
    stat = KnownRoundsStatistic(4, dim=D)
    assert np.all(np.isnan(stat.scores))
    part = np.array([True, False, False, False])
    null = np.array([False, True, True, True])
    stat.update(np.array([0.5, 0.1, -0.1, 0.05]), part, null)
    assert np.isfinite(stat.scores[0]) and np.all(np.isnan(stat.scores[1:]))
    before = stat.state()
    with pytest.raises(ValueError, match="round_cosines"):
        stat.update(np.array([np.nan, 0, 0, 0]), part, null)
    with pytest.raises(ValueError, match="participants"):
        stat.update(np.zeros(4), np.ones(3, dtype=bool), null)
    with pytest.raises(ValueError, match="null_mask"):
        stat.update(np.zeros(4), part, np.ones(4))
    after = stat.state()
    np.testing.assert_array_equal(before.sums, after.sums)
    assert before.num_rounds == after.num_rounds
    with pytest.raises(ValueError, match="num_canaries"):
        KnownRoundsStatistic(0, dim=D)
    with pytest.raises(ValueError, match="dim"):
        KnownRoundsStatistic(3, dim=1)
    with pytest.raises(ValueError, match="shape"):
        KnownRoundsStatistic(3, dim=D, state=before)


def test_no_noise_gives_huge_finite_scores_without_a_measured_scale():
    """A no-noise bug: the canary's cosine is far in the null's tail; the score is huge and
    finite, and needs no noise measured on the unseen canaries (their cosines are all 0)."""
    stat = KnownRoundsStatistic(4, dim=D)
    stat.update(
        np.array([0.5, 0.0, 0.0, 0.0]),
        np.array([True, True, False, False]),
        np.array([False, True, True, True]),
    )
    assert stat.scores[0] > 30 and np.isfinite(stat.scores[0])
    assert stat.scores[1] == 0.0
    assert stat.last_noise_scale == 0.0  # the diagnostic still reports what it measured


def test_unseen_scores_do_not_depend_on_the_noise_actually_added():
    """The null is exact: scaling the noise (a DP bug) leaves unseen scores N(0, 1) and moves
    only the seen ones."""
    rng = np.random.default_rng(6)
    k = 2000
    seen = rng.random(k) < 0.5
    part = _rounds(rng, k=k, num_rounds=1, repeats=1)
    for noise_scale_factor in (1.0, 0.5):
        stat = KnownRoundsStatistic(k, dim=D)
        signal = np.where(seen & part[0], 1.0, 0.0)
        cos = (signal / noise_scale_factor + rng.standard_normal(k)) / math.sqrt(D)
        stat.update(cos, part[0], ~seen)
        u, s = stat.scores[~seen], stat.scores[seen]
        assert abs(u.mean()) < 0.1 and abs(u.std() - 1) < 0.08
        assert abs(s.mean() - 1 / noise_scale_factor) < 0.12
