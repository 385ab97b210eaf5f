"""The record-level math (auditor/estimators/record_level.py): the claim composed over every
DP-SGD step of every round a client trained equals dp-accounting's direct computation and grows
with the rounds; the seeded per-step canary sums are the sums of the sampled canaries; the
cosine score of an update is taken along -Delta."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from flaudit.auditor.canaries import OrthogonalCanaries, seen_mask
from flaudit.auditor.estimators.record_level import (
    SeededRecordCanaries,
    record_canary_cosines,
    record_level_epsilon,
    record_level_per_round_epsilon,
    record_level_steps,
)

SEED = 4242
Z, Q, S, DELTA = 1.0, 0.02, 50, 1e-5


def _direct(steps: int) -> dict[str, float]:
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(Z)), steps
    )
    rdp = rdp_privacy_accountant.RdpAccountant(
        orders=[float(a) for a in range(2, 65)] + [80.0, 96.0, 128.0, 192.0, 256.0, 512.0, 1024.0]
    )
    pld = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    return {
        "rdp": rdp.compose(event).get_epsilon(DELTA),
        "pld": pld.compose(event).get_epsilon(DELTA),
    }


def test_the_run_claim_is_dp_accountings_composition_over_every_step_and_grows_with_rounds():
    previous = {"rdp": 0.0, "pld": 0.0}
    for rounds in (1, 2, 5):
        results = record_level_epsilon(Z, Q, S, DELTA, rounds_trained=rounds)
        got = {r.details["accountant"]: r.epsilon for r in results}
        direct = _direct(S * rounds)
        assert got["rdp"] == pytest.approx(direct["rdp"], rel=1e-9)
        assert got["pld"] == pytest.approx(direct["pld"], rel=1e-9)
        assert got["rdp"] > previous["rdp"] and got["pld"] > previous["pld"]
        previous = got
        assert {r.threat_model for r in results} == {"record_level"}
        assert all(r.details["steps"] == S * rounds for r in results)


def test_per_round_epsilon_is_one_round_and_below_the_run():
    per_round = {
        r.details["accountant"]: r.epsilon for r in record_level_per_round_epsilon(Z, Q, S, DELTA)
    }
    run = {
        r.details["accountant"]: r.epsilon
        for r in record_level_epsilon(Z, Q, S, DELTA, rounds_trained=10)
    }
    assert per_round["pld"] == pytest.approx(_direct(S)["pld"], rel=1e-9)
    assert per_round["pld"] < run["pld"] and per_round["rdp"] < run["rdp"]


def test_rounds_with_different_step_counts_add_up():
    assert record_level_steps([10, 20, 5], None) == 35
    assert record_level_steps(7, 3) == 21
    by_list = record_level_epsilon(Z, Q, [10, 20, 5], DELTA)
    assert by_list[0].epsilon == pytest.approx(_direct(35)["rdp"], rel=1e-9)
    for bad in (
        dict(steps_per_round=7, rounds_trained=None),
        dict(steps_per_round=7, rounds_trained=0),
        dict(steps_per_round=[], rounds_trained=None),
        dict(steps_per_round=[3, 0], rounds_trained=None),
        dict(steps_per_round=[3, 4], rounds_trained=3),
    ):
        with pytest.raises(ValueError):
            record_level_steps(**bad)
    with pytest.raises(ValueError, match="sample_rate"):
        record_level_epsilon(Z, 0.0, S, DELTA, rounds_trained=1)
    assert record_level_epsilon(0.0, Q, S, DELTA, rounds_trained=1)[0].epsilon == np.inf


def test_step_sums_are_the_sums_of_the_sampled_seen_canaries():
    d, k = 96, 40
    mask = seen_mask(SEED, k)
    source = SeededRecordCanaries(SEED, mask, sample_rate=0.3)
    family = OrthogonalCanaries(SEED, d)
    for step in range(5):
        sampled = source.sampled(step)
        assert set(sampled) <= set(np.flatnonzero(mask))
        expected = family.vectors(sampled).astype(np.float64).sum(axis=0)
        np.testing.assert_allclose(source.step_canary_sum(step, d), expected, atol=1e-5)
    assert str(SEED) not in repr(source)
    with pytest.raises(ValueError, match="dimension"):
        source.step_canary_sum(0, k - 1)
    with pytest.raises(ValueError, match="step"):
        source.sampled(-1)


def test_the_cosine_is_taken_along_minus_the_update():
    d = 64
    family = OrthogonalCanaries(SEED, d)
    c = family.vectors([3, 7]).astype(np.float64)
    update = -0.2 * c[0] + 0.05 * c[1]  # SGD: an included canary pushes Delta along -c_j
    cos = record_canary_cosines(update, family, [3, 7, 11])
    norm = np.linalg.norm(update)
    np.testing.assert_allclose(cos, [0.2 / norm, -0.05 / norm, 0.0], atol=1e-6)
    with pytest.raises(ValueError, match="nonzero"):
        record_canary_cosines(np.zeros(d), family, [0])
    with pytest.raises(ValueError, match="dimension"):
        record_canary_cosines(np.ones(d + 1), family, [0])
