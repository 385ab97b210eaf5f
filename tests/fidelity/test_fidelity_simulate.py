"""The simulated DP-FedAvg audit: wiring checked against closed forms and the exact null."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flaudit.auditor.estimators.null import null_cdf
from flaudit.server.simulated_audit import (
    VALID_LOWER_BOUNDS,
    DPBug,
    FedAvgSimulation,
    audit_epsilons,
    claimed_epsilons,
    simulate_dpfedavg_audit,
)

SMALL = FedAvgSimulation(
    dim=2000,
    num_clients=200,
    clients_per_round=10,
    num_rounds=5,
    num_canaries=200,
    noise_multiplier=2.0,
)


def _ks_to_null(x: np.ndarray, d: int) -> float:
    x = np.sort(x)
    n = x.size
    cdf = null_cdf(x, d)
    return float(max(np.max(np.arange(1, n + 1) / n - cdf), np.max(cdf - np.arange(n) / n)))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dim", 1),
        ("num_canaries", 2),
        ("noise_multiplier", -1.0),
        ("clip_norm", 0.0),
        ("bug_factor", 0.5),
        ("delta", 1.5),
        ("num_rounds", 0),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SMALL.with_(**{field: value})


def test_unseen_canaries_follow_the_exact_null():
    # Unseen canaries never touch the model, so their final cosines are exact null draws.
    cfg = SMALL.with_(num_canaries=600, noise_multiplier=0.5)
    res = simulate_dpfedavg_audit(cfg, seed=11)
    unseen = res.final_cosines[~res.seen]
    # 1% critical value of the one-sample KS statistic
    assert _ks_to_null(unseen, cfg.dim) < 1.63 / math.sqrt(unseen.size)
    # and the seen ones do not: their mean is shifted by the canary signal (> 5 standard errors)
    seen = res.final_cosines[res.seen]
    assert seen.mean() > 5 / math.sqrt(cfg.dim * seen.size)


@pytest.mark.parametrize("family", ["gaussian", "orthogonal"])
def test_seen_final_cosine_matches_closed_form(family):
    # No shared client direction: the final model is (1/m)(sum_j r S c_j + real clipped updates
    # + T noise draws), nearly orthogonal pieces, so cos(c_j, theta_T - theta_0) for a seen canary
    # is ~ r / sqrt(r^2 k_seen + n_real + T z^2 d) (S = 1). The orthogonal family's statistic
    # is standardized by the energy outside the seen canaries: ~ r / sqrt(n_real + T z^2 d).
    for repeats in (1, 2):
        cfg = SMALL.with_(
            client_signal=0.0,
            client_noise=2.0,
            noise_multiplier=0.3,
            canary_repeats=repeats,
            canary_family=family,
        )
        ratios = []  # one run's seen mean has ~7% noise at d = 2000: average six runs
        for run in range(6):
            res = simulate_dpfedavg_audit(cfg, seed=5 + repeats + 10 * run)
            k_seen = int(res.seen.sum())
            n_real = res.mean_cohort_size * cfg.num_rounds - k_seen * repeats
            canary_energy = repeats**2 * k_seen if family == "gaussian" else 0
            predicted = repeats / math.sqrt(
                canary_energy + n_real + cfg.num_rounds * cfg.noise_multiplier**2 * cfg.dim
            )
            ratios.append(float(np.mean(res.final_cosines[res.seen])) / predicted)
            assert res.canary_participations == repeats
        assert np.mean(ratios) == pytest.approx(1.0, rel=0.1)


def test_bugs_change_what_they_claim_to_change():
    extra = simulate_dpfedavg_audit(
        SMALL.with_(bug=DPBug.extra_participation, bug_factor=2), seed=3
    )
    assert extra.canary_participations == 2 and extra.claimed_participations == 1
    base = simulate_dpfedavg_audit(SMALL, seed=3)
    larger = simulate_dpfedavg_audit(SMALL.with_(bug=DPBug.cohort_larger, bug_factor=4), seed=3)
    assert larger.mean_cohort_size > 2 * base.mean_cohort_size
    # noise scaled by 1/m twice: the seen canaries stand out far more than with correct noise
    twice = simulate_dpfedavg_audit(SMALL.with_(bug=DPBug.noise_divided_twice), seed=3)
    gap = lambda r: r.max_cosines[r.seen].mean() - r.max_cosines[~r.seen].mean()  # noqa: E731
    assert gap(twice) > 5 * gap(base)


def test_same_seed_same_statistics():
    a = simulate_dpfedavg_audit(SMALL, seed=9)
    b = simulate_dpfedavg_audit(SMALL, seed=9)
    np.testing.assert_array_equal(a.final_cosines, b.final_cosines)
    np.testing.assert_array_equal(a.max_cosines, b.max_cosines)


def _alarm(cfg, seed) -> bool:
    claim = claimed_epsilons(cfg)["known_rounds"]
    e = audit_epsilons(simulate_dpfedavg_audit(cfg, seed=seed), delta=cfg.delta)
    return max(e[b] for b in VALID_LOWER_BOUNDS) > claim


@pytest.mark.parametrize(
    ("bug", "factor"),
    [(DPBug.no_noise, 1.0), (DPBug.noise_divided_twice, 1.0), (DPBug.no_clipping, 16.0)],
)
def test_gross_bugs_are_caught_in_every_run(bug, factor):
    cfg = SMALL.with_(num_canaries=300)
    assert claimed_epsilons(cfg)["known_rounds"] == pytest.approx(2.0, abs=0.1)
    assert all(_alarm(cfg.with_(bug=bug, bug_factor=factor), 100 + s) for s in range(2))


def test_schedule_bugs_are_invisible_to_canaries():
    # A larger real cohort / batch-then-shuffle leave each canary's own privacy unchanged, so the
    # audit must not be expected to see them (docs/fidelity.md): no alarm either.
    cfg = SMALL.with_(num_canaries=300)
    assert not _alarm(cfg.with_(bug=DPBug.cohort_larger), 300)
    assert not _alarm(cfg.with_(bug=DPBug.batch_then_shuffle), 301)


def test_correct_runs_raise_no_alarm():
    cfg = SMALL.with_(num_canaries=300)
    false_alarms = [_alarm(cfg, 200 + s) for s in range(4)]
    # a smoke check of the simulator end to end, not a validity test: P[>= 2 alarms in 4] is
    # 0.014 for a correct 5% alarm and only 0.034 for an 8% one. The alarm's validity with
    # binomial limits (1400 runs, power 0.94 against 8%): tests/auditor/test_alarm.py and
    # tests/fidelity/test_fidelity_alarm.py
    assert sum(false_alarms) <= 1


def test_claims_are_the_services_numbers():
    claims = claimed_epsilons(SMALL)
    assert set(claims) == {"poisson_rdp", "poisson_pld", "known_rounds"}
    assert claims["poisson_pld"] < claims["known_rounds"]  # amplification by sampling
    assert math.isinf(claimed_epsilons(SMALL.with_(noise_multiplier=0.0))["known_rounds"])
