"""Bring your own Flower app: a strategy wrapper that inserts canary clients and reports rounds.

In the spirit of Flower's ``DifferentialPrivacyServerSideFixedClipping``: wrap your (DP) strategy
and keep everything else. The two lines a Flower app adds (docs/flower.md)::

    from flaudit.server.wrapper import CanaryAuditStrategy
    strategy = CanaryAuditStrategy.from_env(strategy)   # after building your DP strategy

``from_env`` reads ``FLAUDIT_AUDIT_ID``, ``FLAUDIT_URL`` and ``FLAUDIT_RUN_TOKEN`` (printed once
by ``flaudit attach`` / ``POST /audits`` with ``"engine": "external"``; the token may instead be
in a file named by ``FLAUDIT_RUN_TOKEN_FILE``, never in the run config). The canary seed never
reaches the app: the wrapper fetches each round's canary vectors from the service, which
schedules them by the same rule as its built-in audits
(:class:`flaudit.auditor.schedules.CanarySchedule`); round ``t + 1``'s canaries are fetched and
round ``t`` reported on a background thread while round ``t + 1`` trains (``flush()``).

What the wrapper does
---------------------
* At ``start``: reads the DP claim from the wrapped strategy (noise multiplier, fixed or
  adaptive clipping, ``num_sampled_clients``), the number of SuperNodes and ``num_rounds``, and
  declares it to the service, so the analytic epsilon and every alarm use the real settings.
* Canaries take cohort slots (issue #22): for a round with ``c`` scheduled seen canaries,
  ``configure_train`` leaves ``c`` of the ``n`` sampled nodes (chosen at random) without a
  message, and ``aggregate_train`` adds ``c`` canary *replies* ``theta_{t-1} + S(t) c_j`` with
  the largest client weight seen so far and the real replies' metric keys (each value their weighted
  mean). The inner strategy clips, averages and noises exactly the ``n`` replies its noise is
  calibrated for. ``displaced[t]`` counts the real clients displaced; ``weight_factors[t]``
  (``w_max * replies / sum(w)``) says how far weighting lifts the heaviest reply above ``C/n``.
* After aggregation it reports ``Delta_t``; after ``start`` returns, the final model with the
  final round's accuracy and loss. A strategy wrapper sees only the new global model, so the
  round's vector is the delta of the aggregated model ``theta_t - theta_{t-1}``: the released
  noisy average when the inner strategy applies it directly (FedAvg, server learning rate 1),
  but a server optimizer with momentum inside the inner strategy mixes earlier rounds into it,
  which weakens the per-round statistics (the final-model statistic is unaffected). The
  service derives the round's canary participants itself (it scheduled the canaries).
* A wrapped strategy that takes the round's canary sum (``add_canary_sum(t, sum, c)``, and
  ``release`` after ``aggregate_train``: flaudit's own :class:`~flaudit.server.builtin.BuiltinDPFedAvg`,
  the built-in ServerApp's strategy) gets it before ``aggregate_train`` instead of canary
  replies: canaries take no slot (it divides by its calibration size whatever the replies), the
  ``canaries`` source is a :class:`~flaudit.server.canary_sums.CanarySums`, the claim is its
  spec (nothing declared) and the round's vector is its release ``rho_bar_t``.
* A wrapped strategy whose class overrides ``start()`` keeps running its own loop.
* ``accountant=`` strategies are audited (the sample stays ``num_sampled_clients``); the
  accountant's epsilon is logged after ``start()``.
* :class:`LegacyCanaryAuditStrategy` does the same for ``flwr.server.strategy`` strategies
  under ``LegacyContext`` + ``DefaultWorkflow``, SecAgg+ included. Both are shells over one
  core (:class:`~flaudit.server.canary_audit.CanaryAudit`: claim, theta_0, canaries, cohort
  slots, weights, the numbers of a canary reply and of the round's report, participants).

Limits
------
* Canaries per round are capped at ``num_sampled_clients`` (they take slots): about ``k/2``
  seen canaries times ``canary_repeats`` must fit ``n`` per round (the service refuses the
  claim otherwise).
* A Message-API strategy given to the legacy wrapper, or the reverse, is refused.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from ..auditor.claims.sizing import check_num_canaries
from ..auditor.validation import check_at_least
from ..protocol.vectors import unflatten
from .attach import (
    ENV_AUDIT_ID,
    ENV_RUN_TOKEN,
    ENV_RUN_TOKEN_FILE,
    ENV_URL,
    reporter_from_env,
)
from .budget import DEFAULT_ROUND_BUDGET, RoundBudget
from .canary_audit import CanaryAudit, canary_metrics, canary_models, update_norms
from .legacy import LegacyCanaryAuditStrategy
from .local import LocalCanaries
from .reporting import RoundMetadata, RoundReporter
from .strategies import (
    accountant_spent,
    current_noise_multiplier,
    final_metrics,
    overrides_start,
    read_claim,
    read_weight_key,
    record_vector,
    refuse_legacy,
)

# The names an app imports from here (docs/flower.md); the legacy wrapper, the local canaries,
# the claim reader and the attach variables live in their own modules.
__all__ = [
    "CanaryAuditStrategy",
    "LegacyCanaryAuditStrategy",
    "LocalCanaries",
    "read_claim",
    "ENV_AUDIT_ID",
    "ENV_URL",
    "ENV_RUN_TOKEN",
    "ENV_RUN_TOKEN_FILE",
]


class CanaryAuditStrategy(Strategy):
    """Wrap ``strategy``: seen canaries take cohort slots in ``aggregate_train``; every round
    is reported.

    Round ``t`` with ``c`` scheduled seen canaries: of the ``n`` training messages the wrapped
    strategy configures, ``c`` (chosen at random) are not sent, and the ``c`` canary replies take
    their places, so the wrapped strategy aggregates exactly the ``n`` replies its DP noise is
    calibrated for (Andrew et al. 2023: canary clients are part of the population and sampled
    into cohorts). Each canary reply carries the largest client weight seen so far in the run.

    Parameters
    ----------
    strategy : flwr.serverapp.strategy.Strategy
        The strategy to audit (clips, aggregates and adds noise), e.g. Flower's
        ``DifferentialPrivacyServerSideFixedClipping(FedAvg(...), ...)``. Its own methods run
        unchanged, including an overridden ``start()``.
    reporter : RoundReporter
        Where the claim, theta_0, Delta_t and theta_T go. For an external audit an
        :class:`~flaudit.server.http_reporter.HttpRoundReporter`, which also serves the round's canaries.
    canaries : object, optional
        Has ``round_canaries(server_round, dim)`` returning unit vectors ``(c, dim)`` (and
        optionally ``participants(server_round)``); default: the reporter's
        ``round_canaries(server_round)`` (the service schedules them). Required for a strategy
        that takes the round's sum: a :class:`~flaudit.server.canary_sums.CanarySums`
        (``round_sum(server_round, dim)``; :class:`~flaudit.server.local.LocalCanaries` is both).
    clip_norm : float, optional
        Clip norm for a strategy without a Flower DP wrapper (read from the wrapper otherwise).
    num_rounds : int, optional
        Rounds ``T`` when you drive the strategy yourself instead of ``start(num_rounds=...)``.
    stop_on_alarm : bool
        End training at the round where the service's DP alarm fires (the claim is refuted):
        later rounds send no messages and ``start`` reports the model of that round as the
        final one; the audit records where and why. Default False (the alarm is reported, the
        run goes on).
    num_canaries : int or "auto", optional
        Canaries for an audit created with ``num_canaries = "auto"`` (the bring-your-own
        default): a number fixes them, ``"auto"`` (or None, the default) lets the service choose
        them from the federation this strategy declares (docs/flower.md). A number other than
        the one the audit fixed is refused and the audit fails.
    round_budget_seconds : float or None
        Never stall a round: the most the audit's waits (the round's canaries, the previous
        round's report) add to one round, all together (default 5 s; ``flaudit.server.budget``).
        Past it the round trains without its canaries (a stated gap) and reports keep going in
        the background, in order. Applies while the reporter fails open
        (``on_service_error="continue"``); None waits for everything (as ``"stop"`` does). The
        claim and theta_0 are sent before round 1, outside the budget (a refused claim stops
        the run before it trains).

    Raises
    ------
    ValueError
        Naming the bad argument, or saying what to change in the wrapped strategy.
    """

    def __init__(
        self,
        strategy: Strategy,
        *,
        reporter: RoundReporter,
        canaries: Any = None,
        clip_norm: float | None = None,
        num_rounds: int | None = None,
        stop_on_alarm: bool = False,
        num_canaries: int | str | None = None,
        round_budget_seconds: float | None = DEFAULT_ROUND_BUDGET,
    ) -> None:
        refuse_legacy(strategy)
        self._num_canaries = None if num_canaries is None else check_num_canaries(num_canaries)
        # a strategy that takes the round's canary sum (flaudit's own DP-FedAvg,
        # server/builtin.py) is audited from its spec: nothing to read or declare
        self._sums_inside = callable(getattr(strategy, "add_canary_sum", None))
        if self._sums_inside and canaries is None:
            raise ValueError(
                "canaries: a strategy that takes the round's canary sum needs a "
                "canary source with round_sum(t, dim) (server/canary_sums.py)"
            )
        if not self._sums_inside:
            read_claim(strategy, num_rounds=1, num_nodes=1)
        #: the audit's state and steps, shared with the legacy wrapper
        self.audit = CanaryAudit(strategy, reporter, canaries=canaries, clip_norm=clip_norm)
        self.audit.claimed = self._sums_inside  # the spec is the claim: nothing to declare
        if num_rounds is not None:
            check_at_least(num_rounds, "num_rounds", 1)
        self.strategy = strategy
        # the wrapped strategy's own methods, bound before anything is patched: an overridden
        # start() of the wrapped strategy calls back into ours (see start())
        self._inner_configure_train = strategy.configure_train
        self._inner_aggregate_train = strategy.aggregate_train
        self.reporter = reporter
        self._canaries = canaries
        self.num_rounds = None if num_rounds is None else int(num_rounds)
        self.weight_key = read_weight_key(strategy)
        self._current: ArrayRecord | None = None
        self._template: Message | None = None
        self._in_start = False
        self._final: np.ndarray | None = None
        self._dim = 0
        #: per round: seconds the round waited for the audit (its canaries, earlier reports)
        self.audit_wait_seconds: dict[int, float] = {}
        self._round_block: dict[int, np.ndarray] = {}
        #: per round: how many of the sampled nodes the canaries displaced (not sent a message)
        self.displaced = self.audit.displaced
        #: per round: largest weight x replies / total weight (1: equal weights); above 1 the
        #: weighting gives the heaviest reply more than the C/n the noise is calibrated for
        self.weight_factors = self.audit.weight_factors
        # the audit's own network and CPU work (fetching round t+1's canaries, reporting round
        # t's release) runs in order on one thread while the clients train
        self._audit_work: ThreadPoolExecutor | None = None
        self._fetch_work: ThreadPoolExecutor | None = None  # canaries: never behind a report
        self._prefetched: dict[int, Future[np.ndarray]] = {}
        self._reports: list[Future] = []  # handed to the reporter, in order
        #: what the audit may add to one round, all its waits together (None: wait for all)
        self.round_budget = (
            None if round_budget_seconds is None else RoundBudget(round_budget_seconds)
        )
        self.stop_on_alarm = bool(stop_on_alarm)
        self.stopped_at_round: int | None = None
        self._last: np.ndarray | None = None

    @classmethod
    def from_env(
        cls,
        strategy: Strategy,
        *,
        run_config: Mapping[str, Any] | None = None,
        on_service_error: str | None = None,
        resume: bool | None = None,
        **options: Any,
    ) -> CanaryAuditStrategy:
        """Attach ``strategy`` to the audit named by ``FLAUDIT_AUDIT_ID`` and ``FLAUDIT_URL``
        (or the run-config keys ``flaudit-audit-id``, ``flaudit-ingest-url``; the environment
        wins), with the run token from ``FLAUDIT_RUN_TOKEN``, or read from the file named by
        ``FLAUDIT_RUN_TOKEN_FILE`` or the run-config key ``flaudit-run-token-file``.

        The token itself never goes in the run config: apps write their run config to disk
        (and Flower stores it with the run); ``flaudit attach --format run-config --token-file
        PATH`` writes the token to ``PATH`` (mode 0600) and prints the path.

        ``on_service_error``: ``"continue"`` (default; ``FLAUDIT_ON_SERVICE_ERROR`` or the
        run-config key ``flaudit-on-service-error``) trains on
        while the service is away (rounds buffered, rounds it could not give canaries train
        without them); ``"stop"`` stops the run with a clear error. ``resume=True``
        (``FLAUDIT_RESUME=1``): continue this audit after the same training's ServerApp crashed
        (see :class:`~flaudit.server.http_reporter.HttpRoundReporter`).

        Raises
        ------
        ValueError
            Naming the missing variable, or a run token found in the run config.
        """
        return cls(
            strategy,
            reporter=reporter_from_env(
                run_config, on_service_error=on_service_error, resume=resume
            ),
            **options,
        )

    def __repr__(self) -> str:
        return f"CanaryAuditStrategy({self.strategy!r})"

    def summary(self) -> None:
        log(
            INFO,
            "\t├──> Canary audit: canaries from %s, %s",
            type(self._canaries or self.reporter).__name__,
            "their sum added inside the strategy" if self._sums_inside else "taking cohort slots",
        )
        self.strategy.summary()

    @property
    def clip_norm(self) -> float:
        """``S(t)`` now: the wrapped DP strategy's current clipping norm (adaptive changes it)."""
        return self.audit.clip_norm

    # -- claim and run -------------------------------------------------------------------
    def declare(self, grid: Grid, num_rounds: int) -> dict[str, Any]:
        """Read the claim (strategy, SuperNodes, ``num_rounds``) and send it to the service."""
        claim = self.audit.declare(
            num_rounds=num_rounds,
            num_nodes=len(list(grid.get_node_ids())),
            stop_on_alarm=True if self.stop_on_alarm else None,
            num_canaries=self._num_canaries,
        )
        self.num_rounds = int(num_rounds)
        return claim

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        *args: Any,
        **kwargs: Any,
    ):
        """Declare the claim, report theta_0, run the wrapped strategy's loop, then report
        theta_T with the final round's accuracy and loss (from ``evaluate_fn`` or the clients'
        evaluation).

        The loop is the wrapped strategy's own ``start()`` when it overrides Flower's (an app
        that writes results or checkpoints there keeps doing so): while it runs, its
        ``configure_train`` and ``aggregate_train`` are this wrapper's, which call its own.
        """
        if not self.audit.claimed:
            self.declare(grid, num_rounds)
        self.num_rounds = int(num_rounds)
        self._report_initial(initial_arrays)
        watch = getattr(self.reporter, "watch_grid", None)  # heartbeats say the SuperLink answers
        if watch is not None:  # a round: training, then evaluation, each up to Flower's timeout
            timeout = kwargs.get("timeout", args[0] if args else 3600)
            watch(grid.get_node_ids, round_timeout=2 * float(timeout) if timeout else None)
        self._in_start = True
        own_start = overrides_start(self.strategy)
        try:
            if own_start:
                self.strategy.configure_train = self.configure_train
                self.strategy.aggregate_train = self.aggregate_train
                result = self.strategy.start(grid, initial_arrays, num_rounds, *args, **kwargs)
            else:
                result = super().start(grid, initial_arrays, num_rounds, *args, **kwargs)
        except BaseException:
            self._close_audit_work()
            raise
        finally:
            self._in_start = False
            if own_start:
                for name in ("configure_train", "aggregate_train"):
                    self.strategy.__dict__.pop(name, None)
        self.flush()
        if self._final is not None and not self.audit.final_reported:
            self.reporter.report_final(
                self._final, final_metrics(result, num_rounds, self.stopped_at_round)
            )
            self.audit.final_reported = True
        spent = accountant_spent(self.strategy)
        if spent is not None:
            log(
                INFO,
                "flaudit: Flower's accountant reports epsilon = %.4g at delta = %g after "
                "%d releases; the audit page shows dp-accounting's analytic epsilon beside the "
                "measured bounds",
                spent.epsilon,
                spent.delta,
                spent.num_releases,
            )
        self._close_audit_work()
        return result

    def _submit(self, fn, *args) -> Future:
        if self._audit_work is None:
            self._audit_work = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flaudit-audit")
        return self._audit_work.submit(fn, *args)

    def _submit_fetch(self, server_round: int, dim: int) -> Future:
        if self._fetch_work is None:
            self._fetch_work = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="flaudit-canaries"
            )
        return self._fetch_work.submit(self._fetch_round, server_round, dim)

    def _fetch_round(self, server_round: int, dim: int) -> Any:
        if self._sums_inside:  # (sum, c)
            return self._canaries.round_sum(server_round, dim)
        return self.audit.round_canaries(server_round, dim)

    def _budgeted(self) -> bool:
        return (
            self.round_budget is not None
            and getattr(self.reporter, "on_service_error", "continue") == "continue"
        )

    def flush(self) -> None:
        """Wait until every round handed to the reporter has been reported.

        Rounds are reported on a background thread while the next round's clients train; an
        error of that report is raised here, or by the next ``aggregate_train``. ``start()`` and
        the last round (``num_rounds``) flush by themselves; call it when you drive the strategy
        yourself and read the reporter in between.
        """
        reports, self._reports = self._reports, []
        for reported in reports:
            reported.result()

    def _settle(self) -> None:
        """The reports handed over so far, waited for within the round's budget (fail open):
        one still in flight past it keeps going in the background; an error of a finished one
        stops the run here. Without a budget: :meth:`flush`."""
        if not self._budgeted():
            self.flush()
            return
        if self._reports and not self._reports[-1].done():
            self.round_budget.wait(self._reports[-1], "the report of the previous round")
        pending = []
        for reported in self._reports:
            if reported.done():
                reported.result()
            else:
                pending.append(reported)
        self._reports = pending

    def _close_audit_work(self) -> None:
        if self._fetch_work is not None:  # a fetch still hanging on the service is dropped
            self._fetch_work.shutdown(wait=False, cancel_futures=True)
        if self._audit_work is not None:
            self._audit_work.shutdown(wait=True, cancel_futures=True)
        self._audit_work = self._fetch_work = None
        self._prefetched.clear()

    def _report_initial(self, arrays: ArrayRecord) -> None:
        if not self.audit.initial_reported:  # before round 1, like the claim: canaries need it
            self.audit.report_initial(record_vector(arrays))

    # -- training ------------------------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's messages, less one per canary scheduled this round."""
        if not self.audit.claimed and self.num_rounds is not None:
            self.declare(grid, self.num_rounds)
        if self.round_budget is not None:
            self.round_budget.start(server_round)
        if self._stop_requested(server_round):
            return []
        self._current = arrays
        self._report_initial(arrays)
        messages = list(self._inner_configure_train(server_round, arrays, config, grid))
        if self._sums_inside:  # canaries take no slot: the sum is fetched while clients train
            self._dim = sum(int(np.prod(a.shape)) for a in arrays.values())
            if server_round not in self._prefetched:
                self._prefetched[server_round] = self._submit_fetch(server_round, self._dim)
            return messages
        if not messages:
            return messages
        self._template = messages[0]
        dim = sum(int(np.prod(a.shape)) for a in arrays.values())
        block = self._take_canaries(server_round, dim)
        sent = self.audit.take_slots(
            server_round,
            messages,
            int(block.shape[0]),
            what="FedAvg: fraction_train x nodes, at least min_train_nodes",
        )
        self._round_block[server_round] = block
        if self.num_rounds is None or server_round < self.num_rounds:  # while the clients train
            if server_round + 1 not in self._prefetched:
                self._prefetched[server_round + 1] = self._submit_fetch(server_round + 1, dim)
        return sent

    def _take_canaries(self, server_round: int, dim: int) -> np.ndarray:
        if self._budgeted():
            return self._take_canaries_in_budget(server_round, dim)
        prefetched = self._prefetched.pop(server_round, None)
        block = prefetched.result() if prefetched is not None else None
        # an empty prefetch may be an outage that is over now (fail-open): ask again
        if block is None or block.shape[0] == 0 or block.shape[1:] != (dim,):
            block = self.audit.round_canaries(server_round, dim)
        return block

    def _take_canaries_in_budget(self, server_round: int, dim: int) -> np.ndarray:
        """The round's canaries if they arrive within the round budget; else none (a gap the
        reporter states), the fetch left to finish in the background and be dropped."""
        t = int(server_round)
        future = self._prefetched.pop(t, None) or self._submit_fetch(t, dim)
        done, block = self.round_budget.wait(future, f"the canaries of round {t}")
        missing = getattr(self.reporter, "missing_canaries", {})
        if done and block.shape[0] == 0 and t in missing:
            # the prefetch failed: the outage may be over now, ask again within the budget
            done, block = self.round_budget.wait(
                self._submit_fetch(t, dim), f"the canaries of round {t}"
            )
        if done:
            return block
        reason = (
            f"the canaries did not arrive within the round budget "
            f"({self.round_budget.seconds:g} s): the service is slow or unreachable"
        )
        give_up = getattr(self.reporter, "without_canaries", None)
        if give_up is not None:
            give_up(t, reason)
        else:
            log(WARNING, "flaudit: round %d trains without canaries: %s", t, reason)
        return np.empty((0, dim), dtype=np.float32)

    def _stop_requested(self, server_round: int) -> bool:
        """Stop on alarm: after round t's report says the claim is refuted, rounds t+1.. send
        no messages (waits for round t's report before round t+1, only with the option)."""
        if self.stopped_at_round is None and self.stop_on_alarm and self._last is not None:
            self._settle()
            reason = getattr(self.reporter, "stop_reason", None)
            if reason:
                self.stopped_at_round = server_round - 1
                self._final = self._last
                log(
                    WARNING,
                    "flaudit: %s; training stops after round %d (stop_on_alarm)",
                    reason,
                    self.stopped_at_round,
                )
        return self.stopped_at_round is not None

    def _canary_metrics(self, valid: list[Message], weight: float) -> RecordDict:
        """MetricRecords with the real replies' names and keys, valued as
        :func:`~flaudit.server.canary_audit.canary_metrics` says."""
        if not valid:  # every slot of the round went to a canary
            return {"metrics": MetricRecord({self.weight_key: weight})}
        weights = np.asarray([self._reply_weight(r) for r in valid], dtype=np.float64)
        records: dict[str, MetricRecord] = {}
        for name, first in valid[0].content.metric_records.items():
            columns = {
                key: [
                    r.content.metric_records[name][key]
                    for r in valid
                    if name in r.content.metric_records and key in r.content.metric_records[name]
                ]
                for key in first.keys()
            }
            records[name] = MetricRecord(
                canary_metrics(columns, weights, weight_key=self.weight_key, weight=weight)
            )
        if not records:
            records["metrics"] = MetricRecord({self.weight_key: weight})
        return records

    def _canary_reply(self, vector: np.ndarray, like: Message | None, metrics: dict) -> Message:
        if like is not None:
            name, record = next(iter(like.content.array_records.items()))
        else:  # no real reply this round: the layout of the arrays sent
            name, record = "arrays", self._current
        arrays_np = record.to_numpy_ndarrays()
        arrays = unflatten(
            vector, [a.shape for a in arrays_np], dtypes=[a.dtype for a in arrays_np]
        )
        content = RecordDict(
            {
                name: ArrayRecord({k: Array(np.asarray(a)) for k, a in zip(record.keys(), arrays)}),
                **metrics,
            }
        )
        return Message(content=content, reply_to=self._template)

    def _reply_weight(self, reply: Message) -> float:
        for metrics in reply.content.metric_records.values():
            if self.weight_key in metrics:
                return float(metrics[self.weight_key])
        return 1.0

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Add the round's canary replies (at the largest weight seen so far) and aggregate."""
        if self.stopped_at_round is not None:
            return None, None  # stopped on alarm: nothing trained, the model stays
        if self._sums_inside:
            return self._aggregate_sums(server_round, replies)
        replies = list(replies)
        valid = [r for r in replies if not r.has_error() and r.content.array_records]
        current = record_vector(self._current) if self._current is not None else None
        inserted = 0
        clip_norm = self.clip_norm
        weight_factor = None
        block = self._round_block.pop(server_round, None)
        norms = (
            update_norms(
                current,
                (record_vector(next(iter(r.content.array_records.values()))) for r in valid),
            )
            if current is not None
            else None
        )
        if current is not None and self._template is not None and block is not None:
            weights = [self._reply_weight(reply) for reply in valid]
            weight, weight_factor = self.audit.canary_weight(
                server_round, weights, len(block), key=self.weight_key
            )
            metrics = self._canary_metrics(valid, weight)
            like = valid[0] if valid else None
            for model in canary_models(current, block, clip_norm):
                replies.append(self._canary_reply(model, like, metrics))
                inserted += 1
        elif current is not None and not valid:
            log(WARNING, "flaudit: round %s has no valid reply; no canary inserted", server_round)
        self._prefetched.pop(server_round, None)  # not used: dropped
        arrays, metrics_out = self._inner_aggregate_train(server_round, replies)
        noise_clip_norm = self.clip_norm  # adaptive clipping: the norm Flower noised for
        if arrays is not None and current is not None:
            new = record_vector(arrays)
            self._last = new
            self._settle()  # round t-1's, in order (within the round budget); its error stops
            # the run here
            metadata = self.audit.round_metadata(
                server_round,
                norms=norms,
                inserted=inserted,
                num_failures=len(replies) - inserted - len(valid),
                clip_norm=clip_norm,
                metrics=metrics_out,
                weight_factor=weight_factor,
                noise_clip_norm=noise_clip_norm,
            )
            self.audit.calibration.record(
                server_round, clip_norm, noise_clip_norm, current_noise_multiplier(self.strategy)
            )
            self._report(server_round, new, new - current, metadata)
        return arrays, metrics_out

    def _report(
        self, server_round: int, new: np.ndarray, update: np.ndarray, metadata: RoundMetadata
    ) -> None:
        """Hand round ``t``'s release to the reporter (in order, on the audit thread); after
        the last round, the final model too when no ``start()`` of ours will."""
        self._reports.append(
            self._submit(self.reporter.report_round, server_round, update, metadata)
        )
        if server_round == self.num_rounds:
            self._final = new
            if not self._in_start and not self.audit.final_reported:
                self.flush()
                self.reporter.report_final(new, {})
                self.audit.final_reported = True
                self._close_audit_work()

    def _aggregate_sums(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """A strategy that takes the canary sum: hand it round ``t``'s (uncapped: they take no
        slot), let it aggregate, report its release ``rho_bar_t``."""
        t = int(server_round)
        waited = time.perf_counter()
        total, count = self._take_sum(t)
        self._settle()  # round t-1's report, in order; its error stops the run here
        self.audit_wait_seconds[t] = time.perf_counter() - waited
        self.strategy.add_canary_sum(t, total, count)
        arrays, metrics_out = self._inner_aggregate_train(t, replies)
        release = self.strategy.release
        if arrays is None or release is None:
            return arrays, metrics_out
        new = record_vector(arrays)
        self._last = new
        metadata = RoundMetadata(
            clip_norm=release.clip_norm,
            cohort_size=release.num_clients + count,
            num_canaries_inserted=count,
            num_failures=release.num_failures,
            clipped_fraction=release.clipped_fraction,
            noise_stddev=release.noise_stddev,
            train_loss=release.train_loss,
            participants=self.audit.participants(t),
        )
        self._report(t, new, release.update, metadata)
        return arrays, metrics_out

    def _take_sum(self, server_round: int) -> tuple[np.ndarray | None, int]:
        """Round ``t``'s ``(sum, c)``, fetched while its clients trained; within the round
        budget if there is one (past it the round trains without canaries, a stated gap)."""
        t = int(server_round)
        future = self._prefetched.pop(t, None) or self._submit_fetch(t, self._dim)
        if not self._budgeted():
            return future.result()
        done, value = self.round_budget.wait(future, f"the canaries of round {t}")
        if done:
            return value
        give_up = getattr(self.reporter, "without_canaries", None)
        if give_up is not None:
            give_up(
                t,
                f"the canaries did not arrive within the round budget "
                f"({self.round_budget.seconds:g} s)",
            )
        return None, 0

    # -- evaluation: unchanged -----------------------------------------------------------
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if self.stopped_at_round is not None:
            return []
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)

    def __getattr__(self, name: str) -> Any:
        # the wrapped strategy's own attributes (an app's start() or callbacks read them)
        if name.startswith("_") or name == "strategy":
            raise AttributeError(name)
        return getattr(self.__dict__["strategy"], name)
