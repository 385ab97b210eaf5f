"""Adaptive clipping as Flower runs it (issue #38), with Flower's real adaptive wrappers driven
directly (no Ray): the claim carries the configured z, sigma_b and the update noise z_delta the
canaries meet, the design is sized on z_delta, and every round records the clip norm its updates
were clipped to and the (smaller or larger) one Flower noised for."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import FLOWER_LOGGER
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    FedAvg,
)
from flwr.supercore.differential_privacy import KEY_NORM_BIT

from flaudit.auditor.claims.curves import audit_claims
from flaudit.auditor.claims.design import audit_design
from flaudit.auditor.noise_calibration import noise_calibration, noise_split_sentence
from flaudit.auditor.spec import AuditClaim, AuditSpec
from flaudit.server.noise_calibration import (
    alarm_line,
    configured_noise_multiplier,
    log_alarm,
    update_noise_multiplier,
)
from flaudit.server.reporting import LocalRoundReporter
from flaudit.server.wrapper import CanaryAuditStrategy, LocalCanaries, read_claim
from tests.flower_rounds import dp_fedavg

SEED, K = 4242, 6
Z_DELTA = 3**0.5 * 2 / 3  # (1 - 1/4)^(-1/2): z = 1, sigma_b = 1

pytestmark = pytest.mark.usefixtures("flower_task_identity")  # tests/conftest.py


class Grid3:
    def get_node_ids(self):
        return [1, 2, 3]


def _replies(messages, current, updates, metrics):
    out = []
    for msg, u, m in zip(messages, updates, metrics):
        vec = current + u
        content = RecordDict(
            {
                "arrays": ArrayRecord([vec[:600].reshape(20, 30), vec[600:]]),
                "metrics": MetricRecord(m),
            }
        )
        out.append(Message(content=content, reply_to=msg))
    return out


def test_the_split_of_z_matches_flowers_own_arithmetic():
    for z, sigma_b in ((1.0, 1.0), (0.7, 0.5), (2.0, 3.0)):
        dp = DifferentialPrivacyServerSideAdaptiveClipping(
            FedAvg(), noise_multiplier=z, num_sampled_clients=4, clipped_count_stddev=sigma_b
        )
        assert dp.noise_multiplier == pytest.approx(update_noise_multiplier(z, sigma_b))
        assert configured_noise_multiplier(dp.noise_multiplier, sigma_b) == pytest.approx(z)
    assert update_noise_multiplier(1.0, 1.0) == pytest.approx(Z_DELTA)
    with pytest.raises(ValueError, match="2 \\* sigma_b"):
        update_noise_multiplier(1.0, 0.5)  # Flower refuses it too (n/20 with n < 11 at z = 1)


@pytest.mark.parametrize("api", ["message", "legacy"])
def test_the_claim_carries_the_configured_z_sigma_b_and_the_update_noise(api):
    if api == "message":
        dp = DifferentialPrivacyServerSideAdaptiveClipping(
            FedAvg(), noise_multiplier=1.0, num_sampled_clients=4, clipped_count_stddev=1.0
        )
    else:
        from flwr.server.strategy import DifferentialPrivacyServerSideAdaptiveClipping as Legacy
        from flwr.server.strategy import FedAvg as LegacyFedAvg

        dp = Legacy(
            LegacyFedAvg(), noise_multiplier=1.0, num_sampled_clients=4, clipped_count_stddev=1.0
        )
    claim = read_claim(dp, num_rounds=25, num_nodes=4)
    assert claim["configured_noise_multiplier"] == pytest.approx(1.0)
    assert claim["noise_multiplier"] == pytest.approx(Z_DELTA)
    assert claim["adaptive_clipping"]["clipped_count_stddev"] == 1.0
    sentence = noise_split_sentence(claim)
    assert sentence.startswith(
        "noise multiplier 1 as configured; with clipped-count noise "
        "sigma_b = 1 the updates get 1.155"
    )
    assert sentence.endswith("which is what the canaries meet")
    spec = AuditClaim.model_validate(claim).apply(
        AuditSpec(num_canaries=32, clip_norm=1.0, max_canary_fraction=1.0, engine="external")
    )
    assert spec.configured_noise_multiplier == pytest.approx(1.0)
    # the design and the claim tests are on the update noise, not on z_total (0.756)
    assert spec.accounted_noise_multiplier == pytest.approx(0.756, abs=1e-3)
    assert audit_design(spec).claim_mu == pytest.approx(1 / Z_DELTA)
    assert audit_claims(spec)[0].mu == pytest.approx(1 / Z_DELTA)
    fixed = AuditSpec(num_canaries=32, clip_norm=1.0, noise_multiplier=Z_DELTA)
    # the fixed-clipping design at z_delta, divided by the clip norm's growth bound (Flower
    # noises each round for the norm after its update: exp(0.2 * 0.5 + (0.2 * 1 / 4)^2 / 2))
    growth = math.exp(0.1 + (0.2 / 4) ** 2 / 2)
    assert audit_design(spec).detectable_noise_scale == pytest.approx(
        audit_design(fixed).detectable_noise_scale / growth
    )
    assert "(up to 1.11× what the canaries' norm needs" in audit_design(spec).summary
    assert noise_split_sentence(fixed) is None


def _adaptive_audit(inner, *, rounds=5, reporter=None):
    reporter = reporter or LocalRoundReporter.for_audit(canary_seed=SEED, num_canaries=K)
    canaries = LocalCanaries(
        SEED, num_canaries=K, num_rounds=rounds, canary_repeats=1, clients_per_round=3
    )
    return CanaryAuditStrategy(
        inner, reporter=reporter, canaries=canaries, num_rounds=rounds
    ), reporter


def _drive(strategy, inner, *, rounds, update_norm, metrics):
    """Flower's loop by hand: configure, replies of norm ``update_norm``, aggregate."""
    rng = np.random.default_rng(7)
    model = rng.standard_normal(630).astype(np.float32)
    before, after = [], []
    for t in range(1, rounds + 1):
        arrays = ArrayRecord([model[:600].reshape(20, 30), model[600:]])
        messages = list(strategy.configure_train(t, arrays, ConfigRecord({}), Grid3()))
        before.append(float(inner.clipping_norm))
        updates = [
            u / np.linalg.norm(u) * update_norm
            for u in rng.standard_normal((len(messages), 630)).astype(np.float32)
        ]
        new_arrays, _ = strategy.aggregate_train(
            t, _replies(messages, model, updates, [dict(metrics)] * len(messages))
        )
        after.append(float(inner.clipping_norm))
        model = np.concatenate([a.ravel() for a in new_arrays.to_numpy_ndarrays()])
    strategy.flush()
    return before, after


