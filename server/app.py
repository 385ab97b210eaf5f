"""Flower ServerApp (Message API): DP-FedAvg with random canary clients.

The ServerApp is a Flower app like the ones users bring (issue #29): :func:`run_audit` builds
the task's initial model ``theta_0``, then runs flaudit's own DP strategy
(:class:`~flaudit.server.builtin.BuiltinDPFedAvg`: participation schedule, clipping, noise,
server optimizer, adaptive clipping, injected bugs) inside
:class:`~flaudit.server.wrapper.CanaryAuditStrategy`, the one place a canary enters a round,
with Flower's ``Strategy.start``:

1. the wrapper reports ``theta_0``; the strategy waits for the SuperNodes and maps their
   (random) node ids to stable partition ids (partition ``p`` on node ``p mod #nodes``);
2. per round the strategy sends the global model to the scheduled real clients (those that fail
   or time out are dropped and counted); while they train the wrapper gets the round's canary
   sum and hands it to the strategy, which adds ``S(t)`` times it to the clipped sum, noises
   it and steps; the wrapper reports the released noisy aggregate ``rho_bar_t = (rho + noise)
   / m`` (not ``theta_t - theta_{t-1}``, which mixes rounds under server momentum) with its
   metadata and the round's canary participants through the
   :class:`~flaudit.server.reporting.RoundReporter`, on a background thread;
3. ``theta_T`` is evaluated on the task's test set and reported with the accuracy.

Canaries live only on the server: no client ever receives one. Round ``t``'s canary sum and
participants come from a :class:`~flaudit.server.canary_sums.CanarySums`: made from the seed in
this process (simulation, stand-alone demo) or fetched from the audit service (deployment).

Two entry points: :func:`make_server_app` (simulation: spec, secret seed and reporter are handed
over in memory) and the module-level ``app`` (deployment: read from the run config keys
``flaudit-spec`` (JSON), ``flaudit-num-seen-canaries``, ``flaudit-audit-id``,
``flaudit-ingest-url``, ``flaudit-run-token``; ``flaudit-min-nodes``, ``flaudit-round-timeout``
optional). The run config holds no seed (issue #29): whoever reads the SuperLink's run state
learns how many canaries are seen, not which; the service serves each round's canary sum
(``GET /audits/{id}/rounds/{t}/canary-sum``) and derives the round's participants itself.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord
from flwr.serverapp import Grid, ServerApp

from ..auditor.canaries import new_master_seed, resolve_canary_family, seen_mask
from ..auditor.spec import AuditSpec
from ..clients.tasks import load_task, set_model_vector
from ..protocol.vectors import flatten
from ..protocol.wire import (
    RUN_CONFIG_AUDIT_ID,
    RUN_CONFIG_INGEST_URL,
    RUN_CONFIG_NUM_SEEN_CANARIES,
    RUN_CONFIG_RUN_TOKEN,
    RUN_CONFIG_SPEC,
)
from .builtin import BuiltinDPFedAvg
from .canary_sums import CanarySums, ServiceCanarySums
from .http_reporter import HttpRoundReporter
from .local import LocalCanaries
from .reporting import LocalRoundReporter, RoundMetadata, RoundReporter
from .wrapper import CanaryAuditStrategy

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
        in this process (:meth:`~flaudit.server.local.LocalCanaries.for_audit`).
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
            self.canaries = LocalCanaries.for_audit(self.canary_seed, self.spec)


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


class _RoundGrid:
    """The Grid as Flower's ``Strategy.start`` sees it in an audit: replies pulled every
    :data:`REPLY_POLL_SECONDS`, each round's wait at most ``round_timeout`` and never past the
    audit's deadline, a round with nothing to send answered at once."""

    def __init__(self, grid: Grid, runtime: AuditRuntime) -> None:
        self._grid, self._runtime = grid, runtime

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        messages = list(messages)
        if not messages:
            return []
        wait = self._runtime.round_timeout
        if self._runtime.deadline is not None:
            wait = max(0.0, min(wait, self._runtime.deadline - time.monotonic()))
        return send_and_receive(self._grid, messages, timeout=wait)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)


