"""Flower's adaptive-clipping DP wrappers noise a round for the clip norm *after* its update.

A self-contained reproduction (numpy + flwr only; no flaudit import, no Ray, no network), meant
to be sent upstream (issue #38). It drives Flower's own
``flwr.serverapp.strategy.DifferentialPrivacyServerSideAdaptiveClipping`` (Message API) and the
legacy ``flwr.server.strategy.DifferentialPrivacyServerSideAdaptiveClipping`` directly: each
round it hands ``aggregate_train`` / ``aggregate_fit`` ``n`` synthetic replies of known updates,
clips them itself to the norm ``C_clip`` the wrapper holds before aggregating, subtracts that
clipped mean from the released aggregate, and measures the standard deviation of what is left
(the noise actually added, over ``d`` coordinates). DP-FedAvg with adaptive clipping (Andrew et
al. 2021, Alg. 1) must add ``z * C_clip / n`` (``z``: Flower's update noise multiplier
``noise_multiplier``); Flower adds ``z * C_noise / n`` with ``C_noise`` the clip norm after its
geometric update (``_geometric_update`` runs before ``_add_noise_to_aggregated_arrays``). The
table prints per round ``C_clip``, ``C_noise``, the measured noise std over ``z * C_clip / n``,
and ``C_noise / C_clip``: the two columns agree, and a factor below 1 is a round with less noise
than its clipped updates need.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/flower_adaptive_mismatch.py
    PYTHONPATH=$PWD .venv/bin/python benchmarks/flower_adaptive_mismatch.py --api legacy

Seeded (``--seed``): the replies' norms and the wrapper's noise (numpy's global RNG, which
Flower uses) are reproducible.
"""

from __future__ import annotations

import argparse
import math
import statistics

import numpy as np


class _Nodes:
    """The one thing Flower's FedAvg.configure_train asks a Grid for."""

    def __init__(self, n: int) -> None:
        self.n = n

    def get_node_ids(self):
        return list(range(1, self.n + 1))


def _clip(update: np.ndarray, norm: float) -> np.ndarray:
    length = float(np.linalg.norm(update))
    return update * min(1.0, norm / length) if length > 0 else update


def _updates(rng, n: int, d: int, clip_norm: float, spread: float) -> list[np.ndarray]:
    """``n`` updates with log-normal norms around ``clip_norm`` (some clipped, some not)."""
    out = []
    for _ in range(n):
        u = rng.standard_normal(d)
        out.append(u / np.linalg.norm(u) * clip_norm * math.exp(spread * rng.standard_normal()))
    return out


def _row(dp, current, new, updates, c_clip: float) -> tuple[float, float, float, float]:
    """One round: (the clip norm used, the next round's, the noise added as a multiple of
    z * C_used / n, the share of updates clipped)."""
    n = len(updates)
    noise = np.std(new - (current + np.mean([_clip(u, c_clip) for u in updates], axis=0)))
    return (
        c_clip,
        float(dp.clipping_norm),
        noise / (dp.noise_multiplier * c_clip / n),
        np.mean([np.linalg.norm(u) > c_clip for u in updates]),
    )


def _adaptive(wrapper, strategy, args):
    """Flower's server-side adaptive clipping (``wrapper``: the Message API's or the legacy
    class) around ``strategy``, as the command line sets it."""
    return wrapper(
        strategy,
        noise_multiplier=args.z,
        num_sampled_clients=args.clients,
        initial_clipping_norm=args.clip,
        clipped_count_stddev=args.count_stddev,
    )


def run_message_api(args, rng) -> list[tuple[float, float, float, float]]:
    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideAdaptiveClipping, FedAvg
    from flwr.supercore.task_identity import TaskIdentity

    # what a ServerApp sees inside a run: Messages can then be built outside one
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    n, d = args.clients, args.dim
    dp = _adaptive(
        DifferentialPrivacyServerSideAdaptiveClipping,
        FedAvg(min_train_nodes=n, min_available_nodes=n, fraction_train=1.0, fraction_evaluate=0.0),
        args,
    )
    current = np.zeros(d, dtype=np.float32)
    rows = []
    for t in range(1, args.rounds + 1):
        arrays = ArrayRecord([current])
        messages = list(dp.configure_train(t, arrays, ConfigRecord({}), _Nodes(n)))
        c_clip = float(dp.clipping_norm)  # what aggregate_train will clip to
        updates = _updates(rng, n, d, args.norm or c_clip, args.spread)
        replies = [
            Message(
                content=RecordDict(
                    {
                        "arrays": ArrayRecord([(current + u).astype(np.float32)]),
                        "metrics": MetricRecord({"num-examples": 1}),
                    }
                ),
                reply_to=m,
            )
            for m, u in zip(messages, updates)
        ]
        released, _ = dp.aggregate_train(t, replies)
        new = released.to_numpy_ndarrays()[0].astype(np.float64)
        rows.append(_row(dp, current, new, updates, c_clip))
        current = new.astype(np.float32)
    return rows


