"""Issue #22, "Done when" (item 1): the wrapper audits the mechanism the user deploys.

Flower's ``DifferentialPrivacyServerSideFixedClipping`` around Flower's ``FedAvg`` with few real
clients (2 sampled of 3 SuperNodes) and many canaries (100: about 50 seen over 50 rounds, about
one per round), driven by Flower's own ``Strategy.start`` loop on an in-process grid (no Ray). The canaries take
cohort slots, so every round FedAvg averages exactly ``num_sampled_clients`` replies and each
canary enters with C/n against the noise z C/n. A planted bug that adds 4x less noise than the
strategy claims raises the error alarm (the service's own decision code, on the service's own
statistics); the correct run does not.

Before issue #22 each canary was an extra reply: FedAvg divided by 2 + c, every canary entered
with C/(2 + c) against z C/2, and the same planted bug went unnoticed.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping

from flaudit.auditor.canaries import seen_mask
from flaudit.server.wrapper import CanaryAuditStrategy, LocalCanaries
from tests.integration.flower_weighted.pytorch_example.planted_bug import (
    ShortNoise,  # the worked example's planted bug
)
from tests.server.test_wrapper import ClaimRecorder, CountingFedAvg, LoopGrid

pytestmark = pytest.mark.usefixtures("flower_task_identity")

SEED = 0x5EED_22
K = 100
ROUNDS = 50
NOISE = 1.0
CLIP = 1.0


class QuietNoise(ShortNoise):
    """The planted bug: claims ``noise_multiplier`` but adds a quarter of that noise."""

    noise_factor = 0.25


def audit(dp_class, noise_seed):
    """Run the wrapped app; return (alarm, replies aggregated per round, claim, reporter)."""
    np.random.seed(noise_seed)  # Flower's DP noise draws from numpy's global generator
    fedavg = CountingFedAvg(
        fraction_train=2 / 3, min_train_nodes=2, min_available_nodes=3, fraction_evaluate=0.0
    )
    dp = dp_class(fedavg, noise_multiplier=NOISE, clipping_norm=CLIP, num_sampled_clients=2)
    reporter = ClaimRecorder.for_audit(canary_seed=SEED, num_canaries=K)
    canaries = LocalCanaries(SEED, num_canaries=K, num_rounds=ROUNDS, clients_per_round=2)
    strategy = CanaryAuditStrategy(dp, reporter=reporter, canaries=canaries)
    grid = LoopGrid(nodes=(11, 12, 13), seed=noise_seed)
    strategy.start(grid, ArrayRecord([np.zeros(1000, np.float32)]), num_rounds=ROUNDS)

    alarm = reporter.final_alarm("no dilution", SEED, K, ROUNDS)
    return alarm, fedavg.aggregated, grid.sent, strategy, reporter


@pytest.mark.parametrize("noise_seed", [1, 2])
def test_a_planted_quarter_noise_bug_raises_the_alarm_and_the_correct_run_does_not(noise_seed):
    assert 35 <= int(seen_mask(SEED, K).sum()) <= 65
    buggy, aggregated, sent, strategy, reporter = audit(QuietNoise, noise_seed)
    assert aggregated == [2] * ROUNDS  # exactly num_sampled_clients replies, every round
    # the canaries displaced real clients: sent + displaced = the 2 sampled, every round
    assert len(sent) == 2 * ROUNDS  # per round: the train messages, then (no) evaluate ones
    assert [s + strategy.displaced[t] for t, s in enumerate(sent[::2], start=1)] == [2] * ROUNDS
    assert sum(m.num_canaries_inserted for _, m in reporter.rounds) == int(seen_mask(SEED, K).sum())
    assert buggy.status == "error", buggy.to_dict()

    correct, aggregated, _, _, _ = audit(DifferentialPrivacyServerSideFixedClipping, noise_seed)
    assert aggregated == [2] * ROUNDS
    assert correct.status != "error" and not [
        r for r in correct.rejected if r.get("level") == "error"
    ], correct.to_dict()
