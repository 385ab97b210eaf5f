"""The alarm over every look on exact canary-score distributions (benchmarks/fidelity/alarm_power.py
at small size): valid for mechanisms that meet the claim (Gaussian or not), powerful against
the bugs it targets, early for a clear one, and ahead of main's old alarm on the same runs."""

from __future__ import annotations

import numpy as np
from scipy import stats

from benchmarks.fidelity._common import rate_consistent_with
from benchmarks.fidelity.alarm_power import (
    _SEEN_LAWS,
    _shift_family_law,
    coverage_table,
    new_alarm_first_look,
    np_limit_power,
    old_alarm_first_look,
    simulate_scores,
)


def _false_alarms(rng, runs, *, k, law=None, z=1.0):
    hits = 0
    for _ in range(runs):
        run = simulate_scores(rng, k=k, num_rounds=10, noise_scale=1.0, z=z, seen_law=law)
        hits += new_alarm_first_look(run, num_rounds=10, z=z, with_fdp=False) is not None
    return hits


def test_correct_runs_rarely_alarm_over_every_look():
    rng = np.random.default_rng(0)
    hits = _false_alarms(rng, 300, k=200)
    assert rate_consistent_with(hits, 300, 0.05)


def test_non_gaussian_mechanisms_on_their_claim_rarely_alarm():
    rng = np.random.default_rng(1)
    law, mu = _shift_family_law(stats.laplace(), 1.0)
    assert 0.9 < mu < 1.2  # Laplace shift 1 is about 1.03-GDP
    for seen_law, claim_mu in ((law, mu), (_SEEN_LAWS["mixture_half_absent"], 1.0),
                               (_SEEN_LAWS["ties_clipped_at_mu"], 1.0)):
        hits = _false_alarms(rng, 150, k=400, law=seen_law, z=1.0 / claim_mu)
        assert rate_consistent_with(hits, 150, 0.05)


def test_half_the_noise_fires_within_the_first_three_rounds():
    rng = np.random.default_rng(2)
    looks = [new_alarm_first_look(simulate_scores(rng, k=1000, num_rounds=10, noise_scale=0.5),
                                  num_rounds=10, with_fdp=False) for _ in range(30)]
    assert all(look is not None for look in looks)
    assert np.median(looks) <= 3


def test_new_alarm_beats_the_old_one_on_the_same_runs_near_the_np_limit():
    rng = np.random.default_rng(3)
    new = old = 0
    for _ in range(40):
        run = simulate_scores(rng, k=1000, num_rounds=10, noise_scale=0.8)
        new += new_alarm_first_look(run, num_rounds=10, with_fdp=False) is not None
        old += old_alarm_first_look(run, num_rounds=10) is not None
    assert new >= 36 and new > old  # NP limit at s = 0.8, k = 1000: ~100%
    assert np_limit_power(1000, 0.8) > 0.99 and np_limit_power(1000, 1.0) < 0.06


def test_mu_lo_rarely_exceeds_the_truth():
    for row in coverage_table(runs=300, ks=(50, 400), mus=(0.0, 2.0)):
        assert rate_consistent_with(row["over"], row["runs"], 0.05), row


def test_the_design_s_star_is_caught_at_least_as_often_as_promised():
    from types import SimpleNamespace

    from flaudit.auditor.claims import audit_design

    spec = SimpleNamespace(num_canaries=200, accounted_noise_multiplier=1.0, canary_repeats=1,
                           num_rounds=10, delta=1e-6)
    s_star = audit_design(spec).detectable_noise_scale
    rng = np.random.default_rng(4)
    hits = sum(new_alarm_first_look(simulate_scores(rng, k=200, num_rounds=10, noise_scale=s_star),
                                    num_rounds=10, with_fdp=False) is not None for _ in range(150))
    # promised >= 95% (conservative: seen count at its 5% quantile, only the final look counted)
    assert hits >= 138
