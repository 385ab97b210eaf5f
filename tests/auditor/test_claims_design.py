"""Audit design and the f-DP tier's mu_lo: invariants and an independent route."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import special

from flaudit.auditor.claims import audit_design
from flaudit.auditor.claims.alarm import look_level
from flaudit.auditor.claims.curve_tests import _guess_game_feasible
from flaudit.auditor.claims.curves import GaussianDPClaim
from flaudit.auditor.claims.fdp import fdp_mu_lo
from flaudit.auditor.claims.nct import nct_normal_score
from flaudit.auditor.claims.tiers import AlarmTest


def _spec(k=1000, z=1.0, r=1, T=10, delta=1e-6):
    return SimpleNamespace(
        num_canaries=k, accounted_noise_multiplier=z, canary_repeats=r, num_rounds=T, delta=delta
    )


def _infeasible(mu, correct, guesses, m, level):
    return not bool(
        _guess_game_feasible(GaussianDPClaim(mu), np.array([level]), correct, guesses, m)[0]
    )


@pytest.mark.parametrize(
    "correct,guesses,m,level",
    [(40, 40, 200, 0.01), (35, 40, 200, 0.05), (8, 8, 40, 0.01), (90, 100, 500, 0.01)],
)
def test_fdp_mu_lo_sits_on_the_feasibility_boundary(correct, guesses, m, level):
    mu = fdp_mu_lo(correct, guesses, m, level)
    if mu == 0.0:
        assert not _infeasible(1e-6, correct, guesses, m, level)
    else:
        assert _infeasible(mu, correct, guesses, m, level)  # refuted at mu_lo (valid)
        assert not _infeasible(mu + 5e-3, correct, guesses, m, level)  # and not much above


def test_design_contract_fields_and_no_claim():
    design = audit_design(_spec())
    data = design.to_dict()
    for key in (
        "claim_mu",
        "claim_epsilon",
        "delta",
        "detectable_noise_scale",
        "detectable_mu",
        "detectable_epsilon",
        "max_refutable_mu",
        "testable",
        "summary",
        "advice",
    ):
        assert key in data
    assert design.claim_mu == pytest.approx(1.0) and design.testable and design.advice is None
    none = audit_design(_spec(z=0.0))
    assert none.claim_mu is None and not none.testable and "No DP claim" in none.summary


def test_more_canaries_or_repeats_detect_smaller_bugs():
    scales = [audit_design(_spec(k=k)).detectable_noise_scale for k in (50, 200, 1000, 5000)]
    assert all(a < b for a, b in zip(scales, scales[1:]))
    assert audit_design(_spec(k=200, r=4, T=12)).detectable_noise_scale > scales[1]
    for s in scales:
        assert 0 < s < 1


def test_tiny_audit_is_not_testable_and_says_what_would_make_it():
    design = audit_design(_spec(k=6, z=2.0))
    assert not design.testable
    needed = int(design.advice.split("at least ")[1].split()[0])
    assert needed > 6 and audit_design(_spec(k=needed, z=2.0)).testable
    # about 3 of 6 canaries are seen, so the sentence must not say none are: in the unluckiest
    # 5% of runs, too few are
    assert (
        design.summary == "Cannot catch any bug in 95% of runs: with 6 canaries, too few are seen."
    )


def test_detectable_noise_scale_matches_its_closed_form():
    design = audit_design(_spec(k=1000))
    n = design.expected_seen_participations
    from scipy import special

    from flaudit.auditor.claims.alarm import look_level
    from flaudit.auditor.claims.tiers import AlarmTest

    a = look_level(AlarmTest.known_rounds_normal_scores, 11, 11)
    z_sum = special.ndtri(1 - a) + special.ndtri(0.95)
    assert design.detectable_noise_scale == pytest.approx(1 / (1 + z_sum / math.sqrt(n)))


@pytest.mark.parametrize("k,dim,rounds", [(900, 1000, 1), (900, 1000, 4), (400, 1000, 1)])
def test_design_with_the_models_size_keeps_its_promise_where_the_known_scale_does_not(
    k, dim, rounds
):
    """Monte Carlo of the exact known-rounds test (rounds' studentized sums, noncentral t with
    d - k degrees of freedom) at the design's s*: about 95% with ``dim``; the known-scale s* is
    larger (an optimistic promise) and caught less often."""
    spec = _spec(k=k, z=1.0, r=1, T=rounds)
    accounted, known = audit_design(spec, dim=dim), audit_design(spec)
    assert accounted.scale_dof == dim - k and known.scale_dof is None
    assert accounted.detectable_noise_scale < known.detectable_noise_scale
    nu, per_round = dim - k, accounted.expected_seen_participations / rounds
    crit = float(
        special.ndtri(1 - look_level(AlarmTest.known_rounds_normal_scores, rounds + 1, rounds + 1))
    )
    rng = np.random.default_rng([k, dim, rounds])
    runs = 3000

    def power(s):
        r = (math.sqrt(per_round) / s + rng.standard_normal((runs, rounds))) / np.sqrt(
            rng.chisquare(nu, (runs, rounds)) / nu
        )
        y = nct_normal_score(r, nu, math.sqrt(per_round))
        return float(np.mean(y.sum(axis=1) / math.sqrt(rounds) > crit))

    assert 0.93 <= power(accounted.detectable_noise_scale) <= 0.97  # 3000 runs: sd 0.004
    if k == 900:
        assert power(known.detectable_noise_scale) < 0.9


def test_design_with_a_huge_model_is_the_known_scale_design():
    spec = _spec(k=1000, T=10)
    assert audit_design(spec, dim=10**9).detectable_noise_scale == pytest.approx(
        audit_design(spec).detectable_noise_scale, rel=1e-5
    )


@pytest.mark.parametrize(
    "k,r,T", [(39, 1, 10), (100, 1, 5), (300, 2, 10), (1000, 1, 10), (5000, 4, 20)]
)
def test_the_printed_promise_rounds_toward_what_the_audit_keeps(k, r, T):
    """Issue #38 (b): "catches noise x s or smaller" holds for any s below s*, so the printed
    factor is s* rounded down (never up: 0.8162 printed 0.82 promised 95% where 93.8% held);
    "mu >= m" holds for any m above, so mu and epsilon are rounded up."""
    import re

    design = audit_design(_spec(k=k, r=r, T=T))
    found = re.search(
        r"noise × ([0-9.]+) or smaller \(μ ≥ ([0-9.]+), ε ≥ ([0-9.]+)", design.summary
    )
    factor, mu, eps = (float(x) for x in found.groups())
    s_star = design.detectable_noise_scale
    assert factor <= s_star < factor + 0.01
    assert mu >= design.detectable_mu and eps >= design.detectable_epsilon
    assert mu >= design.claim_mu / factor * (1 - 1e-3)  # the run at the printed factor


def test_adaptive_clipping_design_is_on_the_update_noise_the_canaries_meet():
    """Issue #38: the round's accounting counts the clipped count's noise too (z_total), but
    the canaries meet only the updates' z: the design (and the claim tests) are for that
    mechanism, so an adaptive-clipping design is the fixed-clipping one at the update z, not at
    z_total; and since Flower noises each round for the clip norm after its update (up to
    ``exp(eta gamma + (eta sigma_b / n)^2 / 2)`` times what the canaries' norm needs, on
    average), its factor is divided by that bound and the sentence says so."""
    from flaudit.auditor.noise_calibration import clip_growth_bound
    from flaudit.auditor.spec import AuditSpec

    spec = AuditSpec(
        num_canaries=300,
        num_clients=1000,
        clip_norm=None,
        noise_multiplier=1.0,
        clients_per_round=20,
        adaptive_clipping={"clipped_count_stddev": 2.0},
    )
    z_total = spec.accounted_noise_multiplier
    assert z_total == pytest.approx((1 + 0.25) ** -0.5)
    design = audit_design(spec)
    on_updates = audit_design(_spec(k=300, z=1.0, T=spec.num_rounds, delta=spec.delta))
    on_total = audit_design(_spec(k=300, z=z_total, T=spec.num_rounds, delta=spec.delta))
    growth = math.exp(0.2 * 0.5 + (0.2 * 2.0 / 20) ** 2 / 2)  # Flower's eta, gamma; sigma_b, n
    assert clip_growth_bound(spec) == pytest.approx(growth)
    assert design.detectable_noise_scale == pytest.approx(
        on_updates.detectable_noise_scale / growth
    )
    assert design.detectable_mu == pytest.approx(on_updates.detectable_mu * growth)
    assert on_total.detectable_noise_scale > on_updates.detectable_noise_scale  # the old promise
    assert "allowing for adaptive clipping's noise for the next clip norm (up to 1.11×" in (
        design.summary
    )
    assert "allowing for" not in on_updates.summary
