"""GET /audits/{id} carries the f-DP picture ("tradeoff"): the claimed and mu_lo curves live,
the canaries' empirical curve and band only once the audit has ended (labels are secret before)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from tests.e2e.synthetic_runs import run_synthetic_audit

from .conftest import API_KEY


@pytest.fixture
def keyed(client):
    client.headers["Authorization"] = f"Bearer {API_KEY}"
    return client


def test_tradeoff_of_an_ended_audit(keyed):
    audit_id = run_synthetic_audit(
        keyed, name="tradeoff", num_canaries=60, noise_multiplier=2.0, actual_noise=2.0, dim=500
    )
    picture = keyed.get(f"/audits/{audit_id}").json()["tradeoff"]
    alpha = np.asarray(picture["alpha"])
    assert picture["claim_mu"] == pytest.approx(0.5)  # sqrt(1) / 2, the known-rounds claim
    np.testing.assert_allclose(picture["claim"], stats.norm.cdf(stats.norm.ppf(1 - alpha) - 0.5))
    assert picture["num_seen"] > 0 and len(picture["empirical"]) == alpha.size
    assert all(b <= e for b, e in zip(picture["band"], picture["empirical"]))
    estimates = keyed.get(f"/audits/{audit_id}").json()["estimates"]
    final_mu = [
        e["details"]["mu"]
        for e in estimates
        if e["estimator"] == "normal_scores" and e["threat_model"] == "final_model"
    ]
    assert picture["mu_lo_value"] == pytest.approx(final_mu[0])


def test_no_empirical_curve_while_the_labels_are_secret(keyed):
    spec = {"name": "live", "engine": "external", "num_canaries": 15, "max_canary_fraction": 1.0}
    body = keyed.post("/audits", json=spec).json()
    token = {"Authorization": f"Bearer {body['environment']['FLAUDIT_RUN_TOKEN']}"}
    claim = {
        "noise_multiplier": 1.0,
        "clip_norm": 1.0,
        "num_rounds": 3,
        "num_clients": 10,
        "clients_per_round": 5,
    }
    assert keyed.put(f"/audits/{body['id']}/claim", json=claim, headers=token).status_code == 200
    picture = keyed.get(f"/audits/{body['id']}").json()["tradeoff"]
    assert picture["claim"] is not None and picture["claim_mu"] == pytest.approx(1.0)
    assert picture["empirical"] is None and picture["band"] is None and picture["num_seen"] == 0
