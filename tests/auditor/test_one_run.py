import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flaudit.auditor import one_run_lower_bound
from flaudit.auditor.estimators import one_run_p_value
from flaudit.auditor.estimators.one_run import one_run_epsilon


def _brute_p_value(eps, v, r, m, delta):
    """Thm 3.1 right-hand side with exact integer binomial sums (math.comb)."""
    p = math.exp(eps) / (1 + math.exp(eps))
    pmf = [math.comb(r, j) * p**j * (1 - p) ** (r - j) for j in range(r + 1)]
    tail = sum(pmf[v:]) if v <= r else 0.0
    alpha = max(
        2 / i * sum(pmf[j] for j in range(max(0, v - i), min(v, r + 1))) for i in range(1, m + 1)
    )
    return tail + delta * m * alpha


@pytest.mark.parametrize(
    "v,r,m,delta", [(18, 20, 40, 0.0), (18, 20, 40, 1e-3), (45, 60, 60, 1e-4), (7, 10, 100, 1e-2)]
)
def test_p_value_matches_brute_force(v, r, m, delta):
    for eps in (0.0, 0.5, 1.3, 3.0):
        assert one_run_p_value(eps, v, r, m, delta) == pytest.approx(
            _brute_p_value(eps, v, r, m, delta), rel=1e-9, abs=1e-15
        )


@pytest.mark.parametrize(
    "v,r,m,delta", [(18, 20, 40, 0.0), (45, 60, 60, 1e-4), (95, 100, 100, 1e-5)]
)
def test_epsilon_is_the_largest_rejected_on_a_fine_grid(v, r, m, delta):
    beta = 0.05
    eps = one_run_epsilon(v, r, m, delta, beta)
    assert eps > 0
    assert _brute_p_value(eps - 1e-4, v, r, m, delta) <= beta
    assert _brute_p_value(eps + 1e-3, v, r, m, delta) > beta


def test_all_correct_randomized_response_closed_form():
    # delta = 0, all 100 guesses correct: p^100 = beta  =>  eps = logit(beta^(1/100))
    p = 0.05 ** (1 / 100)
    assert one_run_epsilon(100, 100, 100, 0.0, 0.05) == pytest.approx(
        math.log(p / (1 - p)), abs=2e-4
    )  # bisection tol 1e-4


@settings(max_examples=40, deadline=None)
@given(st.integers(10, 200), st.data())
def test_monotone_in_correct_guesses_and_delta(r, data):
    v1 = data.draw(st.integers(0, r))
    v2 = data.draw(st.integers(v1, r))
    m = data.draw(st.integers(r, 3 * r))
    d1 = data.draw(st.floats(0, 1e-3))
    d2 = data.draw(st.floats(d1, 1e-2))
    assert one_run_epsilon(v1, r, m, d1, 0.05) <= one_run_epsilon(v2, r, m, d1, 0.05) + 1e-5
    assert one_run_epsilon(v2, r, m, d2, 0.05) <= one_run_epsilon(v2, r, m, d1, 0.05) + 1e-5


def test_separable_scores_give_positive_bound_and_random_scores_none():
    rng = np.random.default_rng(0)
    m = 1000
    seen = rng.random(m) < 0.5
    strong = one_run_lower_bound(rng.normal(size=m) + 4 * seen, seen, delta=1e-6)
    assert strong.epsilon > 2.0
    assert strong.details["correct"] <= strong.details["guesses"]
    noise = one_run_lower_bound(rng.normal(size=m), seen, delta=1e-6)
    assert noise.epsilon < 0.5


def test_bad_input():
    with pytest.raises(ValueError, match="seen_mask"):
        one_run_lower_bound([0.1, 0.2], [True], delta=1e-6)
    with pytest.raises(ValueError, match="scores"):
        one_run_lower_bound([0.1, math.inf], [True, False], delta=1e-6)
    with pytest.raises(ValueError, match="delta"):
        one_run_lower_bound([0.1, 0.2], [True, False], delta=-1)
    with pytest.raises(ValueError, match="grid"):
        one_run_lower_bound([0.1, 0.2], [True, False], delta=1e-6, grid=[(2, 1)])
