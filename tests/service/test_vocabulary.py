"""The report's words (service/vocabulary.py, from static/vocabulary.json shared with the
dashboard): values in words, nested settings as lines, every identifier of the results named."""

from __future__ import annotations

import re

from flaudit.auditor.results import Estimator
from flaudit.auditor.spec import AuditSpec
from flaudit.service.vocabulary import (
    VOCABULARY,
    diagnostic_name,
    diagnostic_purpose,
    diagnostic_state,
    diagnostic_value,
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


def _diagnostics(k: int, num_seen: int) -> list[dict]:
    import numpy as np

    from flaudit.auditor.claims import AuditLook, summarize

    rng = np.random.default_rng(k)
    seen = np.arange(k) < num_seen
    look = AuditLook(
        seen=seen,
        dim=1000,
        delta=1e-5,
        max_cosines=rng.normal(size=k) / np.sqrt(1000) + 0.1,
        final_cosines=rng.normal(size=k) / np.sqrt(1000),
        threat_models=["final_model", "all_iterates"],
        one_run=True,
        bootstrap=20,
        known_rounds_scores=rng.normal(size=k),
        known_rounds_participations=np.ones(k, dtype=int),
        num_rounds=5,
    )
    return [d.to_dict() for d in summarize(look).diagnostics]


def test_every_check_the_audit_runs_is_named_in_words_with_its_purpose():
    """Issue #40: the page showed "Another check · passes · p = 0.340" for a check it had no
    name for. Every diagnostic `summarize` makes (enough canaries for every test; too few, so
    the tests are left out) has a name and a purpose in the shared vocabulary, and its line reads
    as words."""
    diagnostics = _diagnostics(40, 20) + _diagnostics(6, 1)
    names = {d["name"] for d in diagnostics}
    assert len(names) == 10, names  # the seven checks and the three "not run" notes
    for d in diagnostics:
        entry = VOCABULARY["diagnostics"].get(d["name"])
        assert entry and entry["name"] and entry["purpose"], d["name"]
        line = " · ".join(
            (diagnostic_name(d), diagnostic_state(d), diagnostic_value(d), diagnostic_purpose(d))
        )
        assert not SNAKE.search(line) and "value 0" not in line, line
    by_name = {d["name"]: d for d in diagnostics}
    ks = by_name["unseen_known_rounds_vs_null"]
    assert diagnostic_name(ks).startswith("Normal-score test calibrated")
    assert re.fullmatch(r"p = [0-9.e-]+", diagnostic_value(ks)), diagnostic_value(ks)
    skipped = by_name["final_model_skipped"]
    assert diagnostic_state(skipped) == "not run"
    assert "need at least 2" in diagnostic_value(skipped)
    assert re.fullmatch(
        r"90% interval of ε: \[[0-9.]+, [0-9.]+\]",
        diagnostic_value(by_name["bootstrap_final_model_epsilon"]),
    )
    # a check a later version adds still says which check it is
    assert diagnostic_name({"name": "some_new_check", "ok": True}) == "Check: some new check"
