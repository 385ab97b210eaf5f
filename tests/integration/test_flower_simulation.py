"""A real Flower simulation (Ray) of a tiny audit, end to end with canaries."""

from __future__ import annotations

import io
import logging
import time

import numpy as np
import pytest

from flaudit.auditor.canaries import seen_mask
from flaudit.auditor.spec import AuditSpec
from flaudit.auditor.statistics import CosineTracker
from flaudit.clients.tasks import load_task
from flaudit.server.reporting import LocalRoundReporter
from flaudit.server.simulation import run_simulation_audit

pytestmark = pytest.mark.slow
SEED = 987654321987654321


def _spec(**overrides):
    options = dict(
        task="synthetic",
        task_options={"dim": 5000, "test_size": 500},
        num_rounds=4,
        num_clients=10,
        clients_per_round=5,
        participation="uniform",
        num_canaries=20,
        noise_multiplier=0.3,
        clip_norm=1.0,
        canary_repeats=2,
        local_epochs=1,
    )
    options.update(overrides)
    return AuditSpec(**options)


@pytest.mark.timeout(240)
def test_simulation_audit_gives_final_and_all_iterate_statistics():
    spec = _spec()
    dim = load_task(spec.task, num_partitions=spec.num_clients, options=spec.task_options).dim()
    reporter = LocalRoundReporter(
        CosineTracker(SEED, spec.num_canaries, dim, family=spec.canary_family)
    )
    ticks = []
    flwr_log = io.StringIO()
    handler = logging.StreamHandler(flwr_log)
    logging.getLogger("flwr").addHandler(handler)
    started = time.monotonic()
    try:
        result = run_simulation_audit(
            spec,
            canary_seed=SEED,
            reporter=reporter,
            timeout=200,
            progress=lambda t, total: ticks.append((t, total)),
            max_supernodes=2,
            noise_seed=3,
        )
    finally:
        logging.getLogger("flwr").removeHandler(handler)
    elapsed = time.monotonic() - started
    # Flower's run_simulation deprecation is dropped (docs/flower.md), nothing else
    assert "`run_simulation` function is deprecated" not in flwr_log.getvalue()
    print(f"tiny simulation audit took {elapsed:.1f} s")
    assert ticks == [(t, 4) for t in range(1, 5)]
    assert result["num_rounds"] == 4 and result["dim"] == dim and result["num_failures"] == 0
    assert 0.0 <= result["metrics"]["accuracy"] <= 1.0
    assert len(reporter.rounds) == 4
    mask = seen_mask(SEED, spec.num_canaries)
    final, max_cos = reporter.tracker.final_cosines, reporter.tracker.max_cosines
    assert final is not None and np.all(np.isfinite(final)) and np.all(np.isfinite(max_cos))
    # noise z=0.3, d~5000: a seen canary's cosine is ~3 null standard deviations above unseen ones
    null_sd = 1 / np.sqrt(dim)
    assert final[mask].mean() - final[~mask].mean() > 1.5 * null_sd
    assert max_cos[mask].mean() - max_cos[~mask].mean() > 1.5 * null_sd
    assert abs(final[~mask].mean()) < 4 * null_sd  # unseen canaries look like the null
    assert sum(m.num_canaries_inserted for _, m in reporter.rounds) == 2 * int(mask.sum())
    assert str(SEED) not in repr(result) and str(SEED) not in repr(reporter)


@pytest.mark.timeout(120)
def test_simulation_audit_raises_timeout_error():
    spec = _spec(num_rounds=50)
    dim = load_task(spec.task, num_partitions=spec.num_clients, options=spec.task_options).dim()
    reporter = LocalRoundReporter(
        CosineTracker(SEED, spec.num_canaries, dim, family=spec.canary_family)
    )
    with pytest.raises(TimeoutError):
        run_simulation_audit(spec, canary_seed=SEED, reporter=reporter, timeout=4, max_supernodes=2)
