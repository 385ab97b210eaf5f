"""Sizing an audit to its federation (auditor/claims/sizing.py): invariants and independent
routes (the schedule itself, the design's closed form)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from flaudit.auditor.claims import audit_design
from flaudit.auditor.claims.sizing import (
    MIN_AUTO_CANARIES,
    canaries_needed,
    capped_advice,
    choose_canaries,
    clients_needed,
    detectable_noise_scale,
    max_canaries,
    rounds_needed,
    seen_low,
)
from flaudit.auditor.schedules import canary_rounds


def _spec(k, *, z=1.0, r=1, T=10, n=2, N=3, f=1.0):
    return SimpleNamespace(
        num_canaries=k,
        accounted_noise_multiplier=z,
        canary_repeats=r,
        num_rounds=T,
        delta=1e-6,
        clients_per_round=n,
        num_clients=N,
        max_canary_fraction=f,
    )


@pytest.mark.parametrize("n,T,r", [(2, 5, 1), (2, 10, 1), (3, 10, 4), (10, 7, 2), (1, 8, 8)])
def test_the_cap_always_fits_and_one_more_may_not(n, T, r):
    cap = max_canaries(clients_per_round=n, num_rounds=T, canary_repeats=r)
    assert cap == n * (T // r)
    rng = np.random.default_rng(0)
    # every canary seen (the worst draw of the secret labels): the schedule still fits
    rounds = canary_rounds(cap, num_rounds=T, repeats=r, rng=rng, max_per_round=n)
    assert np.bincount(rounds.ravel(), minlength=T).max() <= n
    with pytest.raises(ValueError, match=f"use at most {cap} canaries"):
        canary_rounds(cap + 1, num_rounds=T, repeats=r, rng=rng, max_per_round=n)


def test_the_issue_setting_caps_at_ten_and_the_population_fraction_caps_too():
    assert max_canaries(clients_per_round=2, num_rounds=5) == 10  # issue #28's "at most 10"
    # k/2 <= f (N + k/2): f = 0.5, N = 3 -> k <= 6
    assert (
        max_canaries(clients_per_round=2, num_rounds=10, num_clients=3, max_canary_fraction=0.5)
        == 6
    )
    assert max_canaries(clients_per_round=2, num_rounds=3, canary_repeats=4) == 0


@pytest.mark.parametrize("z,r,T", [(0.5, 1, 10), (1.0, 1, 100), (2.0, 2, 20), (1.0, 8, 40)])
def test_canaries_needed_is_the_smallest_testable_k(z, r, T):
    k = canaries_needed(noise_multiplier=z, canary_repeats=r, num_rounds=T)
    assert audit_design(_spec(k, z=z, r=r, T=T, n=10**6, N=10**6)).testable
    assert not audit_design(_spec(k - 1, z=z, r=r, T=T, n=10**6, N=10**6)).testable
    assert (
        detectable_noise_scale(noise_multiplier=z, num_canaries=k, canary_repeats=r, num_rounds=T)
        >= 0.5
    )


@pytest.mark.timeout(30)
@pytest.mark.parametrize("z", [50.0, 1e3, 999999.0, 1e12])
def test_canaries_needed_for_a_huge_claim_is_the_smallest_k_and_the_design_answers(z):
    # the fuzzer's noise_multiplier = 999999 took minutes (a step-by-step search over ~1e13 k)
    k = canaries_needed(noise_multiplier=z, canary_repeats=1, num_rounds=20)
    if k < 2**48:  # beyond, float has no unit steps: the closed form stands
        caught = [
            detectable_noise_scale(
                noise_multiplier=z, num_canaries=m, canary_repeats=1, num_rounds=20
            )
            for m in (k, k - 1)
        ]
        assert caught[0] >= 0.5 - 1e-9 and caught[1] < 0.5, (k, caught)
    design = audit_design(_spec(100, z=z, T=20, n=10, N=100))
    assert not design.testable and design.advice


def test_seen_low_is_nondecreasing_and_below_half():
    values = [seen_low(k) for k in range(2000)]
    assert all(a <= b for a, b in zip(values, values[1:]))
    assert all(v <= k / 2 for k, v in enumerate(values))


def test_auto_is_testable_where_the_federation_allows_and_uses_the_cap_where_not():
    roomy = choose_canaries(
        noise_multiplier=1.0, num_rounds=100, clients_per_round=10, num_clients=100
    )
    needed = canaries_needed(noise_multiplier=1.0, canary_repeats=1, num_rounds=100)
    assert roomy.testable and not roomy.capped and roomy.canary_repeats == 1
    assert roomy.num_canaries == max(needed, MIN_AUTO_CANARIES)
    small = choose_canaries(noise_multiplier=1.0, num_rounds=10, clients_per_round=2, num_clients=3)
    assert small.capped and not small.testable and small.num_canaries == small.max_canaries == 20
    assert 0 < small.detectable_noise_scale < 0.5
    # no claim: at most MIN_AUTO_CANARIES, within the cap
    assert (
        choose_canaries(noise_multiplier=0.0, num_rounds=100, clients_per_round=10).num_canaries
        == MIN_AUTO_CANARIES
    )


@pytest.mark.parametrize("z,T,n", [(1.0, 10, 2), (1.0, 5, 2), (2.0, 10, 2), (0.7, 3, 3)])
def test_rounds_and_clients_needed_are_the_smallest_that_make_it_testable(z, T, n):
    rounds = rounds_needed(noise_multiplier=z, num_rounds=T, clients_per_round=n)
    assert choose_canaries(noise_multiplier=z, num_rounds=rounds, clients_per_round=n).testable
    assert not choose_canaries(
        noise_multiplier=z, num_rounds=rounds - 1, clients_per_round=n
    ).testable
    clients = clients_needed(noise_multiplier=z, num_rounds=T, clients_per_round=n)
    assert choose_canaries(noise_multiplier=z, num_rounds=T, clients_per_round=clients).testable
    assert not choose_canaries(
        noise_multiplier=z, num_rounds=T, clients_per_round=clients - 1
    ).testable


def test_inconclusive_advice_is_achievable():
    """When the federation caps the canaries, the design advises rounds or clients (that
    work), never 'use at least N canaries' above the cap."""
    capped = audit_design(_spec(20))
    assert not capped.testable and "use at least" not in capped.advice
    assert "at most 20 canaries" in capped.advice
    rounds = int(capped.advice.split("train ")[1].split()[0])
    clients = int(capped.advice.split("sample ")[1].split()[0])
    assert audit_design(_spec(40, T=rounds)).testable  # 2 x rounds slots hold enough canaries
    assert choose_canaries(noise_multiplier=1.0, num_rounds=10, clients_per_round=clients).testable
    # room for more canaries: the advice is to use more
    roomy = audit_design(_spec(6, n=100, N=100))
    assert "use at least" in roomy.advice
    needed = int(roomy.advice.split("at least ")[1].split()[0])
    assert needed <= max_canaries(clients_per_round=100, num_rounds=10)
    # the population fraction binds: say so
    fraction = audit_design(_spec(6, N=3, f=0.5))
    assert "--max-canary-fraction" in fraction.advice
    assert capped_advice(_spec(20), 5) is None


def test_detectable_scale_matches_the_design():
    for k in (20, 64, 500):
        design = audit_design(_spec(k, n=10**6, N=10**6))
        assert design.detectable_noise_scale == pytest.approx(
            detectable_noise_scale(
                noise_multiplier=1.0, num_canaries=k, canary_repeats=1, num_rounds=10
            )
        )
    assert math.isclose(seen_low(100), 41)
