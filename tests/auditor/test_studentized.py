"""The shared noise scale of one release (auditor/estimators/null.py, auditor/statistics.py,
auditor/claims/normal_scores.py): studentized canary statistics mapped to the exact cosine
null, and the claim test that stays exact although every canary of a release shares its scale.

The release is simulated in the canaries' own coordinates (an orthonormal family: ``y = R^T v``
is ``signal + N(0, 1)`` on the seen canaries' columns and ``N(0, 1)`` elsewhere), which is what
``CosineTracker`` sees after its transform (test_canary_families checks that part)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from benchmarks.fidelity._common import binomial_limit
from flaudit.auditor.claims.known_rounds import KnownRoundsState, KnownRoundsStatistic
from flaudit.auditor.claims.normal_scores import RoundSums, final_model_rounds, normal_score_test
from flaudit.auditor.estimators.null import (
    cosine_equivalent,
    null_cdf,
    null_probit,
    studentized_from_cosine,
)
from flaudit.auditor.statistics import null_standardized_cosines


@pytest.mark.parametrize("d, dof", [(1000, 600), (101, 41), (5000, math.inf)])
def test_a_studentized_null_maps_to_the_exact_cosine_null(d, dof):
    rng = np.random.default_rng(1)
    t = rng.standard_normal(20000) if math.isinf(dof) else rng.standard_t(dof, 20000)
    x = cosine_equivalent(t, dof, d)
    assert stats.kstest(x, lambda v: null_cdf(v, d)).pvalue > 0.01
    # and the normal scores of the mapped values are N(0, 1)
    z = null_probit(x, d)
    assert abs(z.mean()) < 0.03 and abs(z.std() - 1) < 0.03


@pytest.mark.parametrize(
    "d, dof", [(1000, 600), (10**6, 990_000), (10**9, 10**9 - 10**4), (50, 3), (1000, math.inf)]
)
def test_the_map_is_inverted_to_full_precision_from_the_centre_to_far_tails(d, dof):
    t = np.array([-60.0, -8, -3, -1e-6, 0.0, 1e-9, 0.3, 2, 7.5, 40, 120])
    if math.isinf(dof):
        t = t[np.abs(t) < 100]  # beyond, a normal tail lies past the cosine null's support
    back = studentized_from_cosine(cosine_equivalent(t, dof, d), dof, d)
    np.testing.assert_allclose(back, t, rtol=1e-7, atol=1e-12)
    # probabilities agree where scipy can compute them
    moderate = np.abs(t) < 8
    law = stats.norm if math.isinf(dof) else stats.t(dof)
    np.testing.assert_allclose(
        null_cdf(cosine_equivalent(t[moderate], dof, d), d), law.cdf(t[moderate]), atol=1e-12
    )


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-300, 300, allow_nan=False), min_size=2, max_size=20),
    st.integers(2, 5000),
    st.integers(1, 10**6),
)
def test_the_map_is_monotone_and_odd(values, d, dof):
    t = np.sort(np.array(values))
    x = cosine_equivalent(t, dof, d)
    assert np.all(np.diff(x) >= 0) and np.all(np.abs(x) <= 1)
    np.testing.assert_array_equal(cosine_equivalent(-t, dof, d), -x)


def _release(rng, d, k, seen, signal):
    y = rng.standard_normal(d)
    y[:k][seen] += signal
    return y


def test_the_statistic_no_longer_depends_on_which_canaries_are_seen():
    """The scale is measured where no canary is: the seen/unseen split (a secret) does not
    enter an unseen canary's statistic, and a canary's statistic does not move when another
    canary's coordinate does."""
    rng = np.random.default_rng(2)
    d, k = 400, 100
    y = rng.standard_normal(d)
    x = null_standardized_cosines(y, np.arange(k))
    y2 = y.copy()
    y2[7] += 50.0  # a strongly seen canary
    x2 = null_standardized_cosines(y2, np.arange(k))
    assert x2[7] > x[7]
    np.testing.assert_allclose(np.delete(x2, 7), np.delete(x, 7), rtol=1e-12)


@pytest.mark.parametrize("d, k, mu", [(1000, 400, 1.0), (1000, 400, 5.0), (1000, 900, 3.0)])
def test_the_final_model_test_has_its_level_where_summed_scores_did_not(d, k, mu):
    """Every seen canary shares the release's scale: at d = 1000 and mu = 5 a small scale
    inflates all 200 seen scores at once, and the sum of their normal scores rejected a true
    claim in about 30% of runs at a 5% level (the old test; measured). The studentized sum is
    noncentral t: exact."""
    rng = np.random.default_rng(3)
    runs, alpha = 1500, 0.05
    rejected = 0
    for run in range(runs):
        seen = rng.random(k) < 0.5
        x = null_standardized_cosines(_release(rng, d, k, seen, mu), np.arange(k))
        test = normal_score_test(final_model_rounds(x[seen], d, dof=d - k), claim_mu=mu)
        rejected += test.p_value <= alpha
        if run < 100:  # mu_lo > mu exactly when the true claim is rejected
            assert (test.mu_lo(alpha) > mu) == (test.p_value <= alpha)
    _assert_level(rejected, runs, alpha)


