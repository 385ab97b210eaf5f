"""Issue #40 item 5: the wrapper has its reporter probe the SuperLink (``grid.get_node_ids``) and
tells it the run's round timeout (twice Flower's ``Strategy.start(timeout=...)``: training, then
evaluation), so heartbeats say whether the run can still make progress."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg

from flaudit.server.reporting import LocalRoundReporter
from flaudit.server.wrapper import CanaryAuditStrategy, LocalCanaries

pytestmark = pytest.mark.usefixtures("flower_task_identity")  # tests/conftest.py


class Stop(Exception):
    pass


class Grid:
    """Answers who is there; the first round's messages end the test (its set-up is tested)."""

    def get_node_ids(self):
        return [1, 2, 3]

    def send_and_receive(self, messages, timeout=None):
        raise Stop


class WatchingReporter(LocalRoundReporter):
    def declare_claim(self, claim):
        self.claim = claim

    def watch_grid(self, probe, *, round_timeout=None):
        self.watched = (probe(), round_timeout)


@pytest.mark.parametrize("how, expected", [({}, 7200.0), ({"timeout": 90}, 180.0)])
def test_start_has_the_reporter_watch_the_grid_with_the_round_timeout(how, expected):
    reporter = WatchingReporter.for_audit(canary_seed=5, num_canaries=4)
    inner = DifferentialPrivacyServerSideFixedClipping(
        FedAvg(min_train_nodes=3, min_available_nodes=3, fraction_evaluate=0.0),
        noise_multiplier=0.0,
        clipping_norm=0.5,
        num_sampled_clients=3,
    )
    canaries = LocalCanaries(5, num_canaries=4, num_rounds=2, clients_per_round=3)
    strategy = CanaryAuditStrategy(inner, reporter=reporter, canaries=canaries, num_rounds=2)
    with pytest.raises(Stop):
        strategy.start(Grid(), ArrayRecord([np.zeros(64, np.float32)]), 2, **how)
    assert reporter.watched == ([1, 2, 3], expected)
