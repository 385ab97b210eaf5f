"""The shared argument checks: they pass valid values, and their errors name the argument."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flaudit.auditor.validation import check_at_least, check_integer_at_least, check_positive

numbers = st.one_of(st.integers(-(10**6), 10**6), st.floats(-1e6, 1e6, allow_nan=False))


@given(value=numbers, minimum=st.integers(-5, 5))
def test_check_at_least_agrees_with_the_comparison(value, minimum):
    if value >= minimum:
        check_at_least(value, "num_rounds", minimum)
    else:
        with pytest.raises(ValueError, match=rf"^num_rounds must be >= {minimum}, got "):
            check_at_least(value, "num_rounds", minimum)


@given(value=numbers)
def test_check_positive_agrees_with_the_comparison(value):
    if value > 0:
        check_positive(value, "clip_norm")
    else:
        with pytest.raises(ValueError, match=r"^clip_norm must be > 0, got "):
            check_positive(value, "clip_norm")


def test_nan_fails_check_positive_but_passes_check_at_least():
    with pytest.raises(ValueError, match="clip_norm"):
        check_positive(math.nan, "clip_norm")
    check_at_least(math.nan, "backoff", 0)  # documented: a `<` comparison lets NaN through


@pytest.mark.parametrize("bad", [True, False, 1.0, "2", None, 0, -3])
def test_check_integer_at_least_rejects_non_integers_and_small_values(bad):
    with pytest.raises(ValueError, match=r"^workers must be an integer >= 1, got "):
        check_integer_at_least(bad, "workers", 1)


def test_check_integer_at_least_accepts_integers_from_the_minimum():
    for value in (1, 2, 10**30):
        check_integer_at_least(value, "workers", 1)