@pytest.mark.parametrize("side", ["server", "client"])
def test_each_round_records_the_clip_norm_and_the_norm_flower_noised_for(side, caplog):
    np.random.seed(3)
    fedavg = FedAvg(min_train_nodes=3, min_available_nodes=3, fraction_evaluate=0.0)
    wrapper = {
        "server": DifferentialPrivacyServerSideAdaptiveClipping,
        "client": DifferentialPrivacyClientSideAdaptiveClipping,
    }[side]
    inner = wrapper(
        fedavg,
        noise_multiplier=1.0,
        num_sampled_clients=3,
        initial_clipping_norm=0.5,
        clipped_count_stddev=1.0,
    )
    strategy, reporter = _adaptive_audit(inner)
    FLOWER_LOGGER.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING):
            # every real update clipped (server side) / flagged clipped (client side): Flower
            # shrinks the clip norm each round, then noises for the smaller one
            before, after = _drive(
                strategy,
                inner,
                rounds=5,
                update_norm=2.0,
                metrics={"num-examples": 5, KEY_NORM_BIT: 1},
            )
    finally:
        FLOWER_LOGGER.removeHandler(caplog.handler)
    metas = [meta for _, meta in reporter.rounds]
    assert [m.clip_norm for m in metas] == pytest.approx(before)
    assert [m.noise_clip_norm for m in metas] == pytest.approx(after)
    assert [m.noise_stddev for m in metas] == pytest.approx(
        [inner.noise_multiplier * a for a in after]
    )
    factors = strategy.audit.calibration.factors
    assert [factors[t] for t in range(1, 6)] == pytest.approx(
        [a / b for a, b in zip(after, before)]
    )
    assert sum(f < 1 for f in factors.values()) >= 3  # mostly shrinking: the finding
    said = {
        r.getMessage() for r in caplog.records if "added the noise for clip norm" in r.getMessage()
    }
    assert len(said) == 1 and "Said once per run" in next(iter(said))
    least = strategy.audit.calibration.min_factor
    finding = noise_calibration({"noise_multiplier": inner.noise_multiplier}, least)
    assert finding["effective_noise_multiplier"] == pytest.approx(inner.noise_multiplier * least)