def _assert_level(rejected: int, runs: int, alpha: float) -> None:
    """Exact level, two-sided: an exact test falls outside with probability ~1e-3 (5e-4 each
    side); the upper limit fails a test whose true size is 8% with probability >= 0.9
    (binomial_limit; 1500 runs: 49 <= rejected <= 104, power 0.93)."""
    high = binomial_limit(runs, alpha, false_fail=5e-4, against=0.08)
    assert high.power >= 0.9, str(high)
    low = stats.binom.ppf(0.0005, runs, alpha)
    assert low <= rejected and high.passes(rejected), (rejected / runs, str(high))


def test_the_known_rounds_test_has_its_level_over_rounds_and_repeats():
    rng = np.random.default_rng(4)
    d, k, rounds, mu, alpha = 1000, 400, 4, 2.0, 0.05
    runs, rejected = 1500, 0
    for _ in range(runs):
        seen = rng.random(k) < 0.5
        stat = KnownRoundsStatistic(k, dim=d, scale_dof=d - k)
        for _ in range(rounds):
            part = rng.random(k) < 0.5  # each canary in about half the rounds
            y = rng.standard_normal(d)
            y[:k][seen & part] += mu / math.sqrt(2)  # per participation: 2 repeats claimed
            stat.update(null_standardized_cosines(y, np.arange(k)), part, ~seen)
        test = normal_score_test(stat.rounds, claim_mu=mu, claim_participations=2)
        rejected += test.p_value <= alpha
    _assert_level(rejected, runs, alpha)


def test_a_release_with_less_signal_than_claimed_is_rejected_less_and_a_bug_more():
    rng = np.random.default_rng(5)
    d, k = 2000, 400
    p = {}
    for signal in (0.5, 1.0, 1.6):
        seen = rng.random(k) < 0.5
        x = null_standardized_cosines(_release(rng, d, k, seen, signal), np.arange(k))
        p[signal] = normal_score_test(
            final_model_rounds(x[seen], d, dof=d - k), claim_mu=1.0
        ).p_value
    assert p[0.5] > 0.5 and p[1.6] < 1e-6


def test_with_a_known_scale_the_test_is_the_sum_of_normal_scores():
    """dof = inf: the statistic is sum_j a_j S_j against lam sum_j a_j^2, as before."""
    rng = np.random.default_rng(6)
    scores = rng.normal(1.3, 1, 300)
    counts = rng.integers(1, 4, 300)
    test = normal_score_test(
        RoundSums.from_scores(scores, counts), claim_mu=2.0, claim_participations=3
    )
    lam = 2.0 / math.sqrt(3)
    expected = (np.sum(np.sqrt(counts) * scores) - lam * counts.sum()) / math.sqrt(counts.sum())
    assert test.z == pytest.approx(expected, rel=1e-12)
    mu_lo = test.mu_lo(0.05)
    closed = (
        (np.sum(np.sqrt(counts) * scores) - 1.6448536269514722 * math.sqrt(counts.sum()))
        / counts.sum()
        * math.sqrt(3)
    )
    assert mu_lo == pytest.approx(closed, rel=1e-8)


def test_mu_lo_is_monotone_in_the_level_and_survives_its_details():
    rng = np.random.default_rng(7)
    rounds = RoundSums(rng.normal(10, 1, 12), rng.integers(20, 60, 12), 500.0)
    test = normal_score_test(rounds, claim_mu=1.0)
    lows = [test.mu_lo(a) for a in (1e-4, 1e-3, 0.05, 0.3)]
    assert all(a <= b for a, b in zip(lows, lows[1:])) and lows[0] > 0
    again = type(test).from_details(test.to_details())
    assert again.mu_lo(0.05) == pytest.approx(test.mu_lo(0.05)) and again.p_value == test.p_value


