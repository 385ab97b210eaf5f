"""Our Gaussian-DP bound with the null from unseen canaries against the peer's
(jax_privacy ``epsilon_from_gdp``, reimplemented in benchmarks/fidelity/peer_gdp.py): valid, and
at least as powerful as the peer's valid part on the same scores. Small Monte Carlo; the full
table is docs/fidelity.md ("Peer")."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.fidelity._common import binomial_limit
from benchmarks.fidelity.peer_gdp import peer_gdp_mu, roc_hull
from flaudit.auditor.estimators.gdp import gdp_lower_bound
from flaudit.auditor.estimators.lower_bound import GDP_BONFERRONI, Bonferroni


def _scores(rng, k, mu):
    return rng.normal(mu, 1.0, k // 2), rng.normal(0.0, 1.0, k - k // 2)


def test_roc_hull_is_concave_and_spans_the_counts():
    rng = np.random.default_rng(0)
    seen, unseen = _scores(rng, 300, 1.0)
    fn, tn = roc_hull(seen, unseen)
    assert (fn[0], tn[0]) == (0, 0) and (fn[-1], tn[-1]) == (seen.size, unseen.size)
    slopes = np.diff(tn) / np.maximum(np.diff(fn), 1e-12)
    assert np.all(np.diff(fn) >= 0) and np.all(np.diff(slopes) < 0)


def test_gdp_bonferroni_places_its_thresholds_where_asked():
    assert GDP_BONFERRONI.num_thresholds == 2
    assert list(GDP_BONFERRONI.seen_quantiles()) == [0.15, 0.30]
    assert np.allclose(Bonferroni(4).seen_quantiles(), [0.125, 0.375, 0.625, 0.875])
    with pytest.raises(ValueError, match="quantiles"):
        Bonferroni(quantiles=(0.2, 1.0))


def test_a_true_claim_is_rarely_refuted_by_ours_but_often_by_the_peer_as_shipped():
    # ours: 1400 runs, at most 96 above mu (binomial_limit: a correct 5% bound fails with
    # probability 9.7e-4, one above the truth in 8% of runs with probability 0.94)
    rng = np.random.default_rng(1)
    check = binomial_limit(1400, 0.05, false_fail=1e-3, against=0.08)
    assert check.power >= 0.9, str(check)
    ours = peer = 0
    for run in range(check.runs):
        seen, unseen = _scores(rng, 200, 1.0)  # the mechanism sits exactly on mu = 1
        ours += gdp_lower_bound(seen, unseen, delta=1e-6).mu > 1.0
        if run < 200:
            peer += peer_gdp_mu(seen, unseen) > 1.0
    assert check.passes(ours), (ours, str(check))
    # the peer's |mu| reuses upper rate bounds for the reversed rule: far above its 5%
    assert peer / 200 > 0.15


def test_ours_refutes_at_least_as_often_as_the_peers_valid_part():
    rng = np.random.default_rng(2)
    runs, ours, peer = 150, 0, 0
    for _ in range(runs):
        seen, unseen = _scores(rng, 400, 1.5)
        ours += gdp_lower_bound(seen, unseen, delta=1e-6).mu > 1.0
        peer += peer_gdp_mu(seen, unseen, signed=True) > 1.0
    assert ours >= peer
