"""Flower's round loop driven by hand, no Ray (shared by the service tests that run a
``CanaryAuditStrategy`` in process and benchmarks/frozen_service.py): a grid of three nodes,
Flower's server-side DP wrapper around FedAvg, and the replies of clients that each move the
model a little. The model is two arrays (``SHAPES``: 630 values)."""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg

SHAPES = [(20, 30), (30,)]
DIM = 630


class Grid3:
    def get_node_ids(self):
        return [1, 2, 3]


def dp_fedavg(noise_multiplier: float = 0.5, clip_norm: float = 0.5, **options):
    """Flower's ``DifferentialPrivacyServerSideFixedClipping`` around FedAvg, all 3 nodes
    sampled; ``options`` (e.g. ``accountant``) go to the wrapper."""
    return DifferentialPrivacyServerSideFixedClipping(
        FedAvg(min_train_nodes=3, min_available_nodes=3, fraction_evaluate=0.0),
        noise_multiplier=noise_multiplier,
        clipping_norm=clip_norm,
        num_sampled_clients=3,
        **options,
    )


def attached_strategy(
    http, url: str, auth: dict, *, num_canaries: int, fetch_timeout: float, **options
):
    """An attached audit (``num_canaries`` canaries) created through ``http`` on the service at
    ``url`` and a ``CanaryAuditStrategy`` around :func:`dp_fedavg` reporting to it
    (``options``: the strategy's); returns (audit id, reporter, strategy)."""
    from flaudit.server.http_reporter import HttpRoundReporter
    from flaudit.server.wrapper import CanaryAuditStrategy

    body = http.post(
        "/audits",
        json={
            "engine": "external",
            "num_canaries": num_canaries,
            "max_canary_fraction": 1.0,
            "delta": 1e-5,
        },
        headers=auth,
    ).json()
    audit_id, token = body["id"], body["environment"]["FLAUDIT_RUN_TOKEN"]
    reporter = HttpRoundReporter(url, audit_id, token, fetch_timeout=fetch_timeout)
    return audit_id, reporter, CanaryAuditStrategy(dp_fedavg(), reporter=reporter, **options)


def initial_arrays(rng) -> ArrayRecord:
    return ArrayRecord([rng.standard_normal(s).astype(np.float32) for s in SHAPES])


def flat(arrays: ArrayRecord) -> np.ndarray:
    return np.concatenate([a.ravel() for a in arrays.to_numpy_ndarrays()])


def reply(msg: Message, vec: np.ndarray) -> Message:
    """A client's reply to ``msg``: the model ``vec`` (630 values) and 10 examples."""
    content = RecordDict(
        {
            "arrays": ArrayRecord([vec[:600].reshape(20, 30), vec[600:]]),
            "metrics": MetricRecord({"num-examples": 10}),
        }
    )
    return Message(content=content, reply_to=msg)


def small_steps(messages, arrays: ArrayRecord, rng, clip_norm: float = 0.5) -> list[Message]:
    """Each client moves the model by a tenth of the clip norm in a random direction."""
    current = flat(arrays)
    replies = []
    for msg in messages:
        u = rng.standard_normal(DIM).astype(np.float32)
        replies.append(reply(msg, current + u * (0.1 * clip_norm / np.linalg.norm(u))))
    return replies
