"""Tests only, never in your app: a planted DP bug, chosen per run with the run-config key
``planted-bug`` (``"short-noise"``), so that a test can check that the audit catches it; and
:func:`seed_run`, the run-config key ``test-seed`` that makes a run's random draws reproducible.

``ShortNoise`` is Flower's ``DifferentialPrivacyServerSideFixedClipping`` that declares its
noise multiplier ``z`` (the audit reads it as the claim) but adds noise ``f z C / n``, with
``f`` the run-config key ``planted-noise-factor`` (default :data:`NOISE_FACTOR`, 0.5).
"""

import random
import time

import numpy as np
import torch
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping

#: The factor ``ShortNoise`` applies to the noise it adds, unless the run config says otherwise.
NOISE_FACTOR = 0.5


class ShortNoise(DifferentialPrivacyServerSideFixedClipping):
    """Claims ``noise_multiplier``, adds ``noise_factor`` times that noise."""

    noise_factor = NOISE_FACTOR

    def aggregate_train(self, server_round, replies):
        claimed = self.noise_multiplier
        self.noise_multiplier = claimed * self.noise_factor
        try:
            return super().aggregate_train(server_round, replies)
        finally:
            self.noise_multiplier = claimed


def dp_wrapper_class(run_config):
    """Flower's DP wrapper, or ``ShortNoise`` when the run config asks for the planted bug."""
    bug = run_config.get("planted-bug", "")
    if bug == "short-noise":
        factor = float(run_config.get("planted-noise-factor", NOISE_FACTOR))
        if not 0.0 <= factor < 1.0:
            raise ValueError(f"planted-noise-factor must be in [0, 1), got {factor!r}")
        return type("ShortNoise", (ShortNoise,), {"noise_factor": factor})
    if bug:
        raise ValueError(f"unknown planted-bug {bug!r} (known: 'short-noise')")
    return DifferentialPrivacyServerSideFixedClipping


def seed_run(run_config, strategy=None, *, stream=0):
    """Run-config ``test-seed`` (0: unseeded, as in your app): seed what this process draws at
    random. The ServerApp (``strategy``: the audit wrapper): Python's ``random`` (Flower samples
    the cohort with it), NumPy's global generator (Flower's DP wrappers draw the noise from it),
    torch (the initial model) and the cohort slots the canaries take. A ClientApp (``stream``:
    partition and round): torch, which shuffles its batches. The canary seed is the service's
    (``tests/seeded_service.py``); which SuperNode holds which partition: :func:`seeded_grid`."""
    seed = int(run_config.get("test-seed", 0))
    if seed <= 0:
        return
    torch.manual_seed(seed * 100_003 + stream)
    if strategy is not None:
        random.seed(seed)
        np.random.seed(seed)
        strategy.audit._slot_rng = np.random.default_rng(seed)


class PartitionOrderedGrid:
    """``grid`` whose ``get_node_ids`` lists the nodes in the order of their partitions: the
    SuperLink draws node ids at random, so a seeded cohort of list positions is the same
    partitions every run only in this order. Flower draws the cohort from Python's ``random``
    right after listing the nodes, and its retries draw from it too, as many times as the
    network makes them: so each listing reseeds ``random`` from ``(seed, listing number)``.
    Everything else is ``grid``'s."""

    def __init__(self, grid, partition_of: dict[int, int], seed: int):
        self._grid = grid
        self._partition_of = partition_of
        self._seed = seed
        self._listings = 0

    def get_node_ids(self):
        nodes = list(self._grid.get_node_ids())
        self._listings += 1
        random.seed(self._seed * 100_003 + self._listings)
        return sorted(nodes, key=lambda node: self._partition_of.get(node, len(nodes) + node))

    def __getattr__(self, name):
        return getattr(self._grid, name)


def seeded_grid(grid, run_config, *, timeout: float = 300.0):
    """With run-config ``test-seed`` > 0: wait for ``min-available-nodes`` nodes, ask each its
    partition (the ClientApp's ``query.partition``), and return the grid listing them in that
    order; else ``grid``."""
    seed = int(run_config.get("test-seed", 0))
    if seed <= 0:
        return grid
    deadline = time.monotonic() + timeout
    while len(nodes := list(grid.get_node_ids())) < int(run_config["min-available-nodes"]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(nodes)} nodes connected in {timeout:.0f} s")
        time.sleep(1)
    asks = [Message(RecordDict(), dst_node_id=node, message_type="query.partition")
            for node in nodes]
    partition_of = {}
    for reply in grid.send_and_receive(asks, timeout=timeout):
        if reply.has_error():
            raise RuntimeError(f"node {reply.metadata.src_node_id}: {reply.error}")
        partition_of[reply.metadata.src_node_id] = int(reply.content["partition"]["id"])
    if sorted(partition_of) != sorted(nodes):
        raise RuntimeError(f"partitions of {sorted(partition_of)}, nodes {sorted(nodes)}")
    return PartitionOrderedGrid(grid, partition_of, seed)


def partition_reply(msg, context):
    """The ClientApp's answer to ``query.partition``: its partition id."""
    record = ConfigRecord({"id": int(context.node_config["partition-id"])})
    return Message(RecordDict({"partition": record}), reply_to=msg)
