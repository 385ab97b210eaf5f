"""The strategy wrapper for legacy ``flwr.server.strategy`` strategies
(:class:`LegacyCanaryAuditStrategy`): the same audit as :class:`.wrapper.CanaryAuditStrategy`
under ``LegacyContext`` + ``DefaultWorkflow``, SecAgg+ included. A shell over the same core
(:class:`.canary_audit.CanaryAudit`: claim, theta_0, canaries, cohort slots, weights, the
numbers of a canary reply and of the round's report, participants); what is here translates
``FitRes`` results to and from it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..auditor.validation import check_at_least
from ..protocol.vectors import flatten, unflatten
from .attach import reporter_from_env
from .canary_audit import CanaryAudit, canary_metrics, canary_models, update_norms
from .reporting import RoundReporter
from .strategies import current_noise_multiplier, legacy_strategy_class, read_claim

__all__ = ["LegacyCanaryAuditStrategy"]


class LegacyCanaryAuditStrategy(legacy_strategy_class()):
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

    def __init__(
        self,
        strategy: Any,
        *,
        num_rounds: int,
        reporter: RoundReporter,
        canaries: Any = None,
        clip_norm: float | None = None,
    ) -> None:
        if not isinstance(strategy, legacy_strategy_class()):
            raise ValueError(
                f"strategy must be a flwr.server.strategy.Strategy, got {type(strategy).__name__}"
                " (Message-API strategies: CanaryAuditStrategy)"
            )
        check_at_least(num_rounds, "num_rounds", 1)
        #: the audit's state and steps, shared with the Message-API wrapper
        self.audit = CanaryAudit(
            strategy,
            reporter,
            canaries=canaries,
            clip_norm=clip_norm,
            wrapper_hint="DifferentialPrivacyClientSideFixedClipping",
        )
        read_claim(strategy, num_rounds=num_rounds, num_nodes=1)
        self.strategy = strategy
        self.reporter = reporter
        self.num_rounds = int(num_rounds)
        self._canaries = canaries
        self._current: list[np.ndarray] | None = None
        self._round_block: dict[int, np.ndarray] = {}
        self._watching = False
        self.displaced = self.audit.displaced
        self.weight_factors = self.audit.weight_factors

    @classmethod
    def from_env(
        cls,
        strategy: Any,
        *,
        num_rounds: int,
        run_config: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> LegacyCanaryAuditStrategy:
        """As :meth:`CanaryAuditStrategy.from_env`."""
        return cls(
            strategy, num_rounds=num_rounds, reporter=reporter_from_env(run_config), **options
        )

    def __repr__(self) -> str:
        return f"LegacyCanaryAuditStrategy({self.strategy!r})"

    @property
    def clip_norm(self) -> float:
        return self.audit.clip_norm

    def _report_initial(self, ndarrays: list[np.ndarray]) -> None:
        if not self.audit.initial_reported:
            self.audit.report_initial(flatten(ndarrays))

    def initialize_parameters(self, client_manager: Any) -> Any:
        from flwr.common import parameters_to_ndarrays

        parameters = self.strategy.initialize_parameters(client_manager)
        if parameters is not None:
            self._declare(client_manager)
            self._report_initial(parameters_to_ndarrays(parameters))
        return parameters

    def _declare(self, client_manager: Any) -> None:
        if not self.audit.claimed:
            self.audit.declare(
                num_rounds=self.num_rounds, num_nodes=int(client_manager.num_available())
            )

    def _watch_grid(self, client_manager: Any) -> None:
        """Have the reporter probe the SuperLink, as the Message-API wrapper does in ``start``
        (issue #40: heartbeats then say when it last answered, and the service ends the audit of
        a run whose SuperLink died). A legacy strategy is not handed the grid: Flower's
        ``LegacyContext`` fills the client manager with ``GridClientProxy`` objects that hold
        it. No round timeout is passed: the legacy ``ServerConfig.round_timeout`` is not the
        strategy's to read (and its default, None, waits for replies as long as it takes)."""
        watch = getattr(self.reporter, "watch_grid", None)
        if self._watching or watch is None:
            return
        grid = next(
            (
                proxy.grid
                for proxy in client_manager.all().values()
                if callable(getattr(getattr(proxy, "grid", None), "get_node_ids", None))
            ),
            None,
        )
        if grid is not None:
            self._watching = True
            watch(grid.get_node_ids, round_timeout=None)

    def configure_fit(self, server_round: int, parameters: Any, client_manager: Any) -> list:
        """The wrapped strategy's clients, less one per canary scheduled this round."""
        from flwr.common import parameters_to_ndarrays

        self._declare(client_manager)
        self._watch_grid(client_manager)
        self._current = parameters_to_ndarrays(parameters)
        self._report_initial(self._current)
        pairs = list(self.strategy.configure_fit(server_round, parameters, client_manager))
        if not pairs:
            return pairs
        dim = sum(int(a.size) for a in self._current)
        block = np.asarray(self.audit.round_canaries(server_round, dim), np.float32).reshape(
            -1, dim
        )
        sent = self.audit.take_slots(
            server_round,
            pairs,
            int(block.shape[0]),
            what="FedAvg: fraction_fit x clients, at least min_fit_clients",
        )
        self._round_block[server_round] = block
        return sent

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
        norms = (
            update_norms(
                current, (flatten(parameters_to_ndarrays(res.parameters)) for _, res in results)
            )
            if current is not None
            else None
        )
        if block is not None and current is not None:
            weights = [float(res.num_examples) for _, res in results]
            weight, weight_factor = self.audit.canary_weight(
                server_round, weights, int(block.shape[0]), key="num_examples", integer=True
            )
            first = (results[0][1].metrics or {}) if results else {}
            metrics = canary_metrics(
                {key: [(res.metrics or {}).get(key) for _, res in results] for key in first},
                np.asarray(weights),
            )
            shapes = [a.shape for a in self._current]
            dtypes = [a.dtype for a in self._current]
            for model in canary_models(current, block, clip_norm):
                fit = FitRes(
                    status=Status(code=Code.OK, message=""),
                    parameters=ndarrays_to_parameters(unflatten(model, shapes, dtypes=dtypes)),
                    num_examples=int(round(weight)),
                    metrics=dict(metrics),
                )
                results.append((None, fit))
                inserted += 1
        parameters, metrics_out = self.strategy.aggregate_fit(server_round, results, failures)
        noise_clip_norm = self.clip_norm  # adaptive clipping: the norm Flower noised for
        if parameters is not None and current is not None:
            self.audit.calibration.record(
                server_round, clip_norm, noise_clip_norm, current_noise_multiplier(self.strategy)
            )
            new = flatten(parameters_to_ndarrays(parameters))
            self.reporter.report_round(
                server_round,
                new - current,
                self.audit.round_metadata(
                    server_round,
                    norms=norms,
                    inserted=inserted,
                    num_failures=len(failures),
                    clip_norm=clip_norm,
                    metrics=metrics_out,
                    weight_factor=weight_factor,
                    noise_clip_norm=noise_clip_norm,
                ),
            )
            if server_round == self.num_rounds and not self.audit.final_reported:
                self.reporter.report_final(new, {})
                self.audit.final_reported = True
        return parameters, metrics_out

    def configure_evaluate(self, server_round: int, parameters: Any, client_manager: Any) -> list:
        return self.strategy.configure_evaluate(server_round, parameters, client_manager)

    def aggregate_evaluate(self, server_round: int, results: list, failures: list) -> tuple:
        return self.strategy.aggregate_evaluate(server_round, results, failures)

    def evaluate(self, server_round: int, parameters: Any) -> Any:
        return self.strategy.evaluate(server_round, parameters)
