"""ETA from measured round times: start-up before round 1 is not round time."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flaudit.auditor.progress import eta_seconds


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
