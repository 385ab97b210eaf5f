"""Refusals of the record-level audit (clients/record_audit.py, issue #37): what it cannot read
(no Opacus, an unsupported optimizer, secure aggregation, a failing canary source) gets one
sentence, and the client's training goes on unchanged, with the real Opacus PrivacyEngine."""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from torch.utils.data import DataLoader, TensorDataset

from flaudit.auditor.estimators.record_level import SeededRecordCanaries
from flaudit.clients.record_audit import (
    SECURE_AGGREGATION_REFUSAL,
    FailOpenCanaries,
    try_add_record_canaries,
)
from flaudit.clients.record_canaries import RecordCanaryDPOptimizer

SEED = 20261206


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus warns about secure_mode and hooks
        yield


def _private(optimizer=torch.optim.SGD):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3)
    data = TensorDataset(torch.randn(40, 8), torch.randint(0, 3, (40,)))
    return PrivacyEngine().make_private(
        module=model,
        optimizer=optimizer(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=8),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        poisson_sampling=True,
    )


def _train(model, optimizer, loader) -> int:
    steps = 0
    for x, y in loader:
        optimizer.zero_grad()
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out, y) if len(y) else out.sum() * 0.0
        loss.backward()
        optimizer.step()
        steps += 1
    return steps


def _canaries(rate):
    return SeededRecordCanaries(SEED, [True, False] * 4, sample_rate=rate)


def test_an_unsupported_optimizer_is_refused_and_trains_on_untouched():
    model, optimizer, loader = _private(torch.optim.Adam)
    kind = type(optimizer)
    before = [p.detach().clone() for p in model.parameters()]
    out, refusal = try_add_record_canaries(optimizer, _canaries(loader.sample_rate))
    assert out is optimizer and type(out) is kind
    assert refusal.startswith("record-level audit refused: Adam is not supported")
    assert "torch.optim.SGD" in refusal and "training goes on" in refusal
    assert _train(model, out, loader) == len(loader)
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_secure_aggregation_and_a_missing_opacus_are_refused(monkeypatch):
    model, optimizer, loader = _private()
    out, refusal = try_add_record_canaries(
        optimizer, _canaries(loader.sample_rate), secure_aggregation=True
    )
    assert out is optimizer and refusal == SECURE_AGGREGATION_REFUSAL
    assert "never one client's update" in refusal and "user-level claim" in refusal
    monkeypatch.setitem(sys.modules, "opacus", None)  # as if Opacus were not installed
    out, refusal = try_add_record_canaries(optimizer, _canaries(loader.sample_rate))
    assert out is optimizer and "Opacus is not installed" in refusal
    monkeypatch.undo()
    assert _train(model, optimizer, loader) == len(loader)
    out, refusal = try_add_record_canaries(optimizer, object())
    assert out is optimizer and "step_canary_sum" in refusal


class _Breaks:
    """A canary source whose transport fails at step 2."""

    sample_rate = None

    def __init__(self, inner):
        self.inner = inner

    def step_canary_sum(self, step, dim):
        if step == 2:
            raise ConnectionError("canary service unreachable")
        return self.inner.step_canary_sum(step, dim)


def test_a_failing_canary_source_stops_the_canaries_never_the_training():
    model, optimizer, loader = _private()
    out, refusal = try_add_record_canaries(optimizer, _Breaks(_canaries(loader.sample_rate)))
    assert refusal is None and isinstance(out, RecordCanaryDPOptimizer)
    assert _train(model, out, loader) == len(loader)
    source = out.record_canaries
    assert isinstance(source, FailOpenCanaries)
    assert source.error.startswith("record canaries stopped at step 2: ConnectionError")
    assert out.canary_step == len(loader)  # every step still noised and counted
    assert np.all(source.step_canary_sum(7, 5) == 0)