def run_audit(grid: Grid, runtime: AuditRuntime) -> dict[str, Any]:
    """Run one audited DP-FedAvg training; return a summary (no seed, no canary identities).

    The ServerApp is a Flower app like a user's: :class:`~flaudit.server.builtin.BuiltinDPFedAvg`
    inside :class:`~flaudit.server.wrapper.CanaryAuditStrategy` (the one place a canary enters
    a round), run by Flower's ``Strategy.start``.
    """
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
    # as BuiltinDPFedAvg divides by the calibration size m whatever the replies, so canaries
    # beyond m do not dilute the mechanism): from the seed here, or from the service (deployment)
    source: CanarySums = runtime.canaries
    bug = spec.inject_bug
    if bug is not None:
        logger.warning(
            "bug injected: %s (testing only; the claim does not know about it)", bug.label
        )
    dp = BuiltinDPFedAvg(
        spec,
        num_seen_canaries=int(source.num_seen),
        deadline=runtime.deadline,
        min_nodes=runtime.min_nodes,
        noise_seed=runtime.noise_seed,
        progress=runtime.progress,
    )
    # the audit's own work (the round's canary sum, reporting the previous round) runs on
    # background threads while the clients train; no round budget: the built-in run waits for it
    strategy = CanaryAuditStrategy(
        dp,
        reporter=runtime.reporter,
        canaries=source,
        num_rounds=spec.num_rounds,
        stop_on_alarm=spec.stop_on_alarm,
        round_budget_seconds=None,
    )
    metrics: dict[str, float] = {}

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round != spec.num_rounds:  # the final model only (kept after a stop)
            return None
        net = task.build_model()
        set_model_vector(net, flatten(arrays.to_numpy_ndarrays()))
        metrics.update({k: float(v) for k, v in task.evaluate_fn(net, task.test_data()).items()})
        return MetricRecord(metrics)

    torch.set_num_threads(1)
    strategy.start(
        _RoundGrid(grid, runtime), ArrayRecord([model]), spec.num_rounds, evaluate_fn=evaluate
    )
    rounds = [
        {**dp.round_stats[t], "audit_wait_seconds": strategy.audit_wait_seconds[t]}
        for t in sorted(dp.round_stats)
    ]
    stopped = strategy.stopped_at_round
    reason = getattr(runtime.reporter, "stop_reason", None) if spec.stop_on_alarm else None
    runtime.result = {
        "num_rounds": spec.num_rounds,
        "dim": dim,
        "num_canaries": spec.num_canaries,
        "canary_family": family.value,
        "num_seen_canaries_inserted": int(source.num_seen),
        "num_nodes": len(dp.nodes or []),
        "num_failures": sum(r["num_failures"] for r in rounds),
        "rounds": rounds,
        "metrics": metrics,
        "seconds": time.monotonic() - started,
        "inject_bug": bug.label if bug is not None else None,
        "rounds_trained": len(rounds),
        "stopped_at_round": stopped,
        "stop_reason": str(reason) if reason else None,
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
        raise ValueError(
            f"run config '{key}' is required with '{RUN_CONFIG_INGEST_URL}' (the "
            "flaudit service sets it for a deployment audit)"
        )
    value = run_config[key]
    try:
        count = int(str(value).strip()) if not isinstance(value, bool) else -1
    except ValueError:
        count = -1
    if not 0 <= count <= spec.num_canaries:
        raise ValueError(
            f"run config '{key}' must be an integer in 0..num_canaries "
            f"({spec.num_canaries}), got {str(value)[:40]!r}"
        )
    return count


def runtime_from_run_config(run_config: dict[str, Any]) -> AuditRuntime:
    """Build the deployment runtime from the Flower run config (see module docstring)."""

    run_config = {k: v for k, v in run_config.items() if v != ""}  # "" = not set
    spec_json = run_config.get(RUN_CONFIG_SPEC)
    spec = (
        AuditSpec.model_validate_json(spec_json)
        if spec_json
        else AuditSpec(
            task="synthetic",
            num_rounds=int(run_config.get("num-server-rounds", 2)),
            num_clients=10,
            clients_per_round=4,
            num_canaries=20,
        )
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
        logger.warning(
            "round %d: cohort %d, clip norm %.4g",
            server_round,
            metadata.cohort_size,
            metadata.clip_norm,
        )

    def report_final(self, final_model: np.ndarray, metrics: dict[str, float]) -> None:
        self.inner.report_final(final_model, metrics)
        mask = seen_mask(self._seed, self._spec.num_canaries)
        final = self.inner.tracker.final_cosines
        logger.warning(
            "final model: accuracy %.3f; mean cos(c, theta_T - theta_0) seen %.4g, unseen %.4g",
            metrics.get("accuracy", math.nan),
            final[mask].mean(),
            final[~mask].mean(),
        )


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Deployment entry point (``flwr run`` against a SuperLink)."""
    run_audit(grid, runtime_from_run_config(dict(context.run_config)))
