"""The built-in DP-FedAvg of flaudit's own ServerApp as a Message-API strategy
(:class:`BuiltinDPFedAvg`).

flaudit's ServerApp (:mod:`.app`) is a Flower app like any other: this strategy, wrapped by
:class:`flaudit.server.wrapper.CanaryAuditStrategy`, run by Flower's ``Strategy.start``. The
wrapper is the one place a canary enters a round, for this strategy as for a user's (issue #29).

Per round ``t`` the strategy

* ``configure_train``: sends the global model to the real clients the participation schedule
  draws (:func:`flaudit.auditor.schedules.participation_schedule`, with the seen canaries' rounds
  drawn alongside), partition ``p`` on node ``p mod #nodes`` (node ids sorted; it waits for
  ``min_nodes`` SuperNodes before round 1);
* ``aggregate_train``: drops failed or malformed replies (counted), clips the clients' deltas,
  adds ``S(t)`` times the round's canary sum the wrapper handed over (:meth:`add_canary_sum`:
  canaries do not take cohort slots here, the sum is divided by the calibration size ``m``
  whatever the replies, so they do not dilute the mechanism), adds the noise, divides by ``m``
  (:func:`flaudit.server.dpfedavg.aggregate_round`), takes the server step and moves an adaptive
  clip norm. :attr:`release` is the round's released noisy aggregate ``rho_bar_t`` with what the
  wrapper reports beside it (the model delta mixes rounds under server momentum).

An injected bug (:class:`flaudit.auditor.bugs.InjectedBug`, testing only) acts in the
aggregation or, ``extra_participation``, in the schedule. Clients never receive a canary.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from logging import INFO

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from ..auditor.schedules import audit_canary_repeats, participation_schedule
from ..auditor.spec import AuditSpec
from ..auditor.validation import check_at_least
from ..protocol.vectors import flatten
from .dpfedavg import AdaptiveClipNorm, ServerOptimizer, aggregate_round

__all__ = ["BuiltinDPFedAvg", "RoundRelease"]


@dataclass(frozen=True)
class RoundRelease:
    """Round ``t``'s released aggregate and what is reported with it.

    Attributes
    ----------
    update : numpy.ndarray
        ``rho_bar_t = (rho + noise) / m``, float32 ``(d,)``.
    clip_norm : float
        ``S(t)``.
    num_clients : int
        Real clients whose update went in.
    num_canaries : int
        Canaries in the sum (the wrapper's count).
    num_failures : int
        Clients sent a message that returned no usable update.
    clipped_fraction, noise_stddev : float
        As in :class:`flaudit.server.dpfedavg.RoundAggregate`.
    train_loss : float or None
        Mean of the clients' ``train-loss``.
    """

    update: np.ndarray
    clip_norm: float
    num_clients: int
    num_canaries: int
    num_failures: int
    clipped_fraction: float
    noise_stddev: float
    train_loss: float | None


class BuiltinDPFedAvg(Strategy):
    """DP-FedAvg with a participation schedule, uniform weights and calibration size ``m``.

    Parameters
    ----------
    spec : AuditSpec
        The audit: task, clients, rounds, clipping (fixed or adaptive), noise, server optimizer,
        participation and an injected bug.
    num_seen_canaries : int
        Seen canaries (a count; which ones stays with the wrapper's canary source): their rounds
        are drawn in the same participation schedule as the real clients'.
    deadline : float, optional
        ``time.monotonic()`` after which a round raises :class:`TimeoutError`.
    min_nodes : int
        SuperNodes to wait for before round 1.
    noise_seed : int, optional
        Seed of the DP noise (tests, benchmarks); default: fresh OS entropy.
    progress : callable, optional
        ``progress(round, num_rounds)`` after each round.
    """

    def __init__(
        self,
        spec: AuditSpec,
        *,
        num_seen_canaries: int,
        deadline: float | None = None,
        min_nodes: int = 1,
        noise_seed: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        check_at_least(num_seen_canaries, "num_seen_canaries", 0)
        check_at_least(min_nodes, "min_nodes", 1)
        self.spec = spec
        self.deadline = deadline
        self.min_nodes = int(min_nodes)
        self.progress = progress
        self.noise_multiplier = float(spec.noise_multiplier)
        self.schedule = participation_schedule(
            num_clients=spec.num_clients,
            num_seen_canaries=int(num_seen_canaries),
            num_rounds=spec.num_rounds,
            participation=spec.participation,
            clients_per_round=spec.clients_per_round,
            sampling_probability=spec.sampling_probability,
            canary_repeats=audit_canary_repeats(spec),
            max_participations=spec.max_participations,
            seed=spec.data_seed,
        )
        self._rng = np.random.default_rng(noise_seed)  # the DP noise and the clip count's
        self._optimizer = ServerOptimizer(
            learning_rate=spec.server_learning_rate, momentum=spec.server_momentum
        )
        self._adaptive = None
        if spec.adaptive_clipping is not None:
            ac = spec.adaptive_clipping
            self._adaptive = AdaptiveClipNorm(
                initial_clip_norm=ac.initial_clip_norm,
                target_quantile=ac.target_quantile,
                learning_rate=ac.learning_rate,
                count_stddev=ac.count_stddev(spec.clients_per_round),
            )
        # expected real clients per round: the (data-independent) denominator of the clip count
        self._expected_real = (
            spec.clients_per_round * spec.num_clients / (spec.num_clients + spec.num_canaries / 2)
        )
        self._task_options = json.dumps(spec.task_options, sort_keys=True)
        self.nodes: list[int] | None = None
        self._canary_sums: dict[int, tuple[np.ndarray, int]] = {}
        self._sent: dict[int, int] = {}
        self._clip: dict[int, float] = {}
        self._model: np.ndarray | None = None
        #: round t's release, set by ``aggregate_train(t)``
        self.release: RoundRelease | None = None
        #: per round trained: ``clip_norm``, ``cohort_size`` (clients + canaries), ``num_failures``
        self.round_stats: dict[int, dict[str, float]] = {}

    def __repr__(self) -> str:
        return f"BuiltinDPFedAvg(noise_multiplier={self.noise_multiplier})"

    def summary(self) -> None:
        spec = self.spec
        clipping = (
            f"clip norm {spec.clip_norm}"
            if self._adaptive is None
            else f"adaptive clipping from {spec.adaptive_clipping.initial_clip_norm}"
        )
        log(
            INFO,
            "\t├──> DP-FedAvg: noise multiplier %s, %s, m = %d of %d clients (%s)",
            spec.noise_multiplier,
            clipping,
            spec.clients_per_round,
            spec.num_clients,
            getattr(spec.participation, "value", spec.participation),
        )

    @property
    def clipping_norm(self) -> float:
        """``S(t)`` of the next round (adaptive clipping moves it after each round)."""
        return (
            self._adaptive.clip_norm if self._adaptive is not None else float(self.spec.clip_norm)
        )

    def check_deadline(self, what: str) -> float | None:
        """Seconds left before the deadline (None: none); :class:`TimeoutError` past it."""
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"audit timed out ({what})")
        return left

    def _wait_for_nodes(self, grid: Grid) -> list[int]:
        while True:
            nodes = sorted(int(n) for n in grid.get_node_ids())
            if len(nodes) >= self.min_nodes:
                return nodes
            self.check_deadline(f"waiting for {self.min_nodes} SuperNodes, {len(nodes)} connected")
            time.sleep(0.5)

    # -- canaries: handed over by the wrapper ---------------------------------------------
    def add_canary_sum(self, server_round: int, canary_sum: np.ndarray | None, count: int) -> None:
        """Round ``server_round`` adds ``S(t)`` times ``canary_sum``, the sum of ``count`` unit
        canaries (:class:`flaudit.server.wrapper.CanaryAuditStrategy` calls it before
        ``aggregate_train``; none handed over: the round has no canaries)."""
        check_at_least(count, "count", 0)
        self._canary_sums[int(server_round)] = (canary_sum, int(count))

    # -- training --------------------------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The global model to the round's scheduled real clients (never a canary)."""
        t = int(server_round)
        self.check_deadline(f"before round {t}")
        if self.nodes is None:
            self.nodes = self._wait_for_nodes(grid)
        self._model = flatten(arrays.to_numpy_ndarrays())
        self._clip[t] = self.clipping_norm
        spec, nodes = self.spec, self.nodes
        messages = []
        for p in self.schedule.real_clients(t):
            train = ConfigRecord(
                {
                    "partition-id": int(p),
                    "num-partitions": spec.num_clients,
                    "task": spec.task,
                    "task-options": self._task_options,
                    "data-seed": spec.data_seed,
                    "server-round": t,
                    "local-epochs": spec.local_epochs,
                    "learning-rate": spec.client_learning_rate,
                    "batch-size": spec.batch_size,
                }
            )
            messages.append(
                Message(
                    content=RecordDict({"arrays": arrays, "config": train}),
                    message_type=MessageType.TRAIN,
                    dst_node_id=nodes[int(p) % len(nodes)],
                    group_id=str(t),
                )
            )
        self._sent[t] = len(messages)
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Clip, add the canaries, sum, noise, divide by ``m``, step; :attr:`release` is set."""
        t = int(server_round)
        model = self._model
        dim = int(model.shape[0])
        updates, losses = [], []
        for reply in replies:
            if reply.has_error():
                continue
            try:
                delta = reply.content["arrays"].to_numpy_ndarrays()[0]
            except (KeyError, IndexError):
                continue
            delta = np.asarray(delta, dtype=np.float32).reshape(-1)
            if delta.shape != (dim,) or not np.all(np.isfinite(delta)):
                continue  # a malformed update counts as a failure
            updates.append(delta)
            metrics = reply.content.get("metrics")
            if metrics is not None and "train-loss" in metrics:
                losses.append(float(metrics["train-loss"]))
        self.check_deadline(f"round {t}")
        canary_sum, count = self._canary_sums.pop(t, (None, 0))
        clip_norm = self._clip.pop(t, self.clipping_norm)
        bug = self.spec.inject_bug
        aggregate = aggregate_round(
            client_updates=updates,
            canary_directions=[],
            canary_sum=canary_sum if count else None,
            num_summed_canaries=count,
            clip_norm=clip_norm,
            noise_multiplier=self.spec.noise_multiplier,
            expected_cohort_size=self.spec.clients_per_round,
            dim=dim,
            rng=self._rng,
            bug=bug,
        )
        self._model, _ = self._optimizer.step(model, aggregate.update)
        train_loss = float(np.mean(losses)) if losses else None
        self.release = RoundRelease(
            update=aggregate.update.astype(np.float32),
            clip_norm=clip_norm,
            num_clients=len(updates),
            num_canaries=count,
            num_failures=self._sent.pop(t, 0) - len(updates),
            clipped_fraction=aggregate.clipped_fraction,
            noise_stddev=aggregate.noise_stddev,
            train_loss=train_loss,
        )
        self.round_stats[t] = {
            "clip_norm": clip_norm,
            "cohort_size": len(updates) + count,
            "num_failures": self.release.num_failures,
        }
        if self._adaptive is not None:
            self._adaptive.update(
                num_unclipped=len(updates) - aggregate.num_clipped,
                expected_count=max(self._expected_real, 1.0),
                rng=self._rng,
            )
        if self.progress is not None:
            self.progress(t, self.spec.num_rounds)
        metrics_out = MetricRecord({"train-loss": train_loss}) if train_loss is not None else None
        return ArrayRecord([self._model]), metrics_out

    # -- evaluation: on the server, at the end (ServerApp's evaluate_fn) -----------------------
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return []

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        return None
