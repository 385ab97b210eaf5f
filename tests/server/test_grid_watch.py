"""Issue #40 item 5: the wrapper has its reporter probe the SuperLink (``grid.get_node_ids``) and
tells it the run's round timeout (twice Flower's ``Strategy.start(timeout=...)``: training, then
evaluation), so heartbeats say whether the run can still make progress."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord

from flaudit.server.reporting import LocalRoundReporter
from flaudit.server.wrapper import CanaryAuditStrategy, LocalCanaries
from tests.flower_rounds import dp_fedavg

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
    inner = dp_fedavg(0.0, 0.5)
    canaries = LocalCanaries(5, num_canaries=4, num_rounds=2, clients_per_round=3)
    strategy = CanaryAuditStrategy(inner, reporter=reporter, canaries=canaries, num_rounds=2)
    with pytest.raises(Stop):
        strategy.start(Grid(), ArrayRecord([np.zeros(64, np.float32)]), 2, **how)
    assert reporter.watched == ([1, 2, 3], expected)


class DyingGrid:
    """A SuperLink that answers who is there until it dies."""

    class run:  # noqa: N801 - the attribute Flower's legacy compat layer reads
        run_id = 1

    def __init__(self) -> None:
        self.dead = False

    def get_node_ids(self):
        if self.dead:
            raise ConnectionError("the SuperLink is gone")
        return [1, 2, 3]


class ProbeKeeper(LocalRoundReporter):
    def declare_claim(self, claim):
        self.claim = claim

    def watch_grid(self, probe, *, round_timeout=None):
        self.watches = [*getattr(self, "watches", []), (probe, round_timeout)]


def test_the_legacy_wrapper_has_the_reporter_probe_the_grid_of_flowers_client_manager():
    """Issue #40: a legacy-strategy app (``LegacyContext`` + ``DefaultWorkflow``) is never handed
    the grid, so its heartbeats did not say the SuperLink died and its audit outlived the run.
    The wrapper finds the grid in the ``GridClientProxy`` objects Flower's compat layer fills the
    client manager with, and has the reporter probe it (no round timeout: the legacy
    ``ServerConfig.round_timeout`` is not the strategy's to read)."""
    from flwr.common import ndarrays_to_parameters
    from flwr.server.client_manager import SimpleClientManager
    from flwr.server.compat.app_utils import start_update_client_manager_thread
    from flwr.server.strategy import DifferentialPrivacyClientSideFixedClipping
    from flwr.server.strategy import FedAvg as LegacyFedAvg

    from flaudit.server.wrapper import LegacyCanaryAuditStrategy

    grid, manager = DyingGrid(), SimpleClientManager()
    _, stop, registered = start_update_client_manager_thread(grid, manager)  # as LegacyContext
    try:
        assert registered.wait(10)
        inner = DifferentialPrivacyClientSideFixedClipping(
            LegacyFedAvg(
                fraction_fit=1.0,
                min_fit_clients=3,
                min_available_clients=3,
                fraction_evaluate=0.0,
                initial_parameters=ndarrays_to_parameters([np.zeros(64, np.float32)]),
            ),
            noise_multiplier=1.0,
            clipping_norm=0.5,
            num_sampled_clients=3,
        )
        reporter = ProbeKeeper.for_audit(canary_seed=5, num_canaries=4)
        canaries = LocalCanaries(5, num_canaries=4, num_rounds=2, clients_per_round=3)
        strategy = LegacyCanaryAuditStrategy(
            inner, num_rounds=2, reporter=reporter, canaries=canaries
        )
        parameters = strategy.initialize_parameters(manager)
        for t in (1, 2):
            strategy.configure_fit(t, parameters, manager)
        assert len(reporter.watches) == 1  # once per run
        probe, round_timeout = reporter.watches[0]
        assert probe() == [1, 2, 3] and round_timeout is None
        grid.dead = True
        with pytest.raises(ConnectionError):  # the reporter's probe fails: its grid age grows
            probe()
    finally:
        stop.set()
