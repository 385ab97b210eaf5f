"""Bring your own Flower app: a strategy wrapper that inserts canary clients and reports rounds.

In the spirit of Flower's ``DifferentialPrivacyServerSideFixedClipping``: wrap your (DP) strategy
and keep everything else. Each scheduled seen canary becomes one extra *reply* in
``aggregate_train``: a model ``theta_{t-1} + S c_j`` carrying the same example-count weight as the
real replies, so the inner strategy clips, averages and noises it exactly like a client. After
aggregation the wrapper reports ``Delta_t`` (and ``theta_0`` / ``theta_T``) to a
:class:`~server.reporting.RoundReporter`.

Use it around a server-side-clipping DP strategy, outermost::

    inner = DifferentialPrivacyServerSideFixedClipping(FedAvg(...), noise_multiplier=z,
                                                       clipping_norm=S, num_sampled_clients=m)
    strategy = CanaryAuditStrategy(inner, reporter=reporter, canary_seed=seed, num_canaries=k,
                                   clip_norm=S, noise_multiplier=z, num_rounds=T)

Notes
-----
* Replies must carry model parameters (as Flower's FedAvg expects), not deltas.
* The real clients are sampled by your strategy; only the canaries follow
  :func:`server.schedules.canary_rounds` (``canary_repeats`` rounds each, one per period). Count
  the expected canaries per round in ``num_sampled_clients`` of a strict (accounted) inner
  strategy, which refuses a reply count other than the one it sampled.
* Flower's FedAvg weights replies by example count: the wrapper gives each canary the weight of
  the first real reply; DP needs equal weights anyway.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from auditor.canaries import canary_vector, seen_mask
from auditor.validation import check_at_least, check_positive
from server.dpfedavg import canary_update
from server.reporting import RoundMetadata, RoundReporter
from server.schedules import canary_rounds
from server.vectors import flatten, unflatten

__all__ = ["CanaryAuditStrategy"]


def _record_vector(record: ArrayRecord) -> np.ndarray:
    return flatten(record.to_numpy_ndarrays())


class CanaryAuditStrategy(Strategy):
    """Wrap ``strategy``: insert seen canaries into ``aggregate_train`` and report every round.

    Parameters
    ----------
    strategy : flwr.serverapp.strategy.Strategy
        The strategy to audit (clips, aggregates and adds noise).
    reporter : RoundReporter
        Where theta_0, Delta_t and theta_T go.
    canary_seed : int
        Secret master seed (never logged or shown in ``repr``).
    num_canaries : int
        Canaries ``k >= 2`` (about half are seen).
    clip_norm : float
        ``S`` of the inner strategy; canary updates have exactly this norm.
    num_rounds : int
        Rounds ``T`` of the run (the canary schedule and the final report need it).
    noise_multiplier : float
        ``z`` of the inner strategy (reported as metadata only).
    canary_repeats : int
        Rounds each seen canary is presented in.
    schedule_seed : int
        Seed of the canary schedule (not secret).
    weight_key : str
        Metric key the inner strategy weights replies by.

    Raises
    ------
    ValueError
        Naming the bad argument.
    """

    def __init__(
        self,
        strategy: Strategy,
        *,
        reporter: RoundReporter,
        canary_seed: int,
        num_canaries: int,
        clip_norm: float,
        num_rounds: int,
        noise_multiplier: float = 0.0,
        canary_repeats: int = 1,
        schedule_seed: int = 0,
        weight_key: str = "num-examples",
    ) -> None:
        if not isinstance(strategy, Strategy):
            raise ValueError(f"strategy must be a flwr Strategy, got {type(strategy).__name__}")
        check_at_least(num_canaries, "num_canaries", 2)
        check_positive(clip_norm, "clip_norm")
        check_at_least(num_rounds, "num_rounds", 1)
        check_at_least(noise_multiplier, "noise_multiplier", 0)
        if not 1 <= canary_repeats <= num_rounds:
            raise ValueError(f"canary_repeats must be in [1, num_rounds], got {canary_repeats}")
        self.strategy = strategy
        self.reporter = reporter
        self._seed = canary_seed
        self.num_canaries = int(num_canaries)
        self.clip_norm = float(clip_norm)
        self.num_rounds = int(num_rounds)
        self.noise_multiplier = float(noise_multiplier)
        self.canary_repeats = int(canary_repeats)
        self.weight_key = weight_key
        self._seen = np.flatnonzero(seen_mask(canary_seed, self.num_canaries))
        rounds = canary_rounds(
            self._seen.size,
            num_rounds=self.num_rounds,
            repeats=self.canary_repeats,
            rng=np.random.default_rng(np.random.SeedSequence(int(schedule_seed), spawn_key=(0xCA,))),
        )
        self._by_round: dict[int, list[int]] = {}
        for position, row in enumerate(rounds):
            for t in row:
                self._by_round.setdefault(int(t) + 1, []).append(int(self._seen[position]))
        self._current: ArrayRecord | None = None
        self._template: Message | None = None
        self._initial_reported = False
        self._final_reported = False

    def __repr__(self) -> str:
        return f"CanaryAuditStrategy({self.strategy!r}, num_canaries={self.num_canaries})"

    def summary(self) -> None:
        log(INFO, "\t├──> Canary audit: %d canaries, repeats %d, clip norm %s",
            self.num_canaries, self.canary_repeats, self.clip_norm)
        self.strategy.summary()

    def canaries_in_round(self, server_round: int) -> int:
        """How many seen canaries are inserted in ``server_round`` (no identities)."""
        return len(self._by_round.get(server_round, []))

    # -- training ------------------------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._current = arrays
        if not self._initial_reported:
            self.reporter.report_initial(_record_vector(arrays))
            self._initial_reported = True
        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        self._template = messages[0] if messages else None
        return messages

    def _canary_reply(self, vector: np.ndarray, like: Message, weight: float) -> Message:
        name, record = next(iter(like.content.array_records.items()))
        shapes = [a.shape for a in record.to_numpy_ndarrays()]
        dtypes = [a.dtype for a in record.to_numpy_ndarrays()]
        arrays = unflatten(vector, shapes, dtypes=dtypes)
        content = RecordDict({
            name: ArrayRecord({k: Array(np.asarray(a)) for k, a in zip(record.keys(), arrays)}),
            "metrics": MetricRecord({self.weight_key: weight}),
        })
        return Message(content=content, reply_to=self._template)

    def _reply_weight(self, reply: Message) -> float:
        metrics = next(iter(reply.content.metric_records.values()), None)
        return float(metrics.get(self.weight_key, 1.0)) if metrics is not None else 1.0

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        valid = [r for r in replies if not r.has_error() and r.content.array_records]
        current = _record_vector(self._current) if self._current is not None else None
        inserted = 0
        num_clipped = 0
        if current is not None and valid and self._template is not None:
            for reply in valid:
                update = _record_vector(next(iter(reply.content.array_records.values()))) - current
                num_clipped += int(np.linalg.norm(update.astype(np.float64)) > self.clip_norm)
            weights = {self._reply_weight(reply) for reply in valid}
            if len(weights) > 1:
                raise ValueError(
                    f"replies of round {server_round} carry different '{self.weight_key}' values "
                    f"({sorted(weights)}): DP-FedAvg averages clipped updates with uniform weights "
                    "(weighting by example count breaks the DP guarantee, and canaries could not "
                    f"be aggregated like clients); report the same '{self.weight_key}' from "
                    "every client"
                )
            (weight,) = weights
            for j in self._by_round.get(server_round, []):
                direction = canary_vector(self._seed, j, current.size)
                model = (current + canary_update(direction, self.clip_norm)).astype(np.float32)
                replies.append(self._canary_reply(model, valid[0], weight))
                inserted += 1
        arrays, metrics = self.strategy.aggregate_train(server_round, replies)
        if arrays is not None and current is not None:
            new = _record_vector(arrays)
            self.reporter.report_round(
                server_round,
                new - current,
                RoundMetadata(
                    clip_norm=self.clip_norm,
                    cohort_size=len(valid) + inserted,
                    num_canaries_inserted=inserted,
                    num_failures=len(replies) - inserted - len(valid),
                    clipped_fraction=num_clipped / len(valid) if valid else 0.0,
                    noise_stddev=self.noise_multiplier * self.clip_norm,
                ),
            )
            if server_round == self.num_rounds and not self._final_reported:
                self.reporter.report_final(new, {})
                self._final_reported = True
        return arrays, metrics

    # -- evaluation: unchanged -----------------------------------------------------------
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)
