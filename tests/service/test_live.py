"""Alerts, headline epsilon and JSON conversion of the live audit state."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flaudit.auditor.canaries import CanaryFamily
from flaudit.auditor.claims.alerts import build_alerts, decide
from flaudit.auditor.claims.alerts import spec_alarm_guarantee as alarm_guarantee
from flaudit.auditor.results import jsonable
from flaudit.auditor.spec import AuditSpec
from flaudit.service.live import headline_epsilon

SPEC = AuditSpec(num_canaries=100, num_clients=1000, clients_per_round=10)


def _est(estimator, eps, threat_model="final_model", **extra):
    return {
        "estimator": estimator,
        "epsilon": eps,
        "threat_model": threat_model,
        "variance": extra.pop("variance", "n/a"),
        "correction": extra.pop("correction", "none"),
        "confidence": extra.pop("confidence", 0.95),
        "details": extra,
    }


ANALYTIC = [
    _est("analytic", 2.0, "poisson_subsampled", accountant="pld", confidence=None),
    _est("analytic", 9.0, "poisson_subsampled", accountant="rdp", confidence=None),
    _est("analytic", 4.0, "known_rounds", accountant="pld", confidence=None),
]


def _alerts(estimates, spec=SPEC, dim=10**6):
    return build_alerts(spec=spec, dim=dim, rounds_stored=1, has_final=False)


def test_epsilon_lower_bounds_above_analytic_are_never_alarms():
    # epsilon comparisons keep only their own per-look confidence: outside the alarm's guarantee
    assert _alerts([_est("lower_bound", 5.0, correction="bonferroni")]) == []
    assert _alerts([_est("one_run", 4.5, "all_iterates", correction="bonferroni")]) == []


def _tests(mu_seen, *, k=400, seed=0, spec=SPEC):
    """Claim tests of one look on known-rounds scores of a mechanism with this mu."""
    from flaudit.auditor.claims import AuditLook, summarize
    from flaudit.auditor.claims.curves import audit_claims

    rng = np.random.default_rng(seed)
    seen = rng.random(k) < 0.5
    scores = np.where(seen, mu_seen, 0.0) + rng.standard_normal(k)
    scores[:3] = np.nan  # canaries not yet in any round
    summary = summarize(
        AuditLook(
            seen=seen,
            dim=10**6,
            delta=1e-5,
            threat_models=[],
            known_rounds_scores=scores,
            claims=audit_claims(spec),
        )
    )
    return summary.claim_tests


def test_a_rejected_known_rounds_claim_is_an_error_alert():
    # SPEC: z = 1, r = 1 -> mu = 1; a bug tripling mu is rejected at the per-round look's level
    alarm = decide(SPEC, _tests(3.0), look=1)
    assert alarm.status == "error"
    alerts = build_alerts(spec=SPEC, dim=10**6, rounds_stored=1, has_final=False, alarm=alarm)
    (alert,) = [a for a in alerts if a["level"] == "error"]
    assert "possible DP bug or wrong claim" in alert["message"]
    assert "look 1 of 21" in alert["message"] and "known rounds" in alert["message"]
    ok = decide(SPEC, _tests(1.0), look=1)
    assert ok.status == "ok"
    assert build_alerts(spec=SPEC, dim=10**6, rounds_stored=1, has_final=False, alarm=ok) == []


def test_no_dp_claim_is_said_plainly():
    spec = SPEC.model_copy(update={"noise_multiplier": 0.0})
    assert alarm_guarantee(spec).startswith("No DP claim")
    for alarm in (None, decide(spec, [], look=2)):
        alerts = build_alerts(spec=spec, dim=10**6, rounds_stored=1, has_final=False, alarm=alarm)
        assert [a["level"] for a in alerts if "No DP claim" in a["message"]] == ["info"]
    assert "at most 5% over all 21 looks" in alarm_guarantee(SPEC)


def test_uncorrected_lower_bound_never_raises_an_alarm():
    # the paper's max over thresholds without correction is not a valid 95% bound
    assert _alerts([_est("lower_bound", 50.0, correction="none")]) == []


def test_lower_bounds_below_every_pld_bound_raise_nothing():
    # the RDP bound (9.0) is not compared: PLD is the tighter accountant
    ests = [_est("lower_bound", 1.5, correction="bonferroni"), _est("one_run", 1.9)]
    assert _alerts(ests) == []


def test_estimates_above_analytic_are_not_alerts_unless_they_are_bounds():
    assert _alerts([_est("two_gaussian", 50.0, variance="fitted", correction="n/a")]) == []


@pytest.mark.parametrize(
    "dim, warned", [(10_000, False), (2_000, False), (1_900, True), (500, True)]
)
def test_interference_warning_follows_the_effective_noise(dim, warned):
    # gaussian canaries, z = 1, k = 100: warn once sqrt(1 + k/d) inflates the noise by more
    # than 2.5% (k/d > ~5.1%); orthogonal canaries (the default here) never interfere
    spec = SPEC.model_copy(update={"canary_family": CanaryFamily.gaussian})
    alerts = build_alerts(spec=spec, dim=dim, rounds_stored=0, has_final=False)
    assert any(a["level"] == "warning" and "Keinan" in a["message"] for a in alerts) == warned
    alerts = build_alerts(spec=SPEC, dim=dim, rounds_stored=0, has_final=False)
    assert not any("Keinan" in a["message"] for a in alerts)


def test_interference_warning_without_noise_uses_a_stricter_ratio():
    spec = SPEC.model_copy(update={"noise_multiplier": 0.0, "canary_family": CanaryFamily.gaussian})
    alerts = build_alerts(spec=spec, dim=50_000, rounds_stored=0, has_final=False)
    assert any("Keinan" in a["message"] for a in alerts)  # k/d = 0.2% >= 0.1%


def test_short_run_warning():
    alerts = build_alerts(spec=SPEC, dim=10**6, rounds_stored=3, has_final=True)
    assert alerts and "3 of 20 rounds" in alerts[0]["message"]


def test_headline_prefers_final_model_null_variance():
    ests = [
        _est("two_gaussian", 5.0, "all_iterates", variance="fitted"),
        _est("two_gaussian", 3.0, "final_model", variance="fitted"),
        _est("two_gaussian", 2.0, "final_model", variance="null"),
    ]
    assert headline_epsilon(ests) == 2.0
    assert headline_epsilon(ests[:1]) == 5.0
    assert headline_epsilon([_est("two_gaussian", "inf", "final_model", variance="null")]) is None
    assert headline_epsilon([]) is None


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=20))
def test_jsonable_never_emits_non_finite_floats(values):
    out = jsonable({"a": np.array(values, dtype=float), "b": [np.float32(1.5)]})
    for v in out["a"]:
        assert isinstance(v, str) or math.isfinite(v)
    assert out["b"] == [1.5]


def test_model_change_follows_the_server_optimizer_with_momentum():
    """theta_t - theta_0 rebuilt from the released updates points where the ServerApp's own
    optimizer moved the model (the learning rate only scales it)."""
    from flaudit.server.dpfedavg import ServerOptimizer
    from flaudit.service.live import _ModelChange

    rng = np.random.default_rng(4)
    for momentum in (0.0, 0.9):
        optimizer = ServerOptimizer(learning_rate=0.3, momentum=momentum)
        change = _ModelChange(50, momentum)
        theta0 = rng.normal(size=50).astype(np.float32)
        theta = theta0
        for _ in range(6):
            update = rng.normal(size=50).astype(np.float32)
            theta, _ = optimizer.step(theta, update)
            change.add(update)
        moved = (theta.astype(np.float64) - theta0) / 0.3
        np.testing.assert_allclose(change.total, moved, rtol=1e-4, atol=1e-4)