def test_a_fixed_clip_norm_is_noised_for_itself():

    inner = dp_fedavg(1.0, 0.5)
    strategy, reporter = _adaptive_audit(inner, rounds=2)
    _drive(strategy, inner, rounds=2, update_norm=2.0, metrics={"num-examples": 5})
    assert all(meta.noise_clip_norm == meta.clip_norm == 0.5 for _, meta in reporter.rounds)
    assert (
        noise_calibration({"noise_multiplier": 1.0}, strategy.audit.calibration.min_factor) is None
    )


def test_the_serverapp_logs_the_alarm_once_with_its_cause(caplog):
    class Reporter:
        stop_reason = None

    reporter = Reporter()
    assert alarm_line({"alarm": None}) is None
    ack = {
        "alarm": "error",
        "stop": False,
        "alarm_round": 7,
        "alarm_cause": "possible DP bug or wrong claim: the known-rounds claim is rejected",
    }
    FLOWER_LOGGER.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING):
            log_alarm(reporter, ack)
            log_alarm(reporter, {**ack, "stop": True, "stop_reason": "claim refuted at round 7"})
    finally:
        FLOWER_LOGGER.removeHandler(caplog.handler)
    lines = {r.getMessage() for r in caplog.records if "DP alarm fired" in r.getMessage()}
    assert lines == {
        (
            "flaudit: the DP alarm fired at round 7: possible DP bug or wrong claim: "
            "the known-rounds claim is rejected"
        )
    }
    assert reporter.stop_reason == "claim refuted at round 7"


def test_the_legacy_wrapper_records_the_norms_of_flowers_legacy_adaptive_wrapper():
    """``flwr.server.strategy.DifferentialPrivacyServerSideAdaptiveClipping`` as
    ``LegacyContext`` + ``DefaultWorkflow`` drive it: every update clipped, so Flower shrinks the
    norm before it adds the noise; each round reports both norms."""
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import DifferentialPrivacyServerSideAdaptiveClipping as Legacy
    from flwr.server.strategy import FedAvg as LegacyFedAvg

    from flaudit.server.wrapper import LegacyCanaryAuditStrategy
    from tests.server.test_legacy_wrapper import all_sampled, client_manager

    np.random.seed(4)
    manager = client_manager(3)
    fedavg = all_sampled(
        LegacyFedAvg, 3, initial_parameters=ndarrays_to_parameters([np.zeros(630, np.float32)])
    )
    inner = Legacy(
        fedavg,
        noise_multiplier=1.0,
        num_sampled_clients=3,
        initial_clipping_norm=0.5,
        clipped_count_stddev=1.0,
    )
    reporter = LocalRoundReporter.for_audit(canary_seed=SEED, num_canaries=K)
    canaries = LocalCanaries(SEED, num_canaries=K, num_rounds=3, clients_per_round=3)
    strategy = LegacyCanaryAuditStrategy(inner, num_rounds=3, reporter=reporter, canaries=canaries)
    parameters = strategy.initialize_parameters(manager)
    rng = np.random.default_rng(0)
    before, after = [], []
    for t in range(1, 4):
        pairs = strategy.configure_fit(t, parameters, manager)
        before.append(float(inner.clipping_norm))
        current = parameters_to_ndarrays(parameters)[0]
        results = [
            (
                proxy,
                FitRes(
                    Status(Code.OK, ""),
                    ndarrays_to_parameters([current + 2.0 * u / np.linalg.norm(u)]),
                    5,
                    {},
                ),
            )
            for (proxy, _), u in zip(
                pairs, rng.standard_normal((len(pairs), 630)).astype(np.float32)
            )
        ]
        parameters, _ = strategy.aggregate_fit(t, results, [])
        after.append(float(inner.clipping_norm))
    metas = [meta for _, meta in reporter.rounds]
    assert [m.clip_norm for m in metas] == pytest.approx(before)
    assert [m.noise_clip_norm for m in metas] == pytest.approx(after)
    # mostly shrinking (the clipped count is noised): noised for less than clipped
    assert sum(a < b for a, b in zip(after, before)) >= 2
    assert strategy.audit.calibration.min_factor == pytest.approx(
        min(a / b for a, b in zip(after, before))
    )
