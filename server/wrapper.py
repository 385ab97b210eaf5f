"""Bring your own Flower app: a strategy wrapper that inserts canary clients and reports rounds.

In the spirit of Flower's ``DifferentialPrivacyServerSideFixedClipping``: wrap your (DP) strategy
and keep everything else. The two lines a Flower app adds (docs/flower.md)::

    from flaudit.server.wrapper import CanaryAuditStrategy
    strategy = CanaryAuditStrategy.from_env(strategy)   # after building your DP strategy

``from_env`` reads ``FLAUDIT_AUDIT_ID``, ``FLAUDIT_URL`` and ``FLAUDIT_RUN_TOKEN`` (printed once
by ``flaudit attach`` / ``POST /audits`` with ``"engine": "external"``). The canary seed never
reaches the app: while round ``t``'s clients train, the wrapper fetches that round's canary
vectors from the service, which schedules them by the same rule as its built-in audits; it
reports round ``t`` on the same background thread while round ``t + 1`` trains (``flush()``).

What the wrapper does
---------------------
* At ``start``: reads the DP claim from the wrapped strategy (noise multiplier, fixed or
  adaptive clipping, ``num_sampled_clients``), the number of SuperNodes and ``num_rounds``, and
  declares it to the service, so the analytic epsilon and every alarm use the real settings.
* Each scheduled seen canary ``c_j`` becomes one extra *reply* in ``aggregate_train``: a model
  ``theta_{t-1} + S(t) c_j`` with the same weight and the same metric keys as the real replies
  (each value the weighted mean of the real replies', so weighted metric averages are
  unchanged), so the inner strategy clips, averages and noises it exactly like a client.
* After aggregation it reports ``Delta_t``; after ``start`` returns, the final model with the
  final round's accuracy and loss. A strategy wrapper sees only the new global model, so the
  round's vector is the delta of the aggregated model ``theta_t - theta_{t-1}``: the released
  noisy average when the inner strategy applies it directly (FedAvg, server learning rate 1),
  but a server optimizer with momentum inside the inner strategy mixes earlier rounds into it,
  which weakens the per-round statistics (the final-model statistic is unaffected). The
  service derives the round's canary participants itself (it scheduled the canaries).

Limits (each refused up front with what to change)
--------------------------------------------------
* Legacy ``flwr.server.strategy`` strategies: use the Message-API class of the same name in
  ``flwr.serverapp.strategy``.
* Flower's accounted DP (``accountant=...``) checks the reply count against
  ``num_sampled_clients``; canaries change it every round. Drop ``accountant=``: the service
  computes the analytic epsilon (dp-accounting, RDP and PLD) for the same settings.
* DP-FedAvg needs uniform client weights: replies of one round with different
  ``weighted_by_key`` values are refused.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.supercore.differential_privacy import KEY_NORM_BIT
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from flaudit.auditor.canaries import Canaries, CanaryFamily, resolve_canary_family, seen_mask
from flaudit.auditor.service.external import RUN_CONFIG_KEYS
from flaudit.auditor.validation import check_at_least, check_positive
from flaudit.server.reporting import RoundMetadata, RoundReporter
from flaudit.server.schedules import canary_schedule
from flaudit.server.vectors import flatten, unflatten

__all__ = ["CanaryAuditStrategy", "LocalCanaries", "read_claim", "ENV_AUDIT_ID", "ENV_URL",
           "ENV_RUN_TOKEN"]

ENV_AUDIT_ID = "FLAUDIT_AUDIT_ID"
ENV_URL = "FLAUDIT_URL"
ENV_RUN_TOKEN = "FLAUDIT_RUN_TOKEN"


def _record_vector(record: ArrayRecord) -> np.ndarray:
    return flatten(record.to_numpy_ndarrays())


# -- the claim, read from Flower's strategies ----------------------------------------------------
def _chain(strategy: Any) -> list[Any]:
    """The strategy and every strategy it wraps (``.strategy``), outermost first."""
    chain = [strategy]
    while True:
        inner = getattr(chain[-1], "strategy", None)
        if inner is None or any(inner is s for s in chain):
            return chain
        chain.append(inner)


def _refuse_legacy(strategy: Any) -> None:
    for item in _chain(strategy):
        module = type(item).__module__
        if module.startswith("flwr.server.strategy"):
            name = type(item).__name__
            raise ValueError(
                f"strategy: {name} is a legacy flwr.server.strategy strategy (ServerApp with "
                f"ServerConfig); CanaryAuditStrategy wraps Message-API strategies: use "
                f"flwr.serverapp.strategy.{name} and start it with strategy.start(grid=..., "
                "initial_arrays=..., num_rounds=...)"
            )
    if not isinstance(strategy, Strategy):
        raise ValueError(
            f"strategy must be a flwr.serverapp.strategy.Strategy, got {type(strategy).__name__}"
        )


def read_claim(strategy: Strategy, *, num_rounds: int, num_nodes: int) -> dict[str, Any]:
    """The DP claim of a Flower strategy chain, as ``flaudit.auditor.spec.AuditClaim`` fields.

    Reads Flower's Message-API DP wrappers (server- or client-side, fixed or adaptive clipping):
    ``noise_multiplier``, ``clipping_norm`` (or the adaptive parameters) and
    ``num_sampled_clients``. Without a DP wrapper the claim is "no noise" and the clip norm must
    be given (``clip_norm=`` of :class:`CanaryAuditStrategy`).

    Raises
    ------
    ValueError
        For a legacy strategy, an accountant-enabled DP strategy, or no clipping norm, saying
        what to change.
    """
    from flwr.serverapp.strategy import (
        DifferentialPrivacyClientSideAdaptiveClipping,
        DifferentialPrivacyClientSideFixedClipping,
        DifferentialPrivacyServerSideAdaptiveClipping,
        DifferentialPrivacyServerSideFixedClipping,
    )

    _refuse_legacy(strategy)
    fixed = (DifferentialPrivacyServerSideFixedClipping, DifferentialPrivacyClientSideFixedClipping)
    adaptive = (
        DifferentialPrivacyServerSideAdaptiveClipping,
        DifferentialPrivacyClientSideAdaptiveClipping,
    )
    claim: dict[str, Any] = {"num_rounds": int(num_rounds), "participation": "uniform"}
    chain = _chain(strategy)
    dp = next((s for s in chain if isinstance(s, fixed + adaptive)), None)
    base = chain[-1]
    nodes = max(int(num_nodes), int(getattr(base, "min_available_nodes", 1) or 1))
    claim["num_clients"] = nodes
    claim["strategy"] = " > ".join(type(s).__name__ for s in chain)[:200]
    if dp is None:
        fraction = float(getattr(base, "fraction_train", 1.0))
        claim["clients_per_round"] = max(
            1, int(getattr(base, "min_train_nodes", 1)), int(fraction * nodes)
        )
        claim["noise_multiplier"] = 0.0
        return claim
    if getattr(dp, "accountant", None) is not None:
        raise ValueError(
            f"strategy: {type(dp).__name__}(accountant=...) checks every round's reply count "
            "against num_sampled_clients, and the canaries change it each round; remove "
            "accountant= (the audit reports the analytic epsilon from dp-accounting, RDP and "
            "PLD, for the same noise multiplier, sampling and rounds)"
        )
    claim["clients_per_round"] = int(dp.num_sampled_clients)
    claim["noise_multiplier"] = float(dp.noise_multiplier)
    if isinstance(dp, fixed):
        claim["clip_norm"] = float(dp.clipping_norm)
    else:
        claim["adaptive_clipping"] = {
            "initial_clip_norm": float(dp.clipping_norm),
            "target_quantile": float(dp.target_clipped_quantile),
            "learning_rate": float(dp.clip_norm_lr),
            "clipped_count_stddev": float(dp.clipped_count_stddev) or None,
        }
    return claim


def _current_clip_norm(strategy: Strategy) -> float | None:
    for item in _chain(strategy):
        norm = getattr(item, "clipping_norm", None)
        if norm is not None:
            return float(norm)
    return None


def _weight_key(strategy: Strategy) -> str:
    return str(getattr(_chain(strategy)[-1], "weighted_by_key", "num-examples"))


# -- canaries --------------------------------------------------------------------------------
class LocalCanaries:
    """Canaries generated in this process from a seed (tests, ``flaudit run``-style local use).

    The same rule as the service's external audits (:func:`flaudit.auditor.service.external.round_canaries`):
    the seen set from the seed, ``canary_repeats`` rounds per seen canary from ``data_seed``,
    the family from ``canary_family`` by :func:`flaudit.auditor.canaries.resolve_canary_family` once the
    model size is known (``None``: orthogonal where ``num_canaries <= d``). The seed never
    appears in ``repr``.
    """

    def __init__(self, canary_seed: int, *, num_canaries: int, num_rounds: int,
                 canary_repeats: int = 1, data_seed: int = 0,
                 canary_family: CanaryFamily | str | None = None) -> None:
        check_at_least(num_canaries, "num_canaries", 2)
        check_at_least(num_rounds, "num_rounds", 1)
        if not 1 <= canary_repeats <= num_rounds:
            raise ValueError(f"canary_repeats must be in [1, num_rounds], got {canary_repeats}")
        self._seed = int(canary_seed)
        self.num_canaries = int(num_canaries)
        self.canary_family = None if canary_family is None else CanaryFamily(canary_family)
        seen = np.flatnonzero(seen_mask(self._seed, int(num_canaries)))
        positions = canary_schedule(int(seen.size), num_rounds=int(num_rounds),
                                    canary_repeats=int(canary_repeats), seed=int(data_seed))
        self.by_round = {t + 1: np.sort(seen[p]) for t, p in enumerate(positions)}
        self._canaries: Canaries | None = None

    def __repr__(self) -> str:
        return f"LocalCanaries(num_rounds={len(self.by_round)})"

    def round_canaries(self, server_round: int, dim: int) -> np.ndarray:
        if self._canaries is None or self._canaries.dim != int(dim):  # derived once per run
            family = resolve_canary_family(
                self.canary_family, num_canaries=self.num_canaries, dim=int(dim)
            )
            self._canaries = Canaries(self._seed, int(dim), family=family)
        scheduled = self.by_round.get(server_round, np.empty(0, int))
        return self._canaries.vectors(scheduled)


def _mean_value(values: list[Any], weights: np.ndarray) -> Any:
    """The weighted mean of one metric over the real replies, in the metric's own type."""
    if isinstance(values[0], (list, tuple)):
        array = np.average(np.asarray(values, dtype=np.float64), axis=0, weights=weights)
        return [int(round(v)) for v in array] if isinstance(values[0][0], int) else array.tolist()
    mean = float(np.average(np.asarray(values, dtype=np.float64), weights=weights))
    if isinstance(values[0], bool):
        return mean >= 0.5
    return int(round(mean)) if isinstance(values[0], int) else mean


