"""Weighted FedAvg end to end (issue #28, "Two answers under weighting"): Flower's
``DifferentialPrivacyServerSideFixedClipping`` around Flower's ``FedAvg`` weighted by
``num-examples`` (node 11 weighs 8, nodes 12 and 13 weigh 5; 2 of 3 sampled per round), inside
``CanaryAuditStrategy``, reporting through the real ``HttpRoundReporter`` into the real service
app and database. The wrapper records each round's ``weight_factor`` (up to 1.6 here); the
service runs the claim tests at the heaviest influence the canaries carried and the verdict
answers the two questions apart:

* noise x 0.5 behind the claim's back: refuted, and the noise is blamed ("the noise falls
  short"), with the weighting named as breaking the claim too;
* correct noise: refuted by the weighting alone, the noise stated as consistent with the claim
  for the weighting used;
* equal weights, correct noise: consistent, nothing said of weighting.
"""

from __future__ import annotations

import random

import httpx
import numpy as np
import pytest
from flwr.app import ArrayRecord
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping

from flaudit.auditor.claims.evidence import recompute
from flaudit.server.http_reporter import HttpRoundReporter
from flaudit.server.wrapper import CanaryAuditStrategy
from tests.integration.flower_weighted.pytorch_example.planted_bug import (
    ShortNoise,  # the worked example's planted bug
)
from tests.server.test_wrapper import CountingFedAvg, LoopGrid

from .conftest import AUTH

K, ROUNDS, DIM = 80, 40, 1000
NODES = (11, 12, 13)
HEAVY = {11: 8, 12: 5, 13: 5}
EXTERNAL = {
    "name": "weighted",
    "engine": "external",
    "num_canaries": K,
    "max_canary_fraction": 1.0,
    "delta": 1e-5,
    "reveal_seed": True,  # flaudit verify recomputes the claim tests from the bundle
}

pytestmark = pytest.mark.usefixtures("flower_task_identity")  # tests/conftest.py


@pytest.fixture(autouse=True)
def fixed_canary_seeds(monkeypatch):
    """Reproducible audits (the service draws canary seeds from the OS; a correct run may
    alarm in up to 5% of runs, the alarm's level, which one CI run cannot tell from a bug)."""
    import flaudit.service.routers.audits as audits_router

    seeds = iter(range(0x5EED_2026_1127_0F1A_0D17_C0DE_0028, 2**128))
    monkeypatch.setattr(audits_router, "new_master_seed", lambda: next(seeds))


HalfNoise = ShortNoise  # the planted bug: half the claimed noise


def _audit(client, *, dp_class, weights, noise_seed=1) -> tuple[dict, CanaryAuditStrategy]:
    body = client.post("/audits", json=EXTERNAL, headers=AUTH).json()
    audit_id, token = (
        body["environment"]["FLAUDIT_AUDIT_ID"],
        body["environment"]["FLAUDIT_RUN_TOKEN"],
    )
    http = httpx.Client(transport=client._transport, base_url="http://testserver")
    reporter = HttpRoundReporter(
        "http://testserver", audit_id, token, client=http, backoff=0.01, retry_seconds=0.05
    )
    np.random.seed(noise_seed)  # Flower's DP noise draws from numpy's global generator
    fedavg = CountingFedAvg(
        fraction_train=2 / 3, min_train_nodes=2, min_available_nodes=3, fraction_evaluate=0.0
    )
    dp = dp_class(fedavg, noise_multiplier=1.0, clipping_norm=1.0, num_sampled_clients=2)
    strategy = CanaryAuditStrategy(dp, reporter=reporter, num_rounds=ROUNDS)
    # reproducible: Flower samples nodes with Python's random, the wrapper picks the nodes the
    # canaries displace with its own generator
    random.seed(noise_seed)
    strategy.audit._slot_rng = np.random.default_rng(noise_seed)
    strategy.start(
        LoopGrid(nodes=NODES, weights=weights, seed=noise_seed),
        ArrayRecord([np.zeros(DIM, np.float32)]),
        num_rounds=ROUNDS,
    )
    reporter.close()
    audit = client.get(f"/audits/{audit_id}").json()
    assert audit["status"] == "succeeded", audit["reason"]
    return audit, strategy


