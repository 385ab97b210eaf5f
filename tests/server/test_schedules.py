"""Participation schedules: the stated counts, reproducibility, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flaudit.auditor.schedules import canary_schedule, participation_schedule


def _schedule(**overrides):
    options = dict(
        num_clients=40,
        num_seen_canaries=10,
        num_rounds=24,
        participation="uniform",
        clients_per_round=8,
        canary_repeats=1,
        seed=3,
    )
    options.update(overrides)
    return participation_schedule(**options)


@settings(max_examples=25, deadline=None)
@given(
    repeats=st.sampled_from([1, 2, 4, 8]),
    rounds=st.integers(8, 40),
    seen=st.integers(0, 30),
    scheme=st.sampled_from(["poisson", "uniform", "shuffled", "batch_then_shuffle"]),
    seed=st.integers(0, 2**32),
)
def test_each_seen_canary_is_presented_in_exactly_r_rounds_one_per_period(
    repeats, rounds, seen, scheme, seed
):
    schedule = _schedule(
        num_seen_canaries=seen,
        num_rounds=rounds,
        canary_repeats=repeats,
        participation=scheme,
        seed=seed,
        clients_per_round=30,  # room for every seen canary in any round: the cap never binds
    )
    counts = schedule.participation_counts()[40:]
    assert np.all(counts == repeats)
    bounds = (np.arange(repeats + 1) * rounds) // repeats
    for position in range(seen):
        rounds_in = [t for t in range(1, rounds + 1) if position in schedule.canaries(t)]
        periods = np.searchsorted(bounds, np.array(rounds_in) - 1, side="right") - 1
        assert sorted(periods.tolist()) == list(range(repeats))


def test_shuffled_epochs_each_client_exactly_once_per_epoch():
    n, m = 30, 7
    schedule = _schedule(
        num_clients=n,
        num_seen_canaries=0,
        participation="shuffled",
        clients_per_round=m,
        num_rounds=50,
    )
    rounds_per_epoch = -(-n // m)  # last cohort of an epoch is short
    epochs = 50 // rounds_per_epoch
    for e in range(epochs):
        members = np.concatenate(
            [
                schedule.real_clients(t)
                for t in range(e * rounds_per_epoch + 1, (e + 1) * rounds_per_epoch + 1)
            ]
        )
        assert np.array_equal(np.sort(members), np.arange(n))
    assert all(schedule.real_clients(t).size <= m for t in range(1, 51))


def test_fixed_size_schemes_keep_cohort_size_m_including_canaries():
    schedule = _schedule(participation="uniform", num_rounds=20, canary_repeats=2)
    sizes = [c.size for c in schedule.cohorts]
    assert sizes == [8] * 20
    for t in range(1, 21):
        real = schedule.real_clients(t)
        assert np.unique(real).size == real.size  # without replacement


def test_poisson_rate_within_tolerance():
    n, q, rounds = 2000, 0.05, 200
    schedule = _schedule(
        num_clients=n,
        num_seen_canaries=0,
        participation="poisson",
        clients_per_round=100,
        sampling_probability=q,
        num_rounds=rounds,
    )
    counts = schedule.participation_counts()
    expected = n * rounds * q
    assert abs(counts.sum() - expected) < 5 * np.sqrt(expected * (1 - q))
    # each client's count ~ Binomial(T, q): its variance, not just its mean
    assert abs(counts.var() - rounds * q * (1 - q)) < 0.15 * rounds * q * (1 - q)


@pytest.mark.parametrize("scheme", ["poisson", "uniform", "shuffled", "batch_then_shuffle"])
def test_participation_cap_is_respected(scheme):
    schedule = _schedule(
        num_clients=20,
        num_seen_canaries=0,
        participation=scheme,
        clients_per_round=10,
        sampling_probability=0.6,
        num_rounds=30,
        max_participations=2,
    )
    counts = schedule.participation_counts()
    assert counts.max() <= 2
    assert counts.sum() > 0


def test_batch_then_shuffle_keeps_cohorts_fixed_and_shuffled_does_not():
    kwargs = dict(num_clients=24, num_seen_canaries=0, clients_per_round=6, num_rounds=24)
    bad = _schedule(participation="batch_then_shuffle", **kwargs)
    good = _schedule(participation="shuffled", **kwargs)
    cohort_set = {tuple(c.tolist()) for c in bad.cohorts}
    assert len(cohort_set) == 4  # the same 4 fixed batches over 6 epochs
    assert len({tuple(c.tolist()) for c in good.cohorts}) > 4
    assert np.all(bad.participation_counts() == 6)


def test_reproducible_and_seed_dependent():
    a, b, c = _schedule(seed=1), _schedule(seed=1), _schedule(seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a.cohorts, b.cohorts))
    assert not all(np.array_equal(x, y) for x, y in zip(a.cohorts, c.cohorts))


@pytest.mark.parametrize(
    "overrides, name",
    [
        (dict(participation="weekly"), "participation"),
        (dict(canary_repeats=8, num_rounds=4), "canary_repeats"),
        (dict(num_rounds=0), "num_rounds"),
        (dict(clients_per_round=0), "clients_per_round"),
        (dict(sampling_probability=1.5, participation="poisson"), "sampling_probability"),
        (dict(max_participations=0), "max_participations"),
    ],
)
def test_bad_arguments_are_named(overrides, name):
    with pytest.raises(ValueError, match=name):
        _schedule(**overrides)


def test_audit_spec_rejects_more_canary_repeats_than_rounds():
    from pydantic import ValidationError

    from flaudit.auditor.spec import AuditSpec

    with pytest.raises(ValidationError, match="canary_repeats"):
        AuditSpec(num_rounds=4, canary_repeats=8)
    assert AuditSpec(num_rounds=8, canary_repeats=8).canary_repeats == 8


def test_unseen_canaries_get_rounds_by_the_same_rule_and_participants_merge_both():
    from flaudit.auditor.schedules import canary_participants, unseen_canary_rounds

    rounds = unseen_canary_rounds(500, num_rounds=12, repeats=3, seed=4)
    # one round per period, exactly as canary_rounds draws them for the seen canaries
    assert rounds.shape == (500, 3)
    assert np.all(rounds[:, 0] < 4) and np.all((4 <= rounds[:, 1]) & (rounds[:, 1] < 8))
    assert np.all(rounds[:, 2] >= 8)
    # roughly uniform within a period (each of 4 rounds ~125 of 500; binomial sd ~9.7)
    counts = np.bincount(rounds[:, 0], minlength=4)
    assert np.all(np.abs(counts - 125) < 45)
    assert np.array_equal(rounds, unseen_canary_rounds(500, num_rounds=12, repeats=3, seed=4))

    seen_by_round = [np.array([5, 1]), np.array([], dtype=np.int64), np.array([3])]
    unseen = np.array([0, 2, 4])
    merged = canary_participants(
        seen_by_round=seen_by_round, unseen_indices=unseen, unseen_rounds=np.array([[1], [0], [1]])
    )
    assert [m.tolist() for m in merged] == [[1, 2, 5], [0, 4], [3]]


@settings(max_examples=25, deadline=None)
@given(
    repeats=st.sampled_from([1, 2, 4]),
    rounds=st.integers(4, 20),
    cap=st.integers(1, 4),
    seed=st.integers(0, 2**32),
)
def test_canaries_take_cohort_slots_never_more_than_the_cohort(repeats, rounds, cap, seed):
    """Issue #22 item 1: at most m canaries per round, each still in r rounds, one per period;
    where the cap does not bind, the schedule is the uncapped one."""
    shortest = rounds // repeats
    seen = cap * shortest  # the most that fit
    capped = canary_schedule(
        seen, num_rounds=rounds, canary_repeats=repeats, seed=seed, max_per_round=cap
    )
    assert max(len(r) for r in capped) <= cap
    bounds = (np.arange(repeats + 1) * rounds) // repeats
    for position in range(seen):
        rounds_in = [t for t in range(rounds) if position in capped[t]]
        periods = np.searchsorted(bounds, np.array(rounds_in), side="right") - 1
        assert sorted(periods.tolist()) == list(range(repeats))
    loose = canary_schedule(
        seen, num_rounds=rounds, canary_repeats=repeats, seed=seed, max_per_round=seen + 1
    )
    free = canary_schedule(seen, num_rounds=rounds, canary_repeats=repeats, seed=seed)
    assert all(np.array_equal(a, b) for a, b in zip(loose, free))
    with pytest.raises(ValueError, match="num_canaries"):
        canary_schedule(
            seen + 1, num_rounds=rounds, canary_repeats=repeats, seed=seed, max_per_round=cap
        )


def test_the_canary_schedule_is_the_participation_schedules_and_fills_no_more_than_m():
    from flaudit.auditor.canaries import seen_mask
    from flaudit.auditor.schedules import CanarySchedule

    mask = seen_mask(4242, 40)
    plan = CanarySchedule.from_mask(mask, num_rounds=10, canary_repeats=2, seed=5, max_per_round=6)
    schedule = _schedule(
        num_seen_canaries=int(mask.sum()),
        num_rounds=10,
        canary_repeats=2,
        participation="uniform",
        clients_per_round=6,
        seed=5,
        max_canaries_per_round=6,
    )
    seen = np.flatnonzero(mask)
    for t in range(1, 11):
        assert plan.seen(t).tolist() == sorted(seen[schedule.canaries(t)].tolist())
        assert len(schedule.cohorts[t - 1]) == 6  # real clients fill the slots canaries leave
        assert set(plan.seen(t).tolist()) <= set(plan.participants(t).tolist())


def test_a_schedule_where_every_canary_came_up_seen():
    """A small audit whose coins made every canary seen (no unseen canary) still plans its rounds
    (it broke the claim route with a reshape error)."""
    import numpy as np

    from flaudit.auditor.schedules import CanarySchedule

    plan = CanarySchedule.from_mask(
        np.ones(8, dtype=bool), num_rounds=5, canary_repeats=1, seed=0, max_per_round=3
    )
    assert sum(plan.seen(t).size for t in range(1, 6)) == 8


@pytest.mark.parametrize("engine", ["simulation", "deployment", "external"])
def test_an_audits_canary_plan_follows_its_engine(engine):
    """audit_canary_plan: built-in engines uncapped with an extra_participation bug's repeats,
    external capped at clients_per_round; the same (seed, spec) gives the same plan anywhere."""
    from flaudit.auditor.schedules import audit_canary_plan, canary_plan
    from flaudit.auditor.spec import AuditSpec

    seed = 2**90 + 17
    common = dict(
        num_rounds=8,
        num_clients=50,
        clients_per_round=2,
        num_canaries=8,
        canary_repeats=2,
        data_seed=3,
        delta=1e-5,
    )
    if engine == "external":
        spec = AuditSpec(engine=engine, max_canary_fraction=1.0, **common)
        want = canary_plan(
            seed, num_canaries=8, num_rounds=8, canary_repeats=2, data_seed=3, max_per_round=2
        )
    else:
        extra = {"superlink_address": "h:1"} if engine == "deployment" else {}
        spec = AuditSpec(
            engine=engine,
            inject_bug={"kind": "extra_participation", "factor": 2},
            **common,
            **extra,
        )
        want = canary_plan(seed, num_canaries=8, num_rounds=8, canary_repeats=4, data_seed=3)
    plan = audit_canary_plan(seed, spec)
    for t in range(1, 9):
        np.testing.assert_array_equal(plan.seen(t), want.seen(t))
        np.testing.assert_array_equal(plan.participants(t), want.participants(t))
        if engine == "external":
            assert plan.seen(t).size <= 2
    if engine != "external":  # uncapped: some round holds more canaries than the cohort
        assert max(plan.seen(t).size for t in range(1, 9)) > 2
