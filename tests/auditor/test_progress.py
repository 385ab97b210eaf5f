"""ETA from measured round times: start-up before round 1 is not round time."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flaudit.auditor.progress import eta_seconds, round_wait


def test_start_up_before_round_one_is_not_counted():
    # Ray start-up of 60 s, then 2 s per round: round 1 arrives at t = 62
    times = [62.0, 64.0, 66.0]
    assert eta_seconds(times, 10) == pytest.approx(2.0 * 7)


def test_none_before_two_rounds_and_zero_at_the_end():
    assert eta_seconds([], 5) is None
    assert eta_seconds([30.0], 5) is None
    assert eta_seconds([1.0, 2.0, 3.0], 3) == 0.0


def test_one_slow_round_does_not_swing_the_median():
    times = [10.0, 11.0, 12.0, 40.0, 41.0]  # one 28 s stall
    assert eta_seconds(times, 10) == pytest.approx(1.0 * 5)


@given(
    st.lists(st.floats(0.01, 100.0), min_size=1, max_size=30),
    st.integers(0, 50),
    st.floats(0.0, 1e4),
)
def test_eta_is_between_the_fastest_and_slowest_gap_times_rounds_left(gaps, extra, start_up):
    times = [start_up]
    for gap in gaps:
        times.append(times[-1] + gap)
    total = len(times) + extra
    eta = eta_seconds(times, total)
    left = total - len(times)
    assert min(gaps) * left - 1e-6 <= eta <= max(gaps) * left + 1e-6


# -- the round in progress counts (issue #40: "round 4 of 10" for a minute with an ETA of 2 s) --


def test_a_stalled_round_raises_the_eta_while_it_lasts():
    # the demo's rounds 1-4 arrived within 0.25 s, then round 5 took a minute
    times = [100.0, 100.1, 100.16, 100.25]
    assert eta_seconds(times, 10) < 1.0  # the median alone: what the page used to say
    at_60 = eta_seconds(times, 10, now=160.25)
    at_120 = eta_seconds(times, 10, now=220.25)
    # five rounds after the one in progress, each at least the average since round 1 (60.25 s / 4)
    assert at_60 == pytest.approx(5 * 60.25 / 4)
    assert at_120 == pytest.approx(5 * 120.25 / 4) and at_120 > at_60


def test_a_steady_cadence_counts_down_within_the_round():
    times = [62.0, 64.0, 66.0]  # 2 s per round; round 10 comes at 80
    assert eta_seconds(times, 10, now=66.0) == pytest.approx(14.0)
    assert eta_seconds(times, 10, now=67.0) == pytest.approx(13.0)
    assert eta_seconds(times, 10, now=67.5) == pytest.approx(12.5)


@given(
    st.lists(st.floats(0.01, 100.0), min_size=1, max_size=30),
    st.integers(1, 50),
    st.floats(0.0, 1e4),
)
def test_with_now_the_eta_is_never_below_the_rounds_after_this_one_at_the_observed_pace(
    gaps, extra, waited
):
    times = [1000.0]
    for gap in gaps:
        times.append(times[-1] + gap)
    total, t = len(times) + extra, len(times)
    now = times[-1] + waited
    eta = eta_seconds(times, total, now=now)
    assert eta >= (total - t - 1) * (now - times[0]) / t - 1e-6
    assert eta >= eta_seconds(times, total) - (now - times[-1]) - 1e-6  # at most the time passed


def test_round_wait_names_the_round_and_whether_it_is_slower():
    times = [100.0, 100.1, 100.16, 100.25]
    wait = round_wait(times, 10, now=160.25)
    assert (wait.round, wait.waited_seconds) == (5, pytest.approx(60.0))
    assert wait.typical_seconds == pytest.approx(0.09) and wait.overdue
    assert not round_wait(times, 10, now=100.5).overdue
    assert not round_wait(times, 10, now=105.0).overdue  # sub-second rounds: 5 s of grace
    assert round_wait([0.0, 10.0, 20.0], 10, now=40.5).overdue  # twice 10 s
    assert not round_wait([0.0, 10.0, 20.0], 10, now=39.5).overdue
    assert round_wait([], 10, now=5.0) is None and round_wait(times, 4, now=200.0) is None
    assert round_wait([3.0], 10, now=9.0).typical_seconds is None
