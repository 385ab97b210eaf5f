"""Flower's quickstart-pytorch behind Flower's ``DifferentialPrivacyServerSideAdaptiveClipping``
with the lines docs/flower.md shows for adaptive clipping (issue #38): the real ServerApp and
ClientApp (torch training on synthetic data) on an in-process grid, no Ray. The claim carries
the configured z beside Flower's update noise z_delta, and every round records the clip norm
its updates were clipped to and the one Flower's wrapper noised for: the quickstart's updates
are far above the initial clip norm, every one is clipped, Flower shrinks the norm before it
adds the noise, and the rounds show the factor below 1.

The audit's service client is replaced by an in-process one (``from_env`` is patched; the
service path of the finding is ``tests/service/test_adaptive_mismatch.py``).
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.integration.test_byo_flower_app import (
    documented_blocks,
    insert_after,
    synthetic_quickstart,
)
from tests.integration.test_fl_dp_sa import InProcessGrid, load_apps
from tests.server.test_wrapper import ClaimRecorder

pytestmark = pytest.mark.slow

NODES, K, SEED, ROUNDS = 2, 4, 0x5EED_0038, 3


def make_app(dest: Path) -> None:
    pkg = synthetic_quickstart(dest)
    blocks = documented_blocks("flaudit-adaptive")
    server = (pkg / "server_app.py").read_text()
    for anchor, name in (
        ("from flwr.serverapp.strategy import FedAvg", "server_app imports"),
        ("    strategy = FedAvg(fraction_evaluate=fraction_evaluate)", "server_app strategy"),
    ):
        server = insert_after(server, anchor, blocks[name])
    (pkg / "server_app.py").write_text(server)


def test_the_quickstart_behind_adaptive_clipping_records_the_clip_noise_mismatch(
    tmp_path, monkeypatch
):
    from flwr.app import Context, RecordDict

    import flaudit.server.wrapper as wrapper

    app = tmp_path / "quickstart-adaptive"
    make_app(app)
    reporter = ClaimRecorder.for_audit(canary_seed=SEED, num_canaries=K)
    made = []

    def local_from_env(cls, strategy, *, run_config=None, **options):
        canaries = wrapper.LocalCanaries(
            SEED, num_canaries=K, num_rounds=ROUNDS, clients_per_round=NODES
        )
        made.append(cls(strategy, reporter=reporter, canaries=canaries))
        return made[-1]

    monkeypatch.setattr(wrapper.CanaryAuditStrategy, "from_env", classmethod(local_from_env))
    server_app, client_app = load_apps(monkeypatch, app, "pytorchexample")
    monkeypatch.chdir(tmp_path)  # the quickstart saves final_model.pt
    random.seed(38)
    np.random.seed(38)  # Flower's DP noise and noisy clipped count
    torch.manual_seed(38)  # the model's start and the batches: the clip norms' path (a fresh
    # worker and one that ran other torch tests before must see the same run)
    run_config = {
        "num-server-rounds": ROUNDS,
        "fraction-evaluate": 0.0,
        "local-epochs": 1,
        "learning-rate": 0.1,
        "batch-size": 32,
        "noise-multiplier": 1.0,
        "clipping-norm": 0.05,
        "num-sampled-clients": NODES,
        "clipped-count-stddev": 1.0,
    }
    grid = InProcessGrid(client_app, NODES)
    for context in grid.contexts.values():  # the SuperNodes get the run's config too
        context.run_config = dict(run_config)
    server_app(
        grid,
        Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config),
    )
    (claim,) = reporter.claims
    assert claim["configured_noise_multiplier"] == pytest.approx(1.0)
    assert claim["noise_multiplier"] == pytest.approx((1 - 0.25) ** -0.5)  # z_delta, sigma_b = 1
    metas = [meta for _, meta in reporter.rounds]
    assert len(metas) == ROUNDS
    calibration = made[0].audit.calibration
    for t, meta in enumerate(metas, start=1):
        assert meta.clip_norm == pytest.approx(calibration.clip_norms[t])
        assert meta.noise_clip_norm == pytest.approx(calibration.noise_clip_norms[t])
        assert meta.noise_stddev == pytest.approx(claim["noise_multiplier"] * meta.noise_clip_norm)
    assert metas[0].clip_norm == pytest.approx(0.05)
    # every real update clipped: Flower shrinks the norm, then noises for the smaller one
    assert all(meta.noise_clip_norm < meta.clip_norm for meta in metas)
    assert calibration.min_factor < 1