def run_legacy(args, rng) -> list[tuple[float, float, float, float]]:
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import DifferentialPrivacyServerSideAdaptiveClipping, FedAvg

    n, d = args.clients, args.dim
    dp = _adaptive(
        DifferentialPrivacyServerSideAdaptiveClipping,
        FedAvg(min_fit_clients=n, min_available_clients=n),
        args,
    )
    current = np.zeros(d, dtype=np.float32)
    rows = []
    for t in range(1, args.rounds + 1):
        dp.current_round_params = [current]  # what configure_fit stores
        c_clip = float(dp.clipping_norm)
        updates = _updates(rng, n, d, args.norm or c_clip, args.spread)
        results = [
            (
                None,
                FitRes(
                    status=Status(code=Code.OK, message=""),
                    parameters=ndarrays_to_parameters([(current + u).astype(np.float32)]),
                    num_examples=1,
                    metrics={},
                ),
            )
            for u in updates
        ]
        released, _ = dp.aggregate_fit(t, results, [])
        new = parameters_to_ndarrays(released)[0].astype(np.float64)
        rows.append(_row(dp, current, new, updates, c_clip))
        current = new.astype(np.float32)
    return rows


def main(argv=None) -> list[tuple[float, float, float, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", choices=("message", "legacy"), default="message")
    parser.add_argument("--z", type=float, default=1.0, help="configured noise multiplier")
    parser.add_argument(
        "--count-stddev",
        type=float,
        default=1.0,
        help="clipped_count_stddev (Flower's default n/20 fails at z=1, n<11)",
    )
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--dim", type=int, default=100_000)
    parser.add_argument("--clip", type=float, default=1.0, help="initial clipping norm")
    parser.add_argument(
        "--norm",
        type=float,
        default=None,
        help="median norm of the replies' updates (default: C_clip of the round)",
    )
    parser.add_argument(
        "--spread",
        type=float,
        default=0.5,
        help="log-normal spread of the replies' norms around their median",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    np.random.seed(args.seed)  # Flower's wrappers draw their noise from numpy's global RNG
    rng = np.random.default_rng(args.seed + 1)
    import logging

    logging.getLogger("flwr").setLevel(logging.WARNING)
    rows = (run_message_api if args.api == "message" else run_legacy)(args, rng)
    print(
        f"Flower {args.api} API, DifferentialPrivacyServerSideAdaptiveClipping: z = {args.z}, "
        f"clipped_count_stddev = {args.count_stddev}, n = {args.clients}, d = {args.dim}"
    )
    print(" round   C_clip  C_noise  measured noise / (z_delta*C_clip/n)  C_noise/C_clip  clipped")
    for t, (c_clip, c_noise, measured, clipped) in enumerate(rows, start=1):
        print(
            f"{t:6d} {c_clip:8.4f} {c_noise:8.4f} {measured:36.4f} {c_noise / c_clip:15.4f} "
            f"{clipped:8.2f}"
        )
    measured = [row[2] for row in rows]
    expected = [row[1] / row[0] for row in rows]
    print(
        f"measured noise / needed: median {statistics.median(measured):.3f}, "
        f"range {min(measured):.3f}-{max(measured):.3f}; rounds with less noise than their "
        f"clip norm needs: {sum(m < 1 for m in expected)} of {len(rows)}; largest gap between "
        f"measured and C_noise/C_clip: {max(abs(a - b) for a, b in zip(measured, expected)):.4f}"
    )
    print(
        f"clip norm: {rows[0][0]:.4g} -> {rows[-1][1]:.4g} with {np.mean([r[3] for r in rows]):.0%} "
        f"of the replies clipped (target_clipped_quantile 0.5)"
    )
    return rows


if __name__ == "__main__":
    main()
