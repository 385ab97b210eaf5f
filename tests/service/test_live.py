"""Alerts, headline epsilon and JSON conversion of the live audit state."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from auditor.service.live import build_alerts, headline_epsilon, to_jsonable
from auditor.spec import AuditSpec

SPEC = AuditSpec(num_canaries=100, num_clients=1000, clients_per_round=10)


def _est(estimator, eps, threat_model="final_model", **extra):
    return {"estimator": estimator, "epsilon": eps, "threat_model": threat_model,
            "variance": extra.pop("variance", "n/a"), "correction": extra.pop("correction", "none"),
            "confidence": extra.pop("confidence", 0.95), "details": extra}


ANALYTIC = [
    _est("analytic", 2.0, "poisson_subsampled", accountant="pld", confidence=None),
    _est("analytic", 9.0, "poisson_subsampled", accountant="rdp", confidence=None),
    _est("analytic", 4.0, "known_rounds", accountant="pld", confidence=None),
]


def test_lower_bound_above_the_analytic_epsilon_is_an_error():
    alerts = build_alerts(spec=SPEC, dim=10**6, estimates=[_est("lower_bound", 3.0)] + ANALYTIC,
                          rounds_stored=1, has_final=False)
    errors = [a for a in alerts if a["level"] == "error"]
    assert len(errors) == 1 and "possible DP bug or wrong claim" in errors[0]["message"]
    assert "poisson_subsampled" in errors[0]["message"] and "known_rounds" not in errors[0]["message"]


def test_lower_bound_below_every_pld_bound_raises_nothing():
    # 3.5 < 4 (known rounds); the RDP bound is not compared (PLD is the tighter accountant)
    ests = [_est("lower_bound", 1.5), _est("one_run", 1.9)] + ANALYTIC
    assert build_alerts(spec=SPEC, dim=10**6, estimates=ests, rounds_stored=1, has_final=False) == []
    ests = [_est("one_run", 4.5, "all_iterates")] + ANALYTIC
    (alert,) = build_alerts(spec=SPEC, dim=10**6, estimates=ests, rounds_stored=1, has_final=False)
    assert alert["level"] == "error" and "one_run" in alert["message"] and "known_rounds" in alert["message"]


def test_estimates_above_analytic_are_not_alerts_unless_they_are_bounds():
    ests = [_est("two_gaussian", 50.0, variance="fitted", correction="n/a")] + ANALYTIC
    assert build_alerts(spec=SPEC, dim=10**6, estimates=ests, rounds_stored=1, has_final=False) == []


@pytest.mark.parametrize("dim, warned", [(10_000, False), (9_999, True), (500, True)])
def test_interference_warning_when_k_over_d_exceeds_one_percent(dim, warned):
    alerts = build_alerts(spec=SPEC, dim=dim, estimates=[], rounds_stored=0, has_final=False)
    assert any(a["level"] == "warning" and "Keinan" in a["message"] for a in alerts) == warned


def test_short_run_warning():
    alerts = build_alerts(spec=SPEC, dim=10**6, estimates=[], rounds_stored=3, has_final=True)
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
def test_to_jsonable_never_emits_non_finite_floats(values):
    out = to_jsonable({"a": np.array(values, dtype=float), "b": [np.float32(1.5)]})
    for v in out["a"]:
        assert isinstance(v, str) or math.isfinite(v)
    assert out["b"] == [1.5]