def test_weighted_half_noise_is_blamed_on_the_noise(client):
    audit, strategy = _audit(client, dp_class=HalfNoise, weights=HEAVY)
    assert max(strategy.weight_factors.values()) == pytest.approx(1.6)
    assert audit["max_weight_factor"] == pytest.approx(1.6)
    verdict = audit["verdict"]
    assert verdict["status"] == "claim_refuted", verdict["summary"]
    assert verdict["cause"] == "noise_and_weighting", verdict["summary"]
    assert "the noise falls short: tested at the heaviest client's influence" in verdict["summary"]
    # tested at the heaviest influence a canary carried (at most the run's heaviest)
    tested = verdict["refuted_by"]["claim_mu"]
    assert 1.0 < tested <= 1.6 + 1e-9
    assert "The weighting breaks the claim too" in verdict["summary"]
    assert f"against {tested:.3g}-Gaussian DP" in audit["alarm_guarantee"]
    assert "not the noise" not in verdict["summary"]
    # issue #38: each round with canaries was tested at its own weight, not the running
    # maximum; the bundle carries the factors and flaudit verify recomputes with them
    bundle = client.get(f"/audits/{audit['id']}/evidence", headers=AUTH).json()
    own = [
        max(1.0, r["weight_factor"])
        for r in bundle["statistics"]["rounds"]
        if r["num_canaries_inserted"]
    ]
    assert bundle["statistics"]["known_rounds"]["round_factors"] == pytest.approx(own)
    assert min(own) < max(own)  # the weights differ across rounds here
    checked = recompute(bundle)
    assert checked.ok, str(checked)


def test_weighted_correct_noise_is_refuted_by_the_weighting_not_the_noise(client, caplog):
    from flwr.common.logger import FLOWER_LOGGER

    FLOWER_LOGGER.addHandler(caplog.handler)  # whether or not Flower's logger propagates
    try:
        audit, strategy = _audit(
            client, dp_class=DifferentialPrivacyServerSideFixedClipping, weights=HEAVY
        )
    finally:
        FLOWER_LOGGER.removeHandler(caplog.handler)
    # the wrapper's weighting warning: once per run, though most rounds weigh above 1
    assert sum(f > 1.01 for f in strategy.weight_factors.values()) > 5
    records = {id(r): r for r in caplog.records}.values()  # a record may reach caplog twice
    said = [r.getMessage() for r in records if "weighting by" in r.getMessage()]
    assert len(said) == 1 and "Said once per run" in said[0], said
    verdict = audit["verdict"]
    assert not any(a["level"] == "error" for a in audit["alerts"]), audit["alerts"]
    assert verdict["status"] == "claim_refuted" and verdict["cause"] == "weighting"
    assert verdict["summary"].startswith("Claim refuted by the weighting, not the noise")
    assert "The noise is consistent with the claim for the weighting used" in verdict["summary"]
    assert verdict["weighting"]["heaviest_mu"] == pytest.approx(1.6)
    (alert,) = [a for a in audit["alerts"] if a["message"].startswith("weighted aggregation")]
    assert "protected only at μ = 1.6" in alert["message"]


def test_equal_weights_correct_noise_is_consistent(client):
    audit, strategy = _audit(
        client, dp_class=DifferentialPrivacyServerSideFixedClipping, weights={}
    )
    assert all(f == pytest.approx(1.0) for f in strategy.weight_factors.values())
    verdict = audit["verdict"]
    assert verdict["status"] == "consistent", verdict["summary"]
    assert verdict["cause"] is None and verdict["weighting"] is None
    assert "weight" not in verdict["summary"]
