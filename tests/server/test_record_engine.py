"""The built-in record-level engine (server/record_engine.py, issue #37) at small size with the
real Opacus PrivacyEngine: a sampled cohort, momentum, and the stop of training on an alarm."""

from __future__ import annotations

import numpy as np
import pytest

from flaudit.auditor.canaries import seen_mask
from flaudit.auditor.claims.record_alarm import record_cause
from flaudit.auditor.record_spec import RecordLevelSpec
from flaudit.server.record_engine import record_plan, run_record_audit

SEED = 987654321


def _spec(**changes) -> RecordLevelSpec:
    return RecordLevelSpec.model_validate(
        {
            "level": "record",
            "task_options": {"hidden": 16},
            "num_clients": 3,
            "num_rounds": 2,
            "num_canaries": 600,
            "batch_size": 32,
            **changes,
        }
    )


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_momentum_and_a_sampled_cohort_measure_the_claimed_noise_and_shift():
    """With momentum 0.5 the projections, scaled by the momentum factors of the steps, measure
    the claimed noise and a shift of one C per inclusion; a client never sampled has no score."""
    spec = _spec(momentum=0.5, clients_per_round=1, num_rounds=2, num_canaries=900)
    plan = record_plan(spec)
    views = []
    result = run_record_audit(spec, canary_seed=SEED, on_round=lambda v: views.append(v) or False)
    assert result["steps_per_round"] == plan["steps_per_round"]
    assert sum(result["rounds_trained"]) == 2 and len(views) == 2
    never = [i for i, n in enumerate(result["rounds_trained"]) if n == 0]
    owner = np.arange(spec.num_canaries) % spec.num_clients
    for i in never:
        assert np.all(np.isnan(views[-1].scores[owner == i]))
    trained = ~np.isnan(views[-1].scores)
    assert trained.sum() >= spec.num_canaries // 3
    assert views[-1].steps == plan["steps_per_round"] * max(result["rounds_trained"])
    seen = seen_mask(SEED, spec.num_canaries)
    cause = record_cause(
        views[-1].noise_units, views[-1].shift_units, seen, noise_multiplier=spec.noise_multiplier
    )
    assert cause.noise_ratio == pytest.approx(1.0, abs=0.15), cause
    assert cause.sensitivity_ratio == pytest.approx(1.0, abs=4 * cause.sensitivity_ratio_se + 0.1)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_training_stops_at_the_round_the_caller_asks():
    spec = _spec(inject_bug={"kind": "no_noise"}, num_rounds=3)
    result = run_record_audit(spec, canary_seed=SEED, on_round=lambda v: v.round == 1)
    assert result["stopped_at_round"] == 1 and result["rounds_trained"] == [1, 1, 1]
    with pytest.raises(ValueError, match="at most the model's dimension"):
        run_record_audit(_spec(num_canaries=5000), canary_seed=SEED)
