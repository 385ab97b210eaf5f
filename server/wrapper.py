"""Bring your own Flower app: a strategy wrapper that inserts canary clients and reports rounds.

In the spirit of Flower's ``DifferentialPrivacyServerSideFixedClipping``: wrap your (DP) strategy
and keep everything else. The two lines a Flower app adds (docs/flower.md)::

    from flaudit.server.wrapper import CanaryAuditStrategy
    strategy = CanaryAuditStrategy.from_env(strategy)   # after building your DP strategy

``from_env`` reads ``FLAUDIT_AUDIT_ID``, ``FLAUDIT_URL`` and ``FLAUDIT_RUN_TOKEN`` (printed once
by ``flaudit attach`` / ``POST /audits`` with ``"engine": "external"``; the token may instead be
in a file named by ``FLAUDIT_RUN_TOKEN_FILE``, never in the run config). The canary seed never
reaches the app: the wrapper fetches each round's canary vectors from the service, which schedules them by the same rule as its built-in audits
(:class:`flaudit.server.schedules.CanarySchedule`); round ``t + 1``'s canaries are fetched and
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
* A wrapped strategy whose class overrides ``start()`` keeps running its own loop.
* ``accountant=`` strategies are audited (the sample stays ``num_sampled_clients``); the
  accountant's epsilon is logged after ``start()``.
* :class:`LegacyCanaryAuditStrategy` does the same for ``flwr.server.strategy`` strategies
  under ``LegacyContext`` + ``DefaultWorkflow``, SecAgg+ included.

Limits
------
* Canaries per round are capped at ``num_sampled_clients`` (they take slots): about ``k/2``
  seen canaries times ``canary_repeats`` must fit ``n`` per round (the service refuses the
  claim otherwise).
* A Message-API strategy given to the legacy wrapper, or the reverse, is refused.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from logging import ERROR, INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.supercore.differential_privacy import KEY_NORM_BIT
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from flaudit.auditor.canaries import Canaries, CanaryFamily, resolve_canary_family, seen_mask
from flaudit.auditor.claims.sizing import check_num_canaries
from flaudit.auditor.service.external import RUN_CONFIG_KEYS
from flaudit.auditor.validation import check_at_least, check_positive
from flaudit.server.reporting import ReportingError, RoundMetadata, RoundReporter
from flaudit.server.schedules import CanarySchedule
from flaudit.server.vectors import flatten, unflatten

from .audit_notes import design_line, refusal_line

__all__ = ["CanaryAuditStrategy", "LegacyCanaryAuditStrategy", "LocalCanaries", "read_claim", "ENV_AUDIT_ID", "ENV_URL",
           "ENV_RUN_TOKEN", "ENV_RUN_TOKEN_FILE"]

ENV_AUDIT_ID = "FLAUDIT_AUDIT_ID"
ENV_URL = "FLAUDIT_URL"
ENV_RUN_TOKEN = "FLAUDIT_RUN_TOKEN"
ENV_RUN_TOKEN_FILE = "FLAUDIT_RUN_TOKEN_FILE"


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


def _is_legacy(strategy: Any) -> bool:
    return type(strategy).__module__.startswith("flwr.server.strategy") or isinstance(
        strategy, _legacy_strategy_class())


def _legacy_strategy_class() -> type:
    from flwr.server.strategy import Strategy as LegacyStrategy

    return LegacyStrategy


def _refuse_legacy(strategy: Any) -> None:
    for item in _chain(strategy):
        module = type(item).__module__
        if module.startswith("flwr.server.strategy"):
            name = type(item).__name__
            raise ValueError(
                f"strategy: {name} is a legacy flwr.server.strategy strategy (LegacyContext, "
                f"DefaultWorkflow, SecAgg+); wrap it in LegacyCanaryAuditStrategy, or use "
                f"flwr.serverapp.strategy.{name} and strategy.start(grid=..., "
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
        For a legacy strategy or no clipping norm, saying what to change.
    """
    import flwr.server.strategy as legacy
    import flwr.serverapp.strategy as message_api

    if not _is_legacy(strategy):
        _refuse_legacy(strategy)
    fixed = tuple(getattr(module, f"DifferentialPrivacy{side}SideFixedClipping")
                  for module in (message_api, legacy) for side in ("Server", "Client"))
    adaptive = tuple(getattr(module, f"DifferentialPrivacy{side}SideAdaptiveClipping")
                     for module in (message_api, legacy) for side in ("Server", "Client"))
    claim: dict[str, Any] = {"num_rounds": int(num_rounds), "participation": "uniform"}
    chain = _chain(strategy)
    dp = next((s for s in chain if isinstance(s, fixed + adaptive)), None)
    base = chain[-1]
    least_nodes = getattr(base, "min_available_nodes", getattr(base, "min_available_clients", 1))
    nodes = max(int(num_nodes), int(least_nodes or 1))
    claim["num_clients"] = nodes
    claim["strategy"] = " > ".join(type(s).__name__ for s in chain)[:200]
    if dp is None:
        fraction = float(getattr(base, "fraction_train", getattr(base, "fraction_fit", 1.0)))
        least = getattr(base, "min_train_nodes", getattr(base, "min_fit_clients", 1))
        claim["clients_per_round"] = max(1, int(least), int(fraction * nodes))
        claim["noise_multiplier"] = 0.0
        return claim
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

    The same rule as the service's external audits (:func:`flaudit.auditor.service.external.canary_plan`,
    :class:`flaudit.server.schedules.CanarySchedule`): the seen set from the seed,
    ``canary_repeats`` rounds per seen canary from ``data_seed``, at most ``clients_per_round``
    canaries per round (they take cohort slots; ``None``: no cap), the family from
    ``canary_family`` by :func:`flaudit.auditor.canaries.resolve_canary_family` once the model
    size is known (``None``: orthogonal where ``num_canaries <= d``). The seed never appears in
    ``repr``.
    """

    def __init__(self, canary_seed: int, *, num_canaries: int, num_rounds: int,
                 canary_repeats: int = 1, data_seed: int = 0,
                 canary_family: CanaryFamily | str | None = None,
                 clients_per_round: int | None = None) -> None:
        check_at_least(num_canaries, "num_canaries", 2)
        check_at_least(num_rounds, "num_rounds", 1)
        if not 1 <= canary_repeats <= num_rounds:
            raise ValueError(f"canary_repeats must be in [1, num_rounds], got {canary_repeats}")
        self._seed = int(canary_seed)
        self.num_canaries = int(num_canaries)
        self.canary_family = None if canary_family is None else CanaryFamily(canary_family)
        self._plan = CanarySchedule.from_mask(
            seen_mask(self._seed, int(num_canaries)), num_rounds=int(num_rounds),
            canary_repeats=int(canary_repeats), seed=int(data_seed),
            max_per_round=clients_per_round,
        )
        self.by_round = {t: self._plan.seen(t) for t in range(1, int(num_rounds) + 1)}
        self._canaries: Canaries | None = None

    def __repr__(self) -> str:
        return f"LocalCanaries(num_rounds={len(self.by_round)})"

    def participants(self, server_round: int) -> np.ndarray:
        """Canary indices "in" the round (seen inserted + unseen drawn), for the known-rounds
        statistic; what the service derives itself for an external audit."""
        return self._plan.participants(server_round)

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


def _reporter_from_env(run_config: Mapping[str, Any] | None, *,
                       on_service_error: str | None = None,
                       resume: bool | None = None) -> RoundReporter:
    """The service client of the audit named by the environment or the run config (``from_env``):
    ``on_service_error`` from ``FLAUDIT_ON_SERVICE_ERROR`` or the run-config key
    ``flaudit-on-service-error`` (default ``"continue"``), ``resume`` from ``FLAUDIT_RESUME``."""
    from flaudit.server.reporting import HttpRoundReporter

    config = dict(run_config or {})
    if str(config.get("flaudit-run-token", "") or ""):
        raise ValueError(
            "run config 'flaudit-run-token': the run token must not be in the run config "
            "(apps write it to disk); pass it as FLAUDIT_RUN_TOKEN in the ServerApp's "
            "environment or in a file named by 'flaudit-run-token-file' (`flaudit attach "
            "--format run-config --token-file PATH` writes one), and rotate this one "
            "(`flaudit attach --rotate AUDIT_ID`)"
        )
    values = {}
    for env, key in RUN_CONFIG_KEYS.items():
        values[env] = os.environ.get(env) or str(config.get(key, "") or "")
    token = os.environ.get(ENV_RUN_TOKEN, "")
    token_file = values.pop(ENV_RUN_TOKEN_FILE, "")
    if not token and token_file:
        try:
            with open(token_file, encoding="utf-8") as handle:
                token = handle.readline().strip()
        except OSError as error:
            raise ValueError(
                f"{ENV_RUN_TOKEN_FILE}: cannot read the run token file {token_file!r} "
                f"({type(error).__name__}) where the ServerApp runs"
            ) from None
    values[ENV_RUN_TOKEN] = token
    for env, value in values.items():
        if not value:
            if env == ENV_RUN_TOKEN:
                env = f"{ENV_RUN_TOKEN} (or {ENV_RUN_TOKEN_FILE})"
            key = RUN_CONFIG_KEYS.get(env, RUN_CONFIG_KEYS[ENV_RUN_TOKEN_FILE])
            raise ValueError(
                f"{env} is not set (nor the run-config key {key!r}): print the lines with "
                "`flaudit attach` (or POST /audits with \"engine\": \"external\") and export "
                "them where the ServerApp runs (the SuperLink's environment)"
            )
    if on_service_error is None:
        on_service_error = (os.environ.get("FLAUDIT_ON_SERVICE_ERROR")
                            or str(config.get("flaudit-on-service-error", "") or "")
                            or "continue")
    if resume is None:
        resume = os.environ.get("FLAUDIT_RESUME", "").strip().lower() in {"1", "true", "yes"}
    return HttpRoundReporter(values[ENV_URL], values[ENV_AUDIT_ID], values[ENV_RUN_TOKEN],
                             on_service_error=on_service_error, resume=bool(resume))


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
        :class:`~flaudit.server.reporting.HttpRoundReporter`, which also serves the round's canaries.
    canaries : object, optional
        Has ``round_canaries(server_round, dim)`` returning unit vectors ``(c, dim)`` (and
        optionally ``participants(server_round)``); default: the reporter's
        ``round_canaries(server_round)`` (the service schedules them).
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
    ) -> None:
        _refuse_legacy(strategy)
        self._num_canaries = (None if num_canaries is None
                              else check_num_canaries(num_canaries))
        read_claim(strategy, num_rounds=1, num_nodes=1)
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
        # the wrapped strategy's own methods, bound before anything is patched: an overridden
        # start() of the wrapped strategy calls back into ours (see start())
        self._inner_configure_train = strategy.configure_train
        self._inner_aggregate_train = strategy.aggregate_train
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
        self._round_block: dict[int, np.ndarray] = {}
        self._slot_rng = np.random.default_rng()
        self._max_weight = 0.0
        #: per round: how many of the sampled nodes the canaries displaced (not sent a message)
        self.displaced: dict[int, int] = {}
        #: per round: largest weight x replies / total weight (1: equal weights); above 1 the
        #: weighting gives the heaviest reply more than the C/n the noise is calibrated for
        self.weight_factors: dict[int, float] = {}
        self._weighting_warned = False  # the weighting warning: once per run
        # the audit's own network and CPU work (fetching round t+1's canaries, reporting round
        # t's release) runs in order on one thread while the clients train
        self._audit_work: ThreadPoolExecutor | None = None
        self._prefetched: dict[int, Future[np.ndarray]] = {}
        self._reported: Future[None] | None = None
        self.stop_on_alarm = bool(stop_on_alarm)
        self.stopped_at_round: int | None = None
        self._last: np.ndarray | None = None

    @classmethod
    def from_env(
        cls, strategy: Strategy, *, run_config: Mapping[str, Any] | None = None,
        on_service_error: str | None = None, resume: bool | None = None, **options: Any
    ) -> "CanaryAuditStrategy":
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
        (see :class:`~flaudit.server.reporting.HttpRoundReporter`).

        Raises
        ------
        ValueError
            Naming the missing variable, or a run token found in the run config.
        """
        return cls(strategy, reporter=_reporter_from_env(
            run_config, on_service_error=on_service_error, resume=resume), **options)

    def __repr__(self) -> str:
        return f"CanaryAuditStrategy({self.strategy!r})"

    def summary(self) -> None:
        log(INFO, "\t├──> Canary audit: canaries from %s, taking cohort slots",
            type(self._canaries or self.reporter).__name__)
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
        if self.stop_on_alarm:
            claim["stop_on_alarm"] = True
        if self._num_canaries is not None:
            claim["num_canaries"] = self._num_canaries
        declare = getattr(self.reporter, "declare_claim", None)
        if declare is not None:
            try:
                declare(claim)
            except ReportingError as error:  # e.g. more canaries than the federation holds
                log(ERROR, refusal_line(getattr(self.reporter, "audit_id", "?"), error))
                raise
        self.num_rounds = int(num_rounds)
        self._claimed = True
        self._cohort = int(claim["clients_per_round"])
        log(INFO, "flaudit: claim declared: noise multiplier %s, %s, %d of %d nodes per round, "
            "%d rounds", claim["noise_multiplier"],
            f"clip norm {claim['clip_norm']}" if "clip_norm" in claim else "adaptive clipping",
            claim["clients_per_round"], claim["num_clients"], num_rounds)
        design = design_line(getattr(self.reporter, "claim_ack", None))
        if design is not None:  # what the audit will catch, before round 1
            log(INFO, "%s", design)
        return claim

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, *args: Any,
              **kwargs: Any):
        """Declare the claim, report theta_0, run the wrapped strategy's loop, then report
        theta_T with the final round's accuracy and loss (from ``evaluate_fn`` or the clients'
        evaluation).

        The loop is the wrapped strategy's own ``start()`` when it overrides Flower's (an app
        that writes results or checkpoints there keeps doing so): while it runs, its
        ``configure_train`` and ``aggregate_train`` are this wrapper's, which call its own.
        """
        self.declare(grid, num_rounds)
        self._report_initial(initial_arrays)
        self._in_start = True
        own_start = _overrides_start(self.strategy)
        try:
            if own_start:
                self.strategy.configure_train = self.configure_train
                self.strategy.aggregate_train = self.aggregate_train
                result = self.strategy.start(grid, initial_arrays, num_rounds, *args, **kwargs)
            else:
                result = super().start(grid, initial_arrays, num_rounds, *args, **kwargs)
        finally:
            self._in_start = False
            if own_start:
                for name in ("configure_train", "aggregate_train"):
                    self.strategy.__dict__.pop(name, None)
        self.flush()
        if self._final is not None and not self._final_reported:
            self.reporter.report_final(
                self._final, _final_metrics(result, self.stopped_at_round or num_rounds)
            )
            self._final_reported = True
        spent = _accountant_spent(self.strategy)
        if spent is not None:
            log(INFO, "flaudit: Flower's accountant reports epsilon = %.4g at delta = %g after "
                "%d releases; the audit page shows dp-accounting's analytic epsilon beside the "
                "measured bounds", spent.epsilon, spent.delta, spent.num_releases)
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
        """The wrapped strategy's messages, less one per canary scheduled this round."""
        if not self._claimed and self.num_rounds is not None:
            self.declare(grid, self.num_rounds)
        if self._stop_requested(server_round):
            return []
        self._current = arrays
        self._report_initial(arrays)
        messages = list(self._inner_configure_train(server_round, arrays, config, grid))
        if not messages:
            return messages
        self._template = messages[0]
        dim = sum(int(np.prod(a.shape)) for a in arrays.values())
        block = self._take_canaries(server_round, dim)
        if block.shape[0] > len(messages):
            raise ValueError(
                f"round {server_round}: {block.shape[0]} canaries are scheduled but the strategy "
                f"sampled only {len(messages)} nodes; canaries take cohort slots, so "
                "num_sampled_clients must match the nodes the strategy samples (FedAvg: "
                "fraction_train x nodes, at least min_train_nodes), or use fewer canaries"
            )
        self._round_block[server_round] = block
        displaced = int(block.shape[0])
        self.displaced[server_round] = displaced
        if self.num_rounds is None or server_round < self.num_rounds:  # while the clients train
            if server_round + 1 not in self._prefetched:
                self._prefetched[server_round + 1] = self._submit(
                    self._round_canaries, server_round + 1, dim
                )
        if displaced == 0:
            return messages
        drop = set(self._slot_rng.choice(len(messages), size=displaced, replace=False).tolist())
        return [m for i, m in enumerate(messages) if i not in drop]

    def _take_canaries(self, server_round: int, dim: int) -> np.ndarray:
        prefetched = self._prefetched.pop(server_round, None)
        block = prefetched.result() if prefetched is not None else None
        # an empty prefetch may be an outage that is over now (fail-open): ask again
        if block is None or block.shape[0] == 0 or block.shape[1:] != (dim,):
            block = self._round_canaries(server_round, dim)
        return block

    def _stop_requested(self, server_round: int) -> bool:
        """Stop on alarm: after round t's report says the claim is refuted, rounds t+1.. send
        no messages (waits for round t's report before round t+1, only with the option)."""
        if self.stopped_at_round is None and self.stop_on_alarm and self._last is not None:
            self.flush()
            reason = getattr(self.reporter, "stop_reason", None)
            if reason:
                self.stopped_at_round = server_round - 1
                self._final = self._last
                log(WARNING, "flaudit: %s; training stops after round %d (stop_on_alarm)",
                    reason, self.stopped_at_round)
        return self.stopped_at_round is not None

    def _round_canaries(self, server_round: int, dim: int) -> np.ndarray:
        """The round's ``c`` canary replies per unit of clip norm, ``(c, dim)``.

        From the service: ``sum / c`` for each of the ``c`` replies (a read-only broadcast view:
        ``4 d`` bytes fetched and held whatever ``c``); each has norm ``<= 1``, so the wrapped
        strategy's clipping at ``clip_norm`` leaves ``clip_norm * sum / c`` unchanged and the
        ``c`` replies add up to ``clip_norm`` times the canaries' sum, exactly what ``c``
        full-norm canary replies add (docs/estimators.md, "Canary replies from the round's sum").
        From a local ``canaries`` object: its unit vectors, renormalised in float64.
        """
        if self._canaries is not None:
            block = np.asarray(self._canaries.round_canaries(server_round, dim),
                               dtype=np.float64).reshape(-1, dim)
            return block / np.linalg.norm(block, axis=1, keepdims=True)
        return np.asarray(self.reporter.round_canaries(server_round),
                          dtype=np.float32).reshape(-1, dim)

    def _canary_metrics(self, valid: list[Message], weight: float) -> RecordDict:
        """MetricRecords with the real replies' names and keys; each value the weighted mean."""
        if not valid:  # every slot of the round went to a canary
            return {"metrics": MetricRecord({self.weight_key: weight})}
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

    def _canary_reply(self, vector: np.ndarray, like: Message | None, metrics: dict) -> Message:
        if like is not None:
            name, record = next(iter(like.content.array_records.items()))
        else:  # no real reply this round: the layout of the arrays sent
            name, record = "arrays", self._current
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
        """Add the round's canary replies (at the largest weight seen so far) and aggregate."""
        if self.stopped_at_round is not None:
            return None, None  # stopped on alarm: nothing trained, the model stays
        replies = list(replies)
        valid = [r for r in replies if not r.has_error() and r.content.array_records]
        current = _record_vector(self._current) if self._current is not None else None
        inserted = 0
        num_clipped = 0
        clip_norm = self.clip_norm
        weight_factor = None
        block = self._round_block.pop(server_round, None)
        if current is not None and self._template is not None and block is not None:
            for reply in valid:
                update = _record_vector(next(iter(reply.content.array_records.values()))) - current
                num_clipped += int(np.linalg.norm(update.astype(np.float64)) > clip_norm)
            weights = [self._reply_weight(reply) for reply in valid]
            # worst case for the claim: a canary weighs what the heaviest client seen so far
            # weighs (it could have been sampled into this round); equal weights: exactly the
            # clients' weight, as before
            self._max_weight = max([self._max_weight, *weights])
            weight = self._max_weight if self._max_weight > 0 else 1.0
            metrics = self._canary_metrics(valid, weight)
            like = valid[0] if valid else None
            for direction in block:  # per unit of clip norm (see _round_canaries)
                model = (current + clip_norm * direction).astype(np.float32)
                replies.append(self._canary_reply(model, like, metrics))
                inserted += 1
            total = sum(weights) + inserted * weight
            count = len(weights) + inserted
            if total > 0 and count:
                weight_factor = weight * count / total
                self.weight_factors[server_round] = weight_factor
                if weight_factor > 1 + 1e-9 and not self._weighting_warned:
                    self._weighting_warned = True
                    _warn_weighting(server_round, self.weight_key, weight_factor)
        elif current is not None and not valid:
            log(WARNING, "flaudit: round %s has no valid reply; no canary inserted", server_round)
        self._prefetched.pop(server_round, None)  # not used: dropped
        arrays, metrics_out = self._inner_aggregate_train(server_round, replies)
        if arrays is not None and current is not None:
            new = _record_vector(arrays)
            self._last = new
            self.flush()  # round t-1's, in order; its error stops the run here
            participants = getattr(self._canaries, "participants", None)
            metadata = RoundMetadata(
                clip_norm=clip_norm,
                cohort_size=len(valid) + inserted,
                num_canaries_inserted=inserted,
                num_failures=len(replies) - inserted - len(valid),
                clipped_fraction=num_clipped / len(valid) if valid else 0.0,
                noise_stddev=_noise_multiplier(self.strategy) * clip_norm,
                train_loss=_metric(metrics_out, "loss"),
                participants=(None if participants is None
                              else tuple(int(j) for j in participants(server_round))),
            )
            if weight_factor is not None:
                metadata = replace(metadata, weight_factor=weight_factor)
            self._reported = self._submit(self.reporter.report_round, server_round,
                                          new - current, metadata)
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
        if self.stopped_at_round is not None:
            return []
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)

    def __getattr__(self, name: str) -> Any:
        # the wrapped strategy's own attributes (an app's start() or callbacks read them)
        if name.startswith("_") or name == "strategy":
            raise AttributeError(name)
        return getattr(self.__dict__["strategy"], name)


