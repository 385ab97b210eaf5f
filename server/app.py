"""Flower ServerApp (Message API): DP-FedAvg with random canary clients.

The main loop (:func:`run_audit`)

1. builds the task's initial model ``theta_0`` and reports it;
2. waits for the SuperNodes and maps their (random) node ids to stable partition ids
   (sorted node ids; partition ``p`` is trained on node ``p mod #nodes``);
3. draws the participation schedule for real clients and seen canaries alike
   (:func:`flaudit.auditor.schedules.participation_schedule`);
4. per round: sends the global model to the scheduled real clients, collects their deltas
   (clients that fail or time out are dropped and counted), adds ``S(t) c_j`` for each scheduled
   seen canary, clips, sums, adds noise, takes a server step (:mod:`flaudit.server.dpfedavg`) and reports
   the released noisy aggregate ``rho_bar_t = (rho + noise) / m`` (not ``theta_t - theta_{t-1}``,
   which mixes rounds under server momentum) with its metadata and the round's canary
   participants (seen canaries inserted + unseen canaries' drawn rounds, one merged list)
   through the :class:`~flaudit.server.reporting.RoundReporter`;
5. evaluates ``theta_T`` and reports it with the accuracy.

Canaries live only here: no client ever receives one. Round ``t``'s canary sum and participants
come from a :class:`~flaudit.server.canary_sums.CanarySums`: made from the seed in this process
(simulation, stand-alone demo) or fetched from the audit service (deployment).

Two entry points: :func:`make_server_app` (simulation: spec, secret seed and reporter are handed
over in memory) and the module-level ``app`` (deployment: read from the run config keys
``flaudit-spec`` (JSON), ``flaudit-num-seen-canaries``, ``flaudit-audit-id``,
``flaudit-ingest-url``, ``flaudit-run-token``; ``flaudit-min-nodes``, ``flaudit-round-timeout``
optional). The run config holds no seed (issue #29): whoever reads the SuperLink's run state
learns how many canaries are seen, not which; the service serves each round's canary sum
(``GET /audits/{id}/rounds/{t}/canary-sum``) and derives the round's participants itself.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    RecordDict,
)
from flwr.serverapp import Grid, ServerApp

from ..auditor.canaries import new_master_seed, resolve_canary_family, seen_mask
from ..auditor.schedules import audit_canary_repeats, participation_schedule
from ..auditor.spec import AuditSpec
from ..clients.tasks import load_task, set_model_vector
from ..protocol.wire import (
    RUN_CONFIG_AUDIT_ID,
    RUN_CONFIG_INGEST_URL,
    RUN_CONFIG_NUM_SEEN_CANARIES,
    RUN_CONFIG_RUN_TOKEN,
    RUN_CONFIG_SPEC,
)
from .canary_sums import CanarySums, LocalCanarySums, ServiceCanarySums
from .dpfedavg import AdaptiveClipNorm, ServerOptimizer, aggregate_round
from .http_reporter import HttpRoundReporter
from .reporting import LocalRoundReporter, RoundMetadata, RoundReporter

__all__ = ["AuditRuntime", "run_audit", "make_server_app", "app", "MIN_DIM", "check_dimension"]

logger = logging.getLogger(__name__)

#: Smallest model dimension accepted: below it canaries stop being nearly orthogonal to each
#: other and to the real updates, and the cosine null N(0, 1/d) is a poor description.
MIN_DIM = 100


def check_dimension(dim: int, num_canaries: int) -> None:
    """Reject models too small for the cosine null.

    Raises
    ------
    ValueError
        Naming ``task_options`` (where the model size is chosen) and ``num_canaries``.
    """
    if dim < MIN_DIM:
        raise ValueError(
            f"task_options: the model has d={dim} parameters; the cosine null needs d >= {MIN_DIM}"
        )
    if num_canaries > dim:
        raise ValueError(
            f"num_canaries ({num_canaries}) must not exceed the model dimension d={dim}"
        )


@dataclass(kw_only=True)
class AuditRuntime:
    """What the main loop needs besides the Grid.

    Attributes
    ----------
    spec : AuditSpec
    canary_seed : int, optional
        Secret master seed (kept out of ``repr``), handed over in memory: the canaries are made
        in this process (:class:`~flaudit.server.canary_sums.LocalCanarySums`).
    canaries : CanarySums, optional
        Instead of the seed, where each round's canary sum comes from (deployment: the service,
        :class:`~flaudit.server.canary_sums.ServiceCanarySums`). Exactly one of the two.
    reporter : RoundReporter
    deadline : float, optional
        ``time.monotonic()`` value after which the audit raises :class:`TimeoutError`.
    progress : callable, optional
        ``progress(round, num_rounds)`` after each round.
    round_timeout : float
        Seconds to wait for client replies in one round.
    min_nodes : int
        SuperNodes to wait for before the first round.
    noise_seed : int, optional
        Seed of the DP noise (tests and benchmarks); default: fresh OS entropy.
    """

    spec: AuditSpec
    reporter: RoundReporter
    canary_seed: int | None = field(default=None, repr=False)
    canaries: CanarySums | None = field(default=None, repr=False)
    deadline: float | None = None
    progress: Callable[[int, int], None] | None = None
    round_timeout: float = 600.0
    min_nodes: int = 1
    noise_seed: int | None = field(default=None, repr=False)
    result: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.canary_seed is None) == (self.canaries is None):
            raise ValueError("AuditRuntime takes exactly one of canary_seed and canaries")
        if self.canaries is None:
            self.canaries = LocalCanarySums(self.canary_seed, self.spec)


def _remaining(runtime: AuditRuntime) -> float | None:
    if runtime.deadline is None:
        return None
    return runtime.deadline - time.monotonic()


def _check_deadline(runtime: AuditRuntime, what: str) -> None:
    left = _remaining(runtime)
    if left is not None and left <= 0:
        raise TimeoutError(f"audit timed out ({what})")


#: Seconds between pulls for a round's replies. Flower's deployment Grid sleeps 3 s between
#: pulls in ``send_and_receive``, which adds up to 3 s to every round after its last reply.
REPLY_POLL_SECONDS = 0.2


def send_and_receive(grid: Grid, messages: list[Message], *, timeout: float) -> list[Message]:
    """``grid.send_and_receive`` with a short pull interval: push the messages, then pull
    replies every :data:`REPLY_POLL_SECONDS` until every message has one or ``timeout`` seconds
    have passed; return the replies received (as Flower's does). A grid without
    ``push_messages``/``pull_messages`` (the in-process test grid) is asked directly."""
    push = getattr(grid, "push_messages", None)
    pull = getattr(grid, "pull_messages", None)
    if push is None or pull is None:
        return list(grid.send_and_receive(messages, timeout=timeout))
    pending = set(push(messages))
    deadline = time.monotonic() + timeout
    replies: list[Message] = []
    while pending:
        received = list(pull(pending))
        replies.extend(received)
        pending.difference_update(m.metadata.reply_to_message_id for m in received)
        left = deadline - time.monotonic()
        if not pending or left <= 0:
            break
        time.sleep(min(REPLY_POLL_SECONDS, left))
    return replies


def _wait_for_nodes(grid: Grid, runtime: AuditRuntime) -> list[int]:
    while True:
        nodes = sorted(int(n) for n in grid.get_node_ids())
        if len(nodes) >= runtime.min_nodes:
            return nodes
        _check_deadline(runtime, f"waiting for {runtime.min_nodes} SuperNodes, {len(nodes)} connected")
        time.sleep(0.5)


def run_audit(grid: Grid, runtime: AuditRuntime) -> dict[str, Any]:
    """Run one audited DP-FedAvg training; return a summary (no seed, no canary identities)."""

    spec = runtime.spec
    started = time.monotonic()
    task = load_task(
        spec.task, num_partitions=spec.num_clients, seed=spec.data_seed, options=spec.task_options
    )
    model = task.initial_vector()
    dim = int(model.shape[0])
    check_dimension(dim, spec.num_canaries)
    family = resolve_canary_family(spec.canary_family, num_canaries=spec.num_canaries, dim=dim)
    # round t's canary sum and participants (the one canary rule, audit_canary_plan: uncapped,
    # as aggregate_round divides by the calibration size m whatever the replies, so canaries
    # beyond m do not dilute the mechanism; the wrapper's FedAvg divides by its reply count:
    # capped): from the seed here, or from the service, which keeps it (deployment)
    source: CanarySums = runtime.canaries
    num_seen = int(source.num_seen)
    bug = spec.inject_bug
    if bug is not None:
        logger.warning("bug injected: %s (testing only; the claim does not know about it)", bug.label)
    schedule = participation_schedule(
        num_clients=spec.num_clients,
        num_seen_canaries=num_seen,
        num_rounds=spec.num_rounds,
        participation=spec.participation,
        clients_per_round=spec.clients_per_round,
        sampling_probability=spec.sampling_probability,
        canary_repeats=audit_canary_repeats(spec),
        max_participations=spec.max_participations,
        seed=spec.data_seed,
    )
    noise_rng = np.random.default_rng(runtime.noise_seed)
    optimizer = ServerOptimizer(
        learning_rate=spec.server_learning_rate, momentum=spec.server_momentum
    )
    adaptive = None
    if spec.adaptive_clipping is not None:
        ac = spec.adaptive_clipping
        count_stddev = ac.count_stddev(spec.clients_per_round)
        adaptive = AdaptiveClipNorm(
            initial_clip_norm=ac.initial_clip_norm,
            target_quantile=ac.target_quantile,
            learning_rate=ac.learning_rate,
            count_stddev=count_stddev,
        )
    # Expected real clients per round: the (data-independent) denominator of the clip count.
    expected_real = spec.clients_per_round * spec.num_clients / (
        spec.num_clients + spec.num_canaries / 2
    )
    task_options = json.dumps(spec.task_options, sort_keys=True)

    runtime.reporter.report_initial(model)
    nodes = _wait_for_nodes(grid, runtime)
    total_failures = 0
    rounds: list[dict[str, float]] = []
    # The audit's own work -- round t's canary sum (it depends only on the schedule) and
    # reporting round t's release (scoring it, or sending it to the service) -- runs in order on
    # one background thread while the clients train, off the round's critical path; a report's
    # error surfaces at the next round and the last report is awaited before the final model.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="flaudit-audit") as audit_work:
        reported: Future[None] | None = None
        stopped: tuple[int, str] | None = None
        for t in range(1, spec.num_rounds + 1):
            if spec.stop_on_alarm and reported is not None:
                # stop on alarm: round t-1's report decides before round t trains (this waits
                # for the audit's work of round t-1, only with stop_on_alarm)
                reported.result()
                reason = getattr(runtime.reporter, "stop_reason", None)
                if reason:
                    stopped = (t - 1, str(reason))
                    logger.warning("stopping training after round %d: %s", t - 1, reason)
                    break
            _check_deadline(runtime, f"before round {t}")
            clip_norm = adaptive.clip_norm if adaptive is not None else float(spec.clip_norm)
            inserted = audit_work.submit(source.round_sum, t, dim)  # while the clients train
            partitions = schedule.real_clients(t)
            arrays = ArrayRecord([model])
            messages = []
            for p in partitions:
                config = ConfigRecord(
                    {
                        "partition-id": int(p),
                        "num-partitions": spec.num_clients,
                        "task": spec.task,
                        "task-options": task_options,
                        "data-seed": spec.data_seed,
                        "server-round": t,
                        "local-epochs": spec.local_epochs,
                        "learning-rate": spec.client_learning_rate,
                        "batch-size": spec.batch_size,
                    }
                )
                messages.append(
                    Message(
                        content=RecordDict({"arrays": arrays, "config": config}),
                        message_type=MessageType.TRAIN,
                        dst_node_id=nodes[int(p) % len(nodes)],
                        group_id=str(t),
                    )
                )
            updates, losses = [], []
            if messages:
                timeout = runtime.round_timeout
                left = _remaining(runtime)
                if left is not None:
                    timeout = max(0.0, min(timeout, left))
                replies = send_and_receive(grid, messages, timeout=timeout)
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
            failures = len(messages) - len(updates)
            total_failures += failures
            _check_deadline(runtime, f"round {t}")
            waited = time.perf_counter()
            canary_total, num_inserted = inserted.result()
            if reported is not None:
                reported.result()  # round t-1's report (done: it ran before this round's sum)
            waited = time.perf_counter() - waited
            aggregate = aggregate_round(
                client_updates=updates,
                canary_directions=[],
                canary_sum=canary_total,
                num_summed_canaries=num_inserted,
                clip_norm=clip_norm,
                noise_multiplier=spec.noise_multiplier,
                expected_cohort_size=spec.clients_per_round,
                dim=dim,
                rng=noise_rng,
                bug=bug,
            )
            model, _ = optimizer.step(model, aggregate.update)
            participants = source.participants(t)
            metadata = RoundMetadata(
                clip_norm=clip_norm,
                cohort_size=len(updates) + num_inserted,
                num_canaries_inserted=num_inserted,
                num_failures=failures,
                clipped_fraction=aggregate.clipped_fraction,
                noise_stddev=aggregate.noise_stddev,
                train_loss=float(np.mean(losses)) if losses else None,
                participants=None if participants is None else tuple(int(j) for j in participants),
            )
            reported = audit_work.submit(
                runtime.reporter.report_round, t, aggregate.update.astype(np.float32), metadata
            )
            rounds.append({"clip_norm": clip_norm, "cohort_size": metadata.cohort_size,
                           "num_failures": failures, "audit_wait_seconds": waited})
            if adaptive is not None:
                adaptive.update(
                    num_unclipped=len(updates) - aggregate.num_clipped,
                    expected_count=max(expected_real, 1.0),
                    rng=noise_rng,
                )
            if runtime.progress is not None:
                runtime.progress(t, spec.num_rounds)
        if reported is not None:
            reported.result()
        if stopped is None and spec.stop_on_alarm and getattr(runtime.reporter, "stop_reason", None):
            stopped = (len(rounds), str(runtime.reporter.stop_reason))  # fired at the last round

    import torch


    torch.set_num_threads(1)
    net = task.build_model()
    set_model_vector(net, model)
    metrics = {k: float(v) for k, v in task.evaluate_fn(net, task.test_data()).items()}
    runtime.reporter.report_final(model, metrics)
    runtime.result = {
        "num_rounds": spec.num_rounds,
        "dim": dim,
        "num_canaries": spec.num_canaries,
        "canary_family": family.value,
        "num_seen_canaries_inserted": num_seen,
        "num_nodes": len(nodes),
        "num_failures": total_failures,
        "rounds": rounds,
        "metrics": metrics,
        "seconds": time.monotonic() - started,
        "inject_bug": bug.label if bug is not None else None,
        "rounds_trained": len(rounds),
        "stopped_at_round": None if stopped is None or stopped[0] >= spec.num_rounds else stopped[0],
        "stop_reason": None if stopped is None else stopped[1],
    }
    return runtime.result


def make_server_app(runtime: AuditRuntime) -> ServerApp:
    """A ServerApp bound to ``runtime`` (simulation: the seed stays in process memory)."""
    server_app = ServerApp()

    @server_app.main()
    def _main(grid: Grid, context: Context) -> None:
        run_audit(grid, runtime)

    return server_app


def _num_seen(run_config: dict[str, Any], spec: AuditSpec) -> int:
    """The run config's number of seen canaries, checked against ``spec.num_canaries``."""
    key = RUN_CONFIG_NUM_SEEN_CANARIES
    if key not in run_config:
        raise ValueError(f"run config '{key}' is required with '{RUN_CONFIG_INGEST_URL}' (the "
                         "flaudit service sets it for a deployment audit)")
    value = run_config[key]
    try:
        count = int(str(value).strip()) if not isinstance(value, bool) else -1
    except ValueError:
        count = -1
    if not 0 <= count <= spec.num_canaries:
        raise ValueError(f"run config '{key}' must be an integer in 0..num_canaries "
                         f"({spec.num_canaries}), got {str(value)[:40]!r}")
    return count


def runtime_from_run_config(run_config: dict[str, Any]) -> AuditRuntime:
    """Build the deployment runtime from the Flower run config (see module docstring)."""

    run_config = {k: v for k, v in run_config.items() if v != ""}  # "" = not set
    spec_json = run_config.get(RUN_CONFIG_SPEC)
    spec = AuditSpec.model_validate_json(spec_json) if spec_json else AuditSpec(
        task="synthetic",
        num_rounds=int(run_config.get("num-server-rounds", 2)),
        num_clients=10,
        clients_per_round=4,
        num_canaries=20,
    )
    seed: int | None = None
    canaries: CanarySums | None = None
    if RUN_CONFIG_INGEST_URL in run_config:
        # a deployment audit: the service keeps the seed and serves each round's canary sum
        num_seen = _num_seen(run_config, spec)
        http = HttpRoundReporter(
            str(run_config[RUN_CONFIG_INGEST_URL]),
            str(run_config[RUN_CONFIG_AUDIT_ID]),
            str(run_config[RUN_CONFIG_RUN_TOKEN]),
        )
        reporter: RoundReporter = http
        canaries = ServiceCanarySums(http, num_seen=num_seen)
    else:  # stand-alone `flwr run` demo: audit in process, nothing leaves the ServerApp
        seed = new_master_seed()
        reporter = _LazyLocal(spec, seed)
    timeout = float(run_config.get("flaudit-round-timeout", 600.0))
    return AuditRuntime(
        spec=spec,
        canary_seed=seed,
        canaries=canaries,
        reporter=reporter,
        deadline=time.monotonic() + spec.timeout_seconds,
        round_timeout=timeout,
        min_nodes=int(run_config.get("flaudit-min-nodes", 1)),
    )


class _LazyLocal:
    """Stand-alone demo reporter: a lazily created LocalRoundReporter that logs cosine means."""

    def __init__(self, spec: AuditSpec, seed: int) -> None:

        self._spec, self._seed = spec, seed
        self.inner = LocalRoundReporter.for_audit(
            canary_seed=seed, num_canaries=spec.num_canaries, canary_family=spec.canary_family
        )

    def __repr__(self) -> str:
        return "LocalRoundReporter(stand-alone)"

    def report_initial(self, initial_model: np.ndarray) -> None:
        self.inner.report_initial(initial_model)

    def report_round(self, server_round: int, update: np.ndarray, metadata: RoundMetadata) -> None:
        self.inner.report_round(server_round, update, metadata)
        logger.warning("round %d: cohort %d, clip norm %.4g", server_round, metadata.cohort_size,
                       metadata.clip_norm)

    def report_final(self, final_model: np.ndarray, metrics: dict[str, float]) -> None:
        self.inner.report_final(final_model, metrics)
        mask = seen_mask(self._seed, self._spec.num_canaries)
        final = self.inner.tracker.final_cosines
        logger.warning(
            "final model: accuracy %.3f; mean cos(c, theta_T - theta_0) seen %.4g, unseen %.4g",
            metrics.get("accuracy", math.nan), final[mask].mean(), final[~mask].mean(),
        )


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Deployment entry point (``flwr run`` against a SuperLink)."""
    run_audit(grid, runtime_from_run_config(dict(context.run_config)))
