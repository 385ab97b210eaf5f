"""The simulator's known-rounds statistic and the Gaussian-DP alarm: the scores follow the
claimed law on a correct run, halved noise is caught at k = 1000, and a correct run stays quiet
at every look."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.fidelity._common import end_statistics
from benchmarks.fidelity.gdp_bugs import BASE
from flaudit.auditor.claims import AuditLook, decide_alarm, summarize
from flaudit.auditor.claims.curve_tests import claim_test
from flaudit.server.simulated_audit import (
    DPBug,
    simulate_dpfedavg_audit,
    simulation_claims,
)

#: benchmarks/fidelity/gdp_bugs.py's run (k = 1000, z = 1, momentum 0.9, claim mu = 1), smaller.
SMALL = BASE.with_(dim=5000, num_clients=500, clients_per_round=50, num_rounds=5)


def _known(result):
    scores = result.known_rounds_scores
    return scores[result.seen], scores[~result.seen]


def test_correct_run_scores_follow_the_claim():
    result = simulate_dpfedavg_audit(SMALL, seed=11)
    s, u = _known(result)
    # every canary counted once (seen: inserted round; unseen: a round by the same rule)
    assert np.all(np.isfinite(s)) and np.all(np.isfinite(u))
    # seen ~ N(sqrt(r)/z, 1) = N(1, 1) up to the clients' small projections; unseen ~ N(0, 1)
    assert abs(s.mean() - 1.0) < 0.2 and abs(u.mean()) < 0.15
    assert 0.85 < u.std() < 1.15 and 0.8 < s.std() < 1.25
    claims = simulation_claims(SMALL)
    assert claims[0].mu == pytest.approx(1.0)
    # the history ends at the final scores; the first round has fewer canaries counted
    np.testing.assert_array_equal(result.known_rounds_history[-1], result.known_rounds_scores)
    assert np.isnan(result.known_rounds_history[0]).sum() > 0


def test_halved_noise_is_an_error_alarm_at_k_1000():
    config = SMALL.with_(bug=DPBug.noise_scale, bug_factor=0.5)
    result = simulate_dpfedavg_audit(config, seed=12)
    s, u = _known(result)
    assert s.mean() > 1.6  # mu doubled (2) minus the clients' projections
    claims = simulation_claims(SMALL)  # the honest claim: it never knows the bug
    summary = summarize(
        AuditLook(
            seen=result.seen,
            dim=result.dim,
            delta=1e-6,
            **end_statistics(result),
            scale_dof=result.scale_dof,
            claims=claims,
        )
    )
    looks = config.num_rounds + 1
    decision = decide_alarm(summary.claim_tests, look=looks, num_looks=looks, claims=claims)
    assert decision.status == "error"


def test_noise_scale_bug_factor_checked():
    with pytest.raises(ValueError, match="bug_factor"):
        SMALL.with_(bug=DPBug.noise_scale, bug_factor=0.0)
    with pytest.raises(ValueError, match="bug_factor"):
        SMALL.with_(bug=DPBug.no_clipping, bug_factor=0.5)


@pytest.mark.slow
def test_correct_runs_rarely_reject_the_known_rounds_claim():
    """20 small correct runs (fixed and adaptive clipping, momentum 0.9): the known-rounds claim
    test at 5% rejects in at most 3 (binomial(20, 0.05) exceeds 3 with probability 1.6%).

    A smoke check of the simulator end to end, not a validity test: a test whose true size is
    8% passes it 93% of the time. The claim test's validity with binomial limits (1400 runs,
    power 0.94 against 8%): tests/auditor/test_gdp.py."""
    config = SMALL.with_(num_canaries=300, dim=3000)
    claims = simulation_claims(config)
    rejections = 0
    for seed in range(20):
        run = config.with_(adaptive_clipping=seed % 2 == 1)
        result = simulate_dpfedavg_audit(run, seed=100 + seed)
        s, u = _known(result)
        claim = simulation_claims(run)[0] if run.adaptive_clipping else claims[0]
        rejections += claim_test(s, u, claim=claim).rejected(0.05)
    assert rejections <= 3