class LegacyCanaryAuditStrategy(_legacy_strategy_class()):
    """:class:`CanaryAuditStrategy` for legacy ``flwr.server.strategy`` strategies: ``FedAvg``
    and Flower's four DP wrappers, run by ``LegacyContext`` + ``DefaultWorkflow``, including
    ``SecAggPlusWorkflow`` with ``secaggplus_mod`` / ``fixedclipping_mod`` clients.

    The same audit: seen canaries take cohort slots (``configure_fit`` leaves ``c`` of the
    sampled clients out, ``aggregate_fit`` adds ``c`` canary results at the largest
    ``num_examples`` seen so far), the claim comes from the DP wrapper, every round is reported.

    Under SecAgg+ the server never sees a client's update: after unmasking, Flower hands
    ``aggregate_fit`` one result per client that all carry the *same* securely aggregated
    (weighted-average) parameters, each with the client's own ``num_examples``. FedAvg's weighted
    average of those plus the canary results is exactly the average the canaries would have
    entered as SecAgg+ clients (it is linear), so the audit is the same; what the auditor sees is
    what any server sees: the aggregate, the weights and the metrics, never an update.

    Parameters
    ----------
    strategy : flwr.server.strategy.Strategy
        E.g. ``DifferentialPrivacyClientSideFixedClipping(FedAvg(...), ...)`` (Flower's fl-dp-sa).
    num_rounds : int
        The ``ServerConfig(num_rounds=...)`` of the ``LegacyContext`` (a legacy strategy is not
        told the number of rounds).
    reporter, canaries, clip_norm
        As for :class:`CanaryAuditStrategy`.
    """

    def __init__(self, strategy: Any, *, num_rounds: int, reporter: RoundReporter,
                 canaries: Any = None, clip_norm: float | None = None) -> None:
        if not isinstance(strategy, _legacy_strategy_class()):
            raise ValueError(
                f"strategy must be a flwr.server.strategy.Strategy, got {type(strategy).__name__}"
                " (Message-API strategies: CanaryAuditStrategy)"
            )
        check_at_least(num_rounds, "num_rounds", 1)
        if clip_norm is not None:
            check_positive(clip_norm, "clip_norm")
        if clip_norm is None and _current_clip_norm(strategy) is None:
            raise ValueError(
                "clip_norm: the wrapped strategy has no Flower DP wrapper to read the clipping "
                "norm from; wrap it in DifferentialPrivacyClientSideFixedClipping (or another "
                "DP wrapper), or pass clip_norm= for your own clipping"
            )
        read_claim(strategy, num_rounds=num_rounds, num_nodes=1)
        self.strategy = strategy
        self.reporter = reporter
        self.num_rounds = int(num_rounds)
        self._canaries = canaries
        self._clip_norm = None if clip_norm is None else float(clip_norm)
        self._claimed = False
        self._initial_reported = False
        self._final_reported = False
        self._current: list[np.ndarray] | None = None
        self._round_block: dict[int, np.ndarray] = {}
        self._slot_rng = np.random.default_rng()
        self._max_weight = 0.0
        self.displaced: dict[int, int] = {}
        self.weight_factors: dict[int, float] = {}
        self._weighting_warned = False  # the weighting warning: once per run

    @classmethod
    def from_env(cls, strategy: Any, *, num_rounds: int,
                 run_config: Mapping[str, Any] | None = None,
                 **options: Any) -> "LegacyCanaryAuditStrategy":
        """As :meth:`CanaryAuditStrategy.from_env`."""
        return cls(strategy, num_rounds=num_rounds, reporter=_reporter_from_env(run_config),
                   **options)

    def __repr__(self) -> str:
        return f"LegacyCanaryAuditStrategy({self.strategy!r})"

    @property
    def clip_norm(self) -> float:
        norm = _current_clip_norm(self.strategy)
        return float(norm if norm is not None else self._clip_norm)

    def _report_initial(self, ndarrays: list[np.ndarray]) -> None:
        if not self._initial_reported:
            self.reporter.report_initial(flatten(ndarrays))
            self._initial_reported = True

    def initialize_parameters(self, client_manager: Any) -> Any:
        from flwr.common import parameters_to_ndarrays

        parameters = self.strategy.initialize_parameters(client_manager)
        if parameters is not None:
            self._declare(client_manager)
            self._report_initial(parameters_to_ndarrays(parameters))
        return parameters

    def _declare(self, client_manager: Any) -> None:
        if self._claimed:
            return
        claim = read_claim(self.strategy, num_rounds=self.num_rounds,
                           num_nodes=int(client_manager.num_available()))
        if "clip_norm" not in claim and "adaptive_clipping" not in claim:
            claim["clip_norm"] = self._clip_norm
        declare = getattr(self.reporter, "declare_claim", None)
        if declare is not None:
            try:
                declare(claim)
            except ReportingError as error:
                log(ERROR, refusal_line(getattr(self.reporter, "audit_id", "?"), error))
                raise
        self._claimed = True
        design = design_line(getattr(self.reporter, "claim_ack", None))
        if design is not None:
            log(INFO, "%s", design)

    def configure_fit(self, server_round: int, parameters: Any, client_manager: Any) -> list:
        """The wrapped strategy's clients, less one per canary scheduled this round."""
        from flwr.common import parameters_to_ndarrays

        self._declare(client_manager)
        self._current = parameters_to_ndarrays(parameters)
        self._report_initial(self._current)
        pairs = list(self.strategy.configure_fit(server_round, parameters, client_manager))
        if not pairs:
            return pairs
        dim = sum(int(a.size) for a in self._current)
        block = np.asarray(self._round_canaries(server_round, dim), np.float32).reshape(-1, dim)
        if block.shape[0] > len(pairs):
            raise ValueError(
                f"round {server_round}: {block.shape[0]} canaries are scheduled but the strategy "
                f"sampled only {len(pairs)} clients; num_sampled_clients must match the clients "
                "the strategy samples (FedAvg: fraction_fit x clients, at least min_fit_clients)"
            )
        self._round_block[server_round] = block
        self.displaced[server_round] = int(block.shape[0])
        drop = set(self._slot_rng.choice(len(pairs), size=block.shape[0], replace=False).tolist())
        return [pair for i, pair in enumerate(pairs) if i not in drop]

    def _round_canaries(self, server_round: int, dim: int) -> np.ndarray:
        if self._canaries is not None:
            return self._canaries.round_canaries(server_round, dim)
        return self.reporter.round_canaries(server_round)

    def aggregate_fit(self, server_round: int, results: list, failures: list) -> tuple:
        """Add the round's canary results (at the largest weight seen so far) and aggregate."""
        from flwr.common import (
            Code,
            FitRes,
            Status,
            ndarrays_to_parameters,
            parameters_to_ndarrays,
        )

        results = list(results)
        block = self._round_block.pop(server_round, None)
        current = flatten(self._current) if self._current is not None else None
        clip_norm = self.clip_norm
        inserted, weight_factor = 0, None
        if block is not None and current is not None:
            weights = [float(res.num_examples) for _, res in results]
            self._max_weight = max([self._max_weight, *weights])  # heaviest client so far
            weight = self._max_weight if self._max_weight > 0 else 1.0
            metrics: dict[str, Any] = {}
            for key, first in (results[0][1].metrics or {}).items() if results else ():
                column = [res.metrics.get(key) for _, res in results]
                if isinstance(first, (int, float)) and not isinstance(first, bool) and all(
                        isinstance(v, (int, float)) for v in column):
                    metrics[key] = _mean_value(column, np.asarray(weights))
                elif key == KEY_NORM_BIT:
                    metrics[key] = False
            if KEY_NORM_BIT in metrics:
                metrics[KEY_NORM_BIT] = False  # a canary has norm S(t): not clipped
            shapes = [a.shape for a in self._current]
            dtypes = [a.dtype for a in self._current]
            for direction in block:
                model = (current + clip_norm * direction).astype(np.float32)  # per unit of S
                fit = FitRes(status=Status(code=Code.OK, message=""),
                             parameters=ndarrays_to_parameters(
                                 unflatten(model, shapes, dtypes=dtypes)),
                             num_examples=int(round(weight)), metrics=dict(metrics))
                results.append((None, fit))
                inserted += 1
            total, count = sum(weights) + inserted * round(weight), len(weights) + inserted
            if total > 0:
                weight_factor = round(weight) * count / total
                self.weight_factors[server_round] = weight_factor
                if weight_factor > 1 + 1e-9 and not self._weighting_warned:
                    self._weighting_warned = True
                    _warn_weighting(server_round, "num_examples", weight_factor)
        parameters, metrics_out = self.strategy.aggregate_fit(server_round, results, failures)
        if parameters is not None and current is not None:
            new = flatten(parameters_to_ndarrays(parameters))
            self.reporter.report_round(server_round, new - current, RoundMetadata(
                clip_norm=clip_norm,
                cohort_size=len(results),
                num_canaries_inserted=inserted,
                num_failures=len(failures),
                clipped_fraction=0.0,
                noise_stddev=_noise_multiplier(self.strategy) * clip_norm,
                train_loss=_metric(metrics_out, "loss"),
                participants=(None if not hasattr(self._canaries, "participants") else
                              tuple(int(j) for j in self._canaries.participants(server_round))),
                weight_factor=weight_factor,
            ))
            if server_round == self.num_rounds and not self._final_reported:
                self.reporter.report_final(new, {})
                self._final_reported = True
        return parameters, metrics_out

    def configure_evaluate(self, server_round: int, parameters: Any, client_manager: Any) -> list:
        return self.strategy.configure_evaluate(server_round, parameters, client_manager)

    def aggregate_evaluate(self, server_round: int, results: list, failures: list) -> tuple:
        return self.strategy.aggregate_evaluate(server_round, results, failures)

    def evaluate(self, server_round: int, parameters: Any) -> Any:
        return self.strategy.evaluate(server_round, parameters)


def _overrides_start(strategy: Strategy) -> bool:
    """Whether ``strategy``'s class has its own ``start()`` (not Flower's ``Strategy.start``)."""
    return getattr(type(strategy), "start", Strategy.start) is not Strategy.start


def _accountant_spent(strategy: Strategy) -> Any:
    """Flower's accountant's cumulative spend (``privacy_spent()``) of a DP wrapper, if any."""
    for item in _chain(strategy):
        if getattr(item, "accountant", None) is not None and hasattr(item, "privacy_spent"):
            return item.privacy_spent()
    return None


def _warn_weighting(server_round: int, key: str, factor: float) -> None:
    """The weighting warning, said once per run (the largest factor is in the audit)."""
    log(WARNING, "flaudit: round %s: weighting by '%s' gives the heaviest reply %.3g x the "
        "influence C/n the DP noise is calibrated for, so the claim does not hold for a client "
        "that heavy (up to %.3g x the claimed mu); the audit tests the noise at the canaries' "
        "weight and its verdict says whether the noise, the weighting or both break the claim. "
        "Cap the weights or weight uniformly. (Said once per run.)",
        server_round, key, factor, factor)


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
