"""The noncentral t of the exact claim tests (auditor/claims/nct.py) against an arbitrary-precision
reference, and by invariants."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special, stats

from flaudit.auditor.claims.nct import nct_log_cdf, nct_log_sf, nct_normal_score
from flaudit.auditor.claims.normal_scores import nct_log_cdf as reexported

REFERENCE = Path(__file__).parent / "data" / "nct_reference.json"


def _reference():
    data = json.loads(REFERENCE.read_text())
    rows = np.array(data["rows"], dtype=np.float64)
    return rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3]


def test_the_reference_grid_spans_the_issue_and_reaches_far_tails():
    r, dof, delta, log_p = _reference()
    assert dof.min() == 1 and dof.max() == 1e7
    assert np.abs(delta).min() == 0 and np.abs(delta).max() == 1e5
    assert np.sum(log_p < math.log(1e-100)) > 20  # far tails on the grid
    assert np.sum(log_p > math.log(0.1)) > 20  # and the bulk


def test_log_cdf_matches_the_mpmath_reference_wherever_the_probability_is_above_1e300():
    """Relative error of the tail probability <= 1e-3 (benchmarks/fidelity/nct_reference.py
    regenerates the reference: mpmath, 20 digits). Upper tails are in it as the lower tail of
    ``-T`` at ``-delta``, i.e. :func:`nct_log_sf`."""
    r, dof, delta, log_p = _reference()
    keep = log_p >= math.log(1e-300)
    assert keep.sum() > 400
    errors = []
    for nu in np.unique(dof):
        at = keep & (dof == nu)
        mine = nct_log_cdf(r[at], nu, delta[at])
        rel = np.abs(np.expm1(mine - log_p[at]))
        errors.append(rel.max())
        bad = np.flatnonzero(rel > 1e-3)
        assert bad.size == 0, [(r[at][i], nu, delta[at][i], mine[i], log_p[at][i]) for i in bad]
    assert max(errors) <= 1e-3


def test_sf_is_the_other_side_and_the_two_sum_to_one():
    r = np.array([-3.0, 0.5, 2.0, 7.0, 40.0])
    for nu, delta in ((1.0, 0.0), (5.0, 2.0), (30.0, 30.0), (1e4, 300.0)):
        total = np.exp(nct_log_cdf(r, nu, delta)) + np.exp(nct_log_sf(r, nu, delta))
        np.testing.assert_allclose(total, 1.0, rtol=1e-9)


def test_bulk_agrees_with_scipy():
    for nu, delta in ((1.0, 0.0), (2.0, 1.0), (7.0, 3.0), (30.0, 5.0), (600.0, 30.0)):
        r = np.linspace(delta - 4, delta + 4, 9)
        np.testing.assert_allclose(
            np.exp(nct_log_cdf(r, nu, delta)), stats.nct.cdf(r, nu, delta), rtol=1e-7, atol=1e-12
        )


def test_infinite_dof_is_the_normal_law_and_the_name_is_still_importable():
    r = np.linspace(-5, 5, 11)
    np.testing.assert_allclose(nct_log_cdf(r, math.inf, 1.0), special.log_ndtr(r - 1.0))
    assert reexported is nct_log_cdf
    with pytest.raises(ValueError, match="dof"):
        nct_log_cdf(r, 0.0, 1.0)


@pytest.mark.parametrize("nu,delta", [(30, 3000.0), (3, 50.0), (1e5, 1e4)])
def test_normal_scores_of_draws_from_the_law_are_standard_normal(nu, delta):
    """The test's exactness in one line: ``Phi^-1(F(T))`` of ``T`` drawn from the law is N(0, 1)
    (Kolmogorov-Smirnov at 4000 draws; the former rule failed this at nu = 30, delta = 3000)."""
    rng = np.random.default_rng([int(nu), int(delta)])
    t = (delta + rng.standard_normal(4000)) / np.sqrt(rng.chisquare(nu, 4000) / nu)
    y = nct_normal_score(t, nu, delta)
    assert stats.kstest(y, "norm").pvalue > 1e-3
    assert np.mean(y > special.ndtri(0.95)) == pytest.approx(0.05, abs=0.012)


@settings(max_examples=30, deadline=None)
@given(st.floats(1.0, 1e6), st.floats(0.0, 1e4), st.floats(-3.0, 3.0))
def test_log_cdf_increases_in_r_and_decreases_in_delta(nu, delta, offset):
    sd = math.sqrt(1 + delta * delta / (2 * nu))
    r = delta + offset * sd
    base = float(nct_log_cdf(r, nu, delta))
    assert float(nct_log_cdf(r + 0.01 * sd, nu, delta)) >= base - 1e-9 * max(1.0, abs(base))
    assert float(nct_log_cdf(r, nu, delta + 0.01)) <= base + 1e-9 * max(1.0, abs(base))


@pytest.mark.parametrize("nu", [1.0, 2.0, 5.0, 30.0, 1e3, 1e5])
def test_zero_noncentrality_is_the_central_t_closed_form_far_into_both_tails(nu):
    """An independent route with no quadrature: at ``delta = 0`` the law is Student's t, whose
    tails scipy computes from the incomplete beta function (exact to 1e-14 against mpmath's
    ``betainc`` where it does not underflow: there it is left out)."""
    r = np.array([-1e6, -1e3, -60.0, -20.0, -3.0, 0.0, 2.0, 10.0, 1e3])
    for mine, exact in (
        (nct_log_cdf(r, nu, 0.0), stats.t.logcdf(r, nu)),
        (nct_log_sf(r, nu, 0.0), stats.t.logsf(r, nu)),
    ):
        kept = exact > -690.0
        assert kept.sum() >= 5
        np.testing.assert_allclose(np.exp(mine[kept] - exact[kept]), 1.0, rtol=1e-6)
