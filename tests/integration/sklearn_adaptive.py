"""Flower's quickstart-sklearn behind ``DifferentialPrivacyServerSideAdaptiveClipping``, run as a
new user would (issue #38's hidden check), in process: the app of ``flower_sklearn`` (its
ORIGIN.md) with the adaptive-clipping lines of docs/flower.md, the real ServerApp and ClientApp on
an in-process grid of 4 nodes (no Ray), the real service app in process (SQLite, the ASGI app
behind ``httpx``), ``num_canaries = "auto"``, 25 rounds, z = 1, ``clipped-count-stddev = 1``.

``noise_scale`` plants a bug behind the claim's back: Flower's adaptive wrapper adds its noise
with ``add_gaussian_noise_inplace(arrays, std)``; the run replaces that function, inside Flower's
module only, by one that adds ``noise_scale * std``.

Used by ``tests/integration/test_sklearn_adaptive_app.py`` and ``benchmarks/sklearn_adaptive.py``.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import random
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.integration.test_byo_flower_app import documented_blocks, insert_after

TEMPLATE = Path(__file__).parent / "flower_sklearn"
NODES, ROUNDS = 4, 25
RUN_CONFIG = {
    "penalty": "l2",
    "num-server-rounds": ROUNDS,
    "min-available-clients": 2,
    "noise-multiplier": 1.0,
    "clipping-norm": 1.0,
    "num-sampled-clients": NODES,
    "clipped-count-stddev": 1.0,
}


def make_app(dest: Path) -> Path:
    """The quickstart copied to ``dest`` with the documented adaptive-clipping lines."""
    shutil.copytree(TEMPLATE, dest, ignore=shutil.ignore_patterns("ORIGIN.md", "__pycache__"))
    server_path = dest / "sklearnexample" / "server_app.py"
    server = server_path.read_text()
    blocks = documented_blocks("flaudit-adaptive")
    for anchor, name in (
        ("from flwr.serverapp.strategy import FedAvg", "server_app imports"),
        ("    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=1.0)", "server_app strategy"),
    ):
        assert server.count(anchor) == 1, f"the quickstart no longer has {anchor!r} once"
        server = insert_after(server, anchor, blocks[name])
    server_path.write_text(server)
    return dest


@dataclass
class Outcome:
    design_line: str | None
    audit: dict
    rounds: list[dict]

    @property
    def verdict(self) -> dict:
        return self.audit["verdict"]


@contextlib.contextmanager
def _flower_noise_scaled(scale: float):
    import flwr.serverapp.strategy.dp_adaptive_clipping as dp

    real = dp.add_gaussian_noise_inplace

    def scaled(arrays, std):  # the planted bug: noise x scale behind the claim's back
        return real(arrays, std * scale)

    dp.add_gaussian_noise_inplace = scaled
    try:
        yield
    finally:
        dp.add_gaussian_noise_inplace = real


def run_once(
    app: Path, client, *, canary_seed: int, app_seed: int, noise_scale: float = 1.0
) -> Outcome:
    """One run of the app at ``app`` (from :func:`make_app`) against the service behind
    ``client`` (a ``TestClient`` of the service app). Changes the working directory to
    ``app`` (the quickstart saves its model there) and restores it."""
    import os

    from flwr.app import Context, RecordDict
    from flwr.common.logger import FLOWER_LOGGER
    from flwr.supercore.task_identity import TaskIdentity

    import flaudit.server.attach as attach
    import flaudit.server.wrapper as wrapper
    import flaudit.service.routers.audits as audits_router
    from benchmarks._service import in_process_reporter
    from tests.integration.test_fl_dp_sa import InProcessGrid
    from tests.service.conftest import AUTH

    saved_seed = audits_router.new_master_seed
    audits_router.new_master_seed = lambda: canary_seed
    try:
        body = client.post(
            "/audits",
            json={"name": "sklearn-adaptive", "engine": "external", "num_canaries": "auto"},
            headers=AUTH,
        ).json()
    finally:
        audits_router.new_master_seed = saved_seed
    env = body["environment"]
    made = []

    def reporter(base_url, audit_id, run_token, **options):  # the service app in process
        ids = {"FLAUDIT_AUDIT_ID": audit_id, "FLAUDIT_RUN_TOKEN": run_token}
        made.append(in_process_reporter(client, ids, **options))
        return made[-1]

    run_config = {
        **RUN_CONFIG,
        "flaudit-audit-id": env["FLAUDIT_AUDIT_ID"],
        "flaudit-ingest-url": "http://testserver",
    }
    saved_env = {key: os.environ.pop(key, None) for key in attach.RUN_CONFIG_KEYS}
    saved_env[attach.ENV_RUN_TOKEN] = os.environ.get(attach.ENV_RUN_TOKEN)
    os.environ[attach.ENV_RUN_TOKEN] = env["FLAUDIT_RUN_TOKEN"]
    saved_reporter, attach.HttpRoundReporter = attach.HttpRoundReporter, reporter
    saved_from_env = wrapper.CanaryAuditStrategy.__dict__["from_env"]

    def seeded_from_env(cls, strategy, **options):  # tests only: the canaries' cohort slots
        audited = saved_from_env.__func__(cls, strategy, **options)
        audited.audit._slot_rng = np.random.default_rng(app_seed)
        return audited

    wrapper.CanaryAuditStrategy.from_env = classmethod(seeded_from_env)
    sys.path.insert(0, str(app))
    for name in [m for m in sys.modules if m.split(".")[0] == "sklearnexample"]:
        del sys.modules[name]
    cwd = os.getcwd()
    design = []

    class Lines(logging.Handler):
        def emit(self, record):
            text = record.getMessage()
            if text.startswith("flaudit: audit design:"):
                design.append(text)

    handler = Lines(logging.INFO)
    FLOWER_LOGGER.addHandler(handler)
    saved_level = FLOWER_LOGGER.level
    FLOWER_LOGGER.setLevel(min(saved_level or logging.INFO, logging.INFO))
    try:
        server_app = importlib.import_module("sklearnexample.server_app").app
        client_app = importlib.import_module("sklearnexample.client_app").app
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
        os.chdir(app)
        random.seed(app_seed)  # Flower's cohorts
        np.random.seed(app_seed)  # Flower's DP noise and noisy clipped count
        grid = InProcessGrid(client_app, NODES)
        for context in grid.contexts.values():  # the SuperNodes get the run's config too
            context.run_config = dict(run_config)
        with _flower_noise_scaled(noise_scale):
            server_app(
                grid,
                Context(
                    run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config
                ),
            )
    finally:
        FLOWER_LOGGER.removeHandler(handler)
        FLOWER_LOGGER.setLevel(saved_level)
        os.chdir(cwd)
        sys.path.remove(str(app))
        attach.HttpRoundReporter = saved_reporter
        wrapper.CanaryAuditStrategy.from_env = saved_from_env
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        for r in made:
            r.close()
    audit_id = env["FLAUDIT_AUDIT_ID"]
    audit = client.get(f"/audits/{audit_id}", headers=AUTH).json()
    rounds = client.get(f"/audits/{audit_id}/rounds", headers=AUTH).json()
    rounds = rounds.get("rounds", rounds) if isinstance(rounds, dict) else rounds
    return Outcome(design[0] if design else None, audit, rounds)