def test_no_noise_at_all_is_an_infinite_bound_and_no_signal_is_zero():
    inf = RoundSums(np.array([np.inf, 3.0]), np.array([5, 5]), 100.0)
    assert normal_score_test(inf, claim_mu=1.0).p_value == 0.0
    assert normal_score_test(inf, claim_mu=1.0).mu_lo(0.05) == math.inf
    none = RoundSums(np.array([-2.0]), np.array([50]), 100.0)
    assert normal_score_test(none, claim_mu=1.0).mu_lo(0.05) == 0.0
    empty = RoundSums(np.zeros(0), np.zeros(0, dtype=np.int64), 10.0)
    assert normal_score_test(empty, claim_mu=1.0).p_value == 1.0


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(sums=[1.0], counts=[0], dof=5.0), "counts"),
        (dict(sums=[1.0, 2.0], counts=[1], dof=5.0), "shape"),
        (dict(sums=[np.nan], counts=[1], dof=5.0), "NaN"),
        (dict(sums=[1.0], counts=[1], dof=0.0), "dof"),
    ],
)
def test_round_sums_refuse_what_they_cannot_test(bad, match):
    with pytest.raises(ValueError, match=match):
        RoundSums(np.asarray(bad["sums"]), np.asarray(bad["counts"]), bad["dof"])


def test_the_per_round_sums_resume_from_their_state():
    rng = np.random.default_rng(8)
    d, k = 600, 100
    seen = rng.random(k) < 0.5
    whole = KnownRoundsStatistic(k, dim=d, scale_dof=d - k)
    for t in range(5):
        part = rng.random(k) < 0.4
        x = null_standardized_cosines(_release(rng, d, k, seen & part, 1.0), np.arange(k))
        if t == 2:
            resumed = KnownRoundsStatistic(k, dim=d, scale_dof=d - k, state=whole.state())
        whole.update(x, part, ~seen)
        if t >= 2:
            resumed.update(x, part, ~seen)
    np.testing.assert_array_equal(resumed.rounds.sums, whole.rounds.sums)
    np.testing.assert_array_equal(resumed.rounds.counts, whole.rounds.counts)
    assert whole.rounds.dof == d - k and len(whole.rounds.sums) == 5
    # a state saved before the per-round sums existed resumes with none
    old = KnownRoundsState(sums=whole.state().sums, counts=whole.state().counts, num_rounds=5)
    assert len(KnownRoundsStatistic(k, dim=d, state=old).rounds.sums) == 0


@pytest.mark.parametrize("dof", [30, 600, 1e5, 1e9])
def test_the_noncentral_t_tails_agree_with_scipy_in_the_bulk_and_an_integral_far_out(dof):
    from scipy import integrate, special

    from flaudit.auditor.claims.normal_scores import nct_log_cdf

    for delta in (0.0, 3.0, 30.0):  # each tail from its own side, as the test uses them
        lower, upper = np.linspace(delta - 6, delta, 7), np.linspace(delta, delta + 6, 7)
        np.testing.assert_allclose(
            special.ndtri_exp(nct_log_cdf(lower, dof, delta)),
            special.ndtri(stats.nct.cdf(lower, dof, delta)),
            atol=2e-4,
        )
        np.testing.assert_allclose(
            -special.ndtri_exp(nct_log_cdf(-upper, dof, -delta)),
            -special.ndtri(stats.nct.sf(upper, dof, delta)),
            atol=2e-4,
        )
    # ten and more standard deviations below (scipy's nct.cdf is NaN there): an adaptive
    # integral of Phi(r u - delta) against the density of U, scaled at its peak

    def log_integral(r, delta):
        def log_f(u):
            return (
                special.log_ndtr(r * u - delta)
                + (dof - 1) * np.log(u)
                - dof * u * u / 2
                + np.log(2.0)
                + dof / 2 * np.log(dof / 2)
                - special.gammaln(dof / 2)
            )

        grid = np.linspace(1e-6, 3, 30_001)
        peak = grid[np.argmax(log_f(grid))]
        value, _ = integrate.quad(
            lambda u: np.exp(log_f(u) - log_f(peak)),
            0,
            3 + peak,
            points=[peak],
            limit=400,
            epsabs=0,
            epsrel=1e-10,
        )
        return log_f(peak) + np.log(value)

    if dof > 1e6:  # the density of U is too narrow for the reference integral's grid
        return
    for r, delta in ((-3.0, 7.07), (-50.0, 1.0)):
        assert float(nct_log_cdf(r, dof, delta)) == pytest.approx(log_integral(r, delta), rel=1e-4)


@settings(max_examples=40, deadline=None)
@given(st.floats(-500, 500), st.integers(1, 10_000), st.sampled_from([30.0, 600.0, 1e5, 1e9]))
def test_a_release_scores_lower_the_more_signal_it_is_tested_against(r, count, dof):
    """Y_t(lam) is non-increasing in the claimed signal: what makes mu_lo a bound."""
    from flaudit.auditor.claims.normal_scores import _round_scores

    rounds = RoundSums(np.array([r]), np.array([count]), dof)
    ys = [float(_round_scores(rounds, lam)[0]) for lam in np.linspace(0, 20, 41)]
    assert all(b <= a + 1e-7 * max(1.0, abs(a)) for a, b in zip(ys, ys[1:])), ys
