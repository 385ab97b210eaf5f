"""The service's record-level look over client groups
(:mod:`flaudit.auditor.claims.record_external`): each canary's claimed signal at its own client's
noise multiplier, and the noise multiplier the verdict names."""

from __future__ import annotations

import numpy as np
import pytest

from flaudit.auditor.claims.record_external import (
    record_external_look,
    record_external_noise_multiplier,
    record_external_signals,
)


def test_signals_use_each_clients_own_noise_multiplier():
    owner = np.array([0, 1, 0, 1, 2])
    sums = np.array([2.0, 3.0, 0.0, 1.0, 4.0])
    squares = np.array([4.0, 9.0, 1.0])
    clients = [
        {"noise_multiplier": 1.0, "sample_rate": 0.1, "steps": 4},
        {"noise_multiplier": 1.5, "sample_rate": 0.1, "steps": 9},
        {"noise_multiplier": 0.0, "sample_rate": 0.1, "steps": 1},  # no claim: no signal
    ]
    got = record_external_signals(sums, squares, owner, clients)
    np.testing.assert_allclose(got, [2 / (1 * 2), 3 / (1.5 * 3), 0, 1 / (1.5 * 3), 0])


def test_the_verdict_names_the_rejecting_groups_noise_multiplier():
    rng = np.random.default_rng(0)
    k, dim = 40, 400
    owner = np.arange(k) % 2
    seen = np.arange(k) % 4 < 2
    clients = [
        {"noise_multiplier": 1.0, "sample_rate": 0.2, "steps": 10},
        {"noise_multiplier": 1.5, "sample_rate": 0.2, "steps": 10},
    ]
    signals = np.where(seen, 0.5, 0.0)
    cosines = rng.standard_normal(k) / np.sqrt(dim)
    cosines[seen & (owner == 0)] += 3.0 / np.sqrt(dim)  # client 0 leaks far more than claimed
    look = record_external_look(
        cosines, seen, owner, clients, signals=signals, dim=dim, look=1, num_looks=2, delta=1e-5
    )
    assert look["status"] == "error"
    assert [g["status"] for g in look["groups"]] == ["error", "ok"]
    assert record_external_noise_multiplier([look], clients) == 1.0
    calm = {**look, "rejected": [], "status": "ok"}
    assert record_external_noise_multiplier([calm], clients) == 1.5
    with pytest.raises(ValueError, match="signals"):
        record_external_look(
            cosines,
            seen,
            owner,
            clients,
            signals=np.ones(k),
            dim=dim,
            look=1,
            num_looks=2,
            delta=1e-5,
        )
