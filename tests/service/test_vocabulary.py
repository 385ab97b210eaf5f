"""The report's words (service/vocabulary.py, from static/vocabulary.json shared with the
dashboard): values in words, nested settings as lines, every identifier of the results named."""

from __future__ import annotations

import re

from flaudit.auditor.results import Estimator
from flaudit.auditor.spec import AuditSpec
from flaudit.service.vocabulary import (
    VOCABULARY,
    estimate_label,
    field_label,
    human_text,
    value_lines,
    value_text,
)

SNAKE = re.compile(r"\b[a-z]+_[a-z_]+\b")


def test_values_read_as_words():
    assert value_text(True) == "yes" and value_text(False) == "no" and value_text(None) == "–"
    assert value_text(["final_model", "all_iterates"], "threat_models") == (
        "sees the final model, sees every round's update"
    )
    assert value_lines({"dim": 1000, "test_size": 50}) == [
        "model size (parameters): 1000",
        "test examples: 50",
    ]
    assert value_text({"kind": "noise_scale", "factor": 0.2}) == "kind: noise scale; size: 0.2"
    assert value_text(float("inf")) == "∞" and value_text(1e-5) == "1e-05"
    assert estimate_label({"estimator": "two_gaussian", "variance": "null"}) == (
        "Gaussian-fit estimate of ε (variance fixed at 1/d)"
    )
    assert human_text("bug injected: noise_scale=0.5") == "bug injected: noise × 0.5"


def test_every_spec_field_and_estimator_has_words():
    for name in AuditSpec.model_fields:
        label = field_label(name)
        assert name in VOCABULARY["fields"] and not SNAKE.search(label), name
    for estimator in Estimator:
        assert estimator.value in VOCABULARY["estimators"], estimator
    # an unknown field still reads as words
    assert field_label("some_new_knob") == "Some new knob"