class CanaryAuditStrategy(Strategy):
    """Wrap ``strategy``: insert seen canaries into ``aggregate_train`` and report every round.

    Parameters
    ----------
    strategy : flwr.serverapp.strategy.Strategy
        The strategy to audit (clips, aggregates and adds noise), e.g. Flower's
        ``DifferentialPrivacyServerSideFixedClipping(FedAvg(...), ...)``.
    reporter : RoundReporter
        Where the claim, theta_0, Delta_t and theta_T go. For an external audit an
        :class:`~flaudit.server.reporting.HttpRoundReporter`, which also serves the round's canaries.
    canaries : object, optional
        Has ``round_canaries(server_round, dim)`` returning unit vectors ``(c, dim)``; default:
        the reporter's ``round_canaries(server_round)`` (the service schedules them).
    clip_norm : float, optional
        Clip norm for a strategy without a Flower DP wrapper (read from the wrapper otherwise).
    num_rounds : int, optional
        Rounds ``T`` when you drive the strategy yourself instead of ``start(num_rounds=...)``.

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
    ) -> None:
        _refuse_legacy(strategy)
        read_claim(strategy, num_rounds=1, num_nodes=1)  # refuses accountants before any run
        if clip_norm is not None:
            check_positive(clip_norm, "clip_norm")
        if clip_norm is None and _current_clip_norm(strategy) is None:
            raise ValueError(
                "clip_norm: the wrapped strategy has no Flower DP wrapper to read the clipping "
                "norm from; wrap it in DifferentialPrivacyServerSideFixedClipping (or another "
                "flwr.serverapp.strategy DP wrapper), or pass clip_norm= for your own clipping"
            )
        if num_rounds is not None:
            check_at_least(num_rounds, "num_rounds", 1)
        self.strategy = strategy
        self.reporter = reporter
        self._canaries = canaries
        self._clip_norm = None if clip_norm is None else float(clip_norm)
        self.num_rounds = None if num_rounds is None else int(num_rounds)
        self.weight_key = _weight_key(strategy)
        self._current: ArrayRecord | None = None
        self._template: Message | None = None
        self._initial_reported = False
        self._final_reported = False
        self._in_start = False
        self._final: np.ndarray | None = None
        self._claimed = False
        # the audit's own network and CPU work (fetching round t's canaries, reporting round
        # t's release) runs in order on one thread while the clients train
        self._audit_work: ThreadPoolExecutor | None = None
        self._prefetched: dict[int, Future[np.ndarray]] = {}
        self._reported: Future[None] | None = None

    @classmethod
    def from_env(
        cls, strategy: Strategy, *, run_config: Mapping[str, Any] | None = None, **options: Any
    ) -> "CanaryAuditStrategy":
        """Attach ``strategy`` to the audit named by ``FLAUDIT_AUDIT_ID``, ``FLAUDIT_URL`` and
        ``FLAUDIT_RUN_TOKEN`` (or the run-config keys ``flaudit-audit-id``, ``flaudit-ingest-url``,
        ``flaudit-run-token``; the environment wins).

        Raises
        ------
        ValueError
            Naming the missing variable.
        """
        from flaudit.server.reporting import HttpRoundReporter

        values = {}
        for env, key in RUN_CONFIG_KEYS.items():
            value = os.environ.get(env) or str((run_config or {}).get(key, "") or "")
            if not value:
                raise ValueError(
                    f"{env} is not set (nor the run-config key {key!r}): print the lines with "
                    "`flaudit attach` (or POST /audits with \"engine\": \"external\") and export "
                    "them where the ServerApp runs (the SuperLink's environment)"
                )
            values[env] = value
        reporter = HttpRoundReporter(values[ENV_URL], values[ENV_AUDIT_ID], values[ENV_RUN_TOKEN])
        return cls(strategy, reporter=reporter, **options)

    def __repr__(self) -> str:
        return f"CanaryAuditStrategy({self.strategy!r})"

    def summary(self) -> None:
        log(INFO, "\t├──> Canary audit: canaries from %s", type(self._canaries or self.reporter).__name__)
        self.strategy.summary()

    @property
    def clip_norm(self) -> float:
        """``S(t)`` now: the wrapped DP strategy's current clipping norm (adaptive changes it)."""
        norm = _current_clip_norm(self.strategy)
        return float(norm if norm is not None else self._clip_norm)

    # -- claim and run -------------------------------------------------------------------
    def declare(self, grid: Grid, num_rounds: int) -> dict[str, Any]:
        """Read the claim (strategy, SuperNodes, ``num_rounds``) and send it to the service."""
        claim = read_claim(self.strategy, num_rounds=num_rounds,
                           num_nodes=len(list(grid.get_node_ids())))
        if "clip_norm" not in claim and "adaptive_clipping" not in claim:
            claim["clip_norm"] = self._clip_norm
        declare = getattr(self.reporter, "declare_claim", None)
        if declare is not None:
            declare(claim)
        self.num_rounds = int(num_rounds)
        self._claimed = True
        log(INFO, "flaudit: claim declared: noise multiplier %s, %s, %d of %d nodes per round, "
            "%d rounds", claim["noise_multiplier"],
            f"clip norm {claim['clip_norm']}" if "clip_norm" in claim else "adaptive clipping",
            claim["clients_per_round"], claim["num_clients"], num_rounds)
        return claim

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, *args: Any,
              **kwargs: Any):
        """Declare the claim, report theta_0, run Flower's loop, then report theta_T with the
        final round's accuracy and loss (from ``evaluate_fn`` or the clients' evaluation)."""
        self.declare(grid, num_rounds)
        self._report_initial(initial_arrays)
        self._in_start = True
        try:
            result = super().start(grid, initial_arrays, num_rounds, *args, **kwargs)
        finally:
            self._in_start = False
        self.flush()
        if self._final is not None and not self._final_reported:
            self.reporter.report_final(self._final, _final_metrics(result, num_rounds))
            self._final_reported = True
        self._close_audit_work()
        return result

    def _submit(self, fn, *args) -> Future:
        if self._audit_work is None:
            self._audit_work = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flaudit-audit")
        return self._audit_work.submit(fn, *args)

    def flush(self) -> None:
        """Wait until every round handed to the reporter has been reported.

        Rounds are reported on a background thread while the next round's clients train; an
        error of that report is raised here, or by the next ``aggregate_train``. ``start()`` and
        the last round (``num_rounds``) flush by themselves; call it when you drive the strategy
        yourself and read the reporter in between.
        """
        reported, self._reported = self._reported, None
        if reported is not None:
            reported.result()

    def _close_audit_work(self) -> None:
        if self._audit_work is not None:
            self._audit_work.shutdown(wait=True, cancel_futures=True)
            self._audit_work = None
        self._prefetched.clear()

    def _report_initial(self, arrays: ArrayRecord) -> None:
        if not self._initial_reported:
            self.reporter.report_initial(_record_vector(arrays))
            self._initial_reported = True

    # -- training ------------------------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if not self._claimed and self.num_rounds is not None:
            self.declare(grid, self.num_rounds)
        self._current = arrays
        self._report_initial(arrays)
        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        self._template = messages[0] if messages else None
        if messages and server_round not in self._prefetched:  # fetched while the clients train
            dim = sum(int(np.prod(a.shape)) for a in arrays.values())
            self._prefetched[server_round] = self._submit(self._round_canaries, server_round, dim)
        return messages

    def _round_canaries(self, server_round: int, dim: int) -> np.ndarray:
        """The round's ``c`` canary replies per unit of clip norm, ``(c, dim)``.

        From the service: ``sum / c`` for each of the ``c`` replies (a read-only broadcast view:
        ``4 d`` bytes fetched and held whatever ``c``); each has norm ``<= 1``, so the wrapped
        strategy's clipping at ``clip_norm`` leaves ``clip_norm * sum / c`` unchanged and the
        ``c`` replies add up to ``clip_norm`` times the canaries' sum, exactly what ``c``
        full-norm canary replies add (docs/estimators.md, "Canary replies from the round's sum").
        From a local ``canaries`` object: its unit vectors, renormalised in float64.
        """
        if self._canaries is None and hasattr(self.reporter, "round_canary_sum"):
            total, count = self.reporter.round_canary_sum(server_round)
            share = np.asarray(total, dtype=np.float32).reshape(dim) / np.float32(max(count, 1))
            return np.broadcast_to(share, (count, dim))
        if self._canaries is not None:
            block = self._canaries.round_canaries(server_round, dim)
        else:
            block = self.reporter.round_canaries(server_round)
        block = np.asarray(block, dtype=np.float64).reshape(-1, dim)
        return block / np.linalg.norm(block, axis=1, keepdims=True)

    def _canary_metrics(self, valid: list[Message], weight: float) -> RecordDict:
        """MetricRecords with the real replies' names and keys; each value the weighted mean."""
        weights = np.asarray([self._reply_weight(r) for r in valid], dtype=np.float64)
        records: dict[str, MetricRecord] = {}
        for name, first in valid[0].content.metric_records.items():
            values: dict[str, Any] = {}
            for key in first.keys():
                if key == self.weight_key:
                    values[key] = type(first[key])(weight)
                    continue
                if key == KEY_NORM_BIT:  # adaptiveclipping_mod's bit: a canary has norm S(t),
                    values[key] = type(first[key])(0)  # so it is not clipped
                    continue
                column = [r.content.metric_records[name][key] for r in valid
                          if name in r.content.metric_records
                          and key in r.content.metric_records[name]]
                if len(column) == len(valid):
                    values[key] = _mean_value(column, weights)
            records[name] = MetricRecord(values)
        if not records:
            records["metrics"] = MetricRecord({self.weight_key: weight})
        return records

    def _canary_reply(self, vector: np.ndarray, like: Message, metrics: dict) -> Message:
        name, record = next(iter(like.content.array_records.items()))
        arrays_np = record.to_numpy_ndarrays()
        arrays = unflatten(vector, [a.shape for a in arrays_np], dtypes=[a.dtype for a in arrays_np])
        content = RecordDict({
            name: ArrayRecord({k: Array(np.asarray(a)) for k, a in zip(record.keys(), arrays)}),
            **metrics,
        })
        return Message(content=content, reply_to=self._template)

    def _reply_weight(self, reply: Message) -> float:
        for metrics in reply.content.metric_records.values():
            if self.weight_key in metrics:
                return float(metrics[self.weight_key])
        return 1.0

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        valid = [r for r in replies if not r.has_error() and r.content.array_records]
        current = _record_vector(self._current) if self._current is not None else None
        inserted = 0
        num_clipped = 0
        clip_norm = self.clip_norm
        if current is not None and valid and self._template is not None:
            for reply in valid:
                update = _record_vector(next(iter(reply.content.array_records.values()))) - current
                num_clipped += int(np.linalg.norm(update.astype(np.float64)) > clip_norm)
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
            metrics = self._canary_metrics(valid, weight)
            prefetched = self._prefetched.pop(server_round, None)
            block = (prefetched.result() if prefetched is not None
                     else self._round_canaries(server_round, current.size))
            for direction in block:  # per unit of clip norm (see _round_canaries)
                model = (current + clip_norm * direction).astype(np.float32)
                replies.append(self._canary_reply(model, valid[0], metrics))
                inserted += 1
        elif current is not None and not valid:
            log(WARNING, "flaudit: round %s has no valid reply; no canary inserted", server_round)
        self._prefetched.pop(server_round, None)  # not used (no valid reply): dropped
        arrays, metrics_out = self.strategy.aggregate_train(server_round, replies)
        if arrays is not None and current is not None:
            new = _record_vector(arrays)
            self.flush()  # round t-1's, in order; its error stops the run here
            self._reported = self._submit(
                self.reporter.report_round,
                server_round,
                new - current,
                RoundMetadata(
                    clip_norm=clip_norm,
                    cohort_size=len(valid) + inserted,
                    num_canaries_inserted=inserted,
                    num_failures=len(replies) - inserted - len(valid),
                    clipped_fraction=num_clipped / len(valid) if valid else 0.0,
                    noise_stddev=_noise_multiplier(self.strategy) * clip_norm,
                    train_loss=_metric(metrics_out, "loss"),
                ),
            )
            if server_round == self.num_rounds:
                self._final = new
                if not self._in_start and not self._final_reported:
                    self.flush()
                    self.reporter.report_final(new, {})
                    self._final_reported = True
                    self._close_audit_work()
        return arrays, metrics_out

    # -- evaluation: unchanged -----------------------------------------------------------
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)


def _noise_multiplier(strategy: Strategy) -> float:
    for item in _chain(strategy):
        z = getattr(item, "noise_multiplier", None)
        if z is not None:
            return float(z)
    return 0.0


def _metric(record: Mapping[str, Any] | None, word: str) -> float | None:
    """The first scalar metric whose key contains ``word`` (``loss``, ``acc``)."""
    for key, value in (record or {}).items():
        if word in key.lower() and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value) if np.isfinite(value) else None
    return None


def _final_metrics(result: Any, num_rounds: int) -> dict[str, float]:
    """Accuracy and loss of the final model: the ServerApp's ``evaluate_fn`` if it ran, else the
    clients' aggregated evaluation of the last round."""
    out: dict[str, float] = {}
    for source in ("evaluate_metrics_serverapp", "evaluate_metrics_clientapp"):
        record = getattr(result, source, {}).get(num_rounds)
        for name, word in (("accuracy", "acc"), ("loss", "loss")):
            value = _metric(record, word)
            if name not in out and value is not None and (name != "accuracy" or 0 <= value <= 1):
                out[name] = value
    return out
