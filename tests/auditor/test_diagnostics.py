import math
import warnings

import numpy as np
import pytest
from scipy import stats

from flaudit.auditor.estimators import anderson_darling, bootstrap_interval, unseen_vs_null
from flaudit.auditor.estimators.diagnostics import _ad_statistic


def test_anderson_darling_statistic_matches_scipy():
    x = np.random.default_rng(0).normal(size=300)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # scipy 1.17 asks for a p-value method
        reference = stats.anderson(x, dist="norm").statistic
    assert _ad_statistic(x) == pytest.approx(reference, rel=1e-9)


def test_anderson_darling_flags_non_gaussian():
    rng = np.random.default_rng(1)
    assert anderson_darling(rng.normal(size=500), name="seen").ok
    bad = anderson_darling(
        np.concatenate([rng.normal(-3, 1, 250), rng.normal(3, 1, 250)]), name="seen"
    )
    assert not bad.ok and "trust epsilon_lo" in bad.hint
    few = anderson_darling([0.1, 0.2], name="seen")
    assert few.details["checked"] is False


def test_unseen_vs_null():
    rng = np.random.default_rng(2)
    d = 2000
    good = unseen_vs_null(rng.normal(0, 1 / math.sqrt(d), 500), d)
    assert good.ok
    shifted = unseen_vs_null(rng.normal(3 / math.sqrt(d), 1 / math.sqrt(d), 500), d)
    assert not shifted.ok and "null" in shifted.hint


def test_bootstrap_interval_contains_point_and_handles_inf():
    rng = np.random.default_rng(3)
    seen = rng.normal(1, 1, 300)
    diag = bootstrap_interval(
        lambda s, _u: float(np.mean(s)),
        seen,
        None,
        name="mean",
        point=float(seen.mean()),
        num_resamples=200,
    )
    assert diag.details["lower"] <= seen.mean() <= diag.details["upper"]
    assert diag.details["upper"] - diag.details["lower"] == pytest.approx(
        2 * 1.645 / math.sqrt(300), rel=0.3
    )
    inf = bootstrap_interval(
        lambda s, _u: math.inf, seen, None, name="x", point=math.inf, num_resamples=5
    )
    assert not inf.ok and not math.isnan(inf.value)
