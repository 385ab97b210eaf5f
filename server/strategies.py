"""What flaudit reads off a user's Flower strategy, Message API or legacy: the DP claim
(:func:`read_claim`: noise multiplier, fixed or adaptive clipping, sampled clients), the current
clip norm, the weight key, the accountant's spend, the final metrics, and the chain of wrapped
strategies. Used by both strategy wrappers (:mod:`.wrapper`, :mod:`.legacy`)."""

from __future__ import annotations

from collections.abc import Mapping
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord
from flwr.common.logger import log
from flwr.serverapp.strategy import Strategy

from ..protocol.vectors import flatten
from .noise_calibration import configured_noise_multiplier

__all__ = [
    "accountant_spent",
    "current_clip_norm",
    "current_noise_multiplier",
    "final_metrics",
    "find_metric",
    "legacy_strategy_class",
    "overrides_start",
    "read_claim",
    "read_weight_key",
    "record_vector",
    "refuse_legacy",
    "warn_weighting",
    "weighted_mean_value",
]


def record_vector(record: ArrayRecord) -> np.ndarray:
    """A Flower ``ArrayRecord`` (a model or a reply) as one flat vector."""
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
        strategy, legacy_strategy_class()
    )


def legacy_strategy_class() -> type:
    """Flower's legacy ``flwr.server.strategy.Strategy`` base class."""
    from flwr.server.strategy import Strategy as LegacyStrategy

    return LegacyStrategy


def refuse_legacy(strategy: Any) -> None:
    """Raise a ``ValueError`` saying what to change unless ``strategy`` is a Message-API
    strategy with no legacy strategy in its chain."""
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
        refuse_legacy(strategy)
    fixed = tuple(
        getattr(module, f"DifferentialPrivacy{side}SideFixedClipping")
        for module in (message_api, legacy)
        for side in ("Server", "Client")
    )
    adaptive = tuple(
        getattr(module, f"DifferentialPrivacy{side}SideAdaptiveClipping")
        for module in (message_api, legacy)
        for side in ("Server", "Client")
    )
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
        # Flower keeps the update noise z_delta as noise_multiplier; the user set z
        claim["configured_noise_multiplier"] = configured_noise_multiplier(
            float(dp.noise_multiplier), float(dp.clipped_count_stddev or 0.0)
        )
    return claim


def current_clip_norm(strategy: Strategy) -> float | None:
    """The clipping norm of the first DP wrapper in the chain now (adaptive clipping moves
    it); None without one."""
    for item in _chain(strategy):
        norm = getattr(item, "clipping_norm", None)
        if norm is not None:
            return float(norm)
    return None


def read_weight_key(strategy: Strategy) -> str:
    """The reply metric the innermost strategy weights by (``weighted_by_key``)."""
    return str(getattr(_chain(strategy)[-1], "weighted_by_key", "num-examples"))


# -- canaries --------------------------------------------------------------------------------


def weighted_mean_value(values: list[Any], weights: np.ndarray) -> Any:
    """The weighted mean of one metric over the real replies, in the metric's own type."""
    if isinstance(values[0], (list, tuple)):
        array = np.average(np.asarray(values, dtype=np.float64), axis=0, weights=weights)
        return [int(round(v)) for v in array] if isinstance(values[0][0], int) else array.tolist()
    mean = float(np.average(np.asarray(values, dtype=np.float64), weights=weights))
    if isinstance(values[0], bool):
        return mean >= 0.5
    return int(round(mean)) if isinstance(values[0], int) else mean


def overrides_start(strategy: Strategy) -> bool:
    """Whether ``strategy``'s class has its own ``start()`` (not Flower's ``Strategy.start``)."""
    return getattr(type(strategy), "start", Strategy.start) is not Strategy.start


def accountant_spent(strategy: Strategy) -> Any:
    """Flower's accountant's cumulative spend (``privacy_spent()``) of a DP wrapper, if any."""
    for item in _chain(strategy):
        if getattr(item, "accountant", None) is not None and hasattr(item, "privacy_spent"):
            return item.privacy_spent()
    return None


def warn_weighting(server_round: int, key: str, factor: float) -> None:
    """The weighting warning, said once per run (the largest factor is in the audit)."""
    log(
        WARNING,
        "flaudit: round %s: weighting by '%s' gives the heaviest reply %.3g x the "
        "influence C/n the DP noise is calibrated for, so the claim does not hold for a client "
        "that heavy (up to %.3g x the claimed mu); the audit tests the noise at the canaries' "
        "weight and its verdict says whether the noise, the weighting or both break the claim. "
        "Cap the weights or weight uniformly. (Said once per run.)",
        server_round,
        key,
        factor,
        factor,
    )


def current_noise_multiplier(strategy: Strategy) -> float:
    """The noise multiplier of the first DP wrapper in the chain; 0 without one."""
    for item in _chain(strategy):
        z = getattr(item, "noise_multiplier", None)
        if z is not None:
            return float(z)
    return 0.0


def find_metric(record: Mapping[str, Any] | None, word: str) -> float | None:
    """The first scalar metric whose key contains ``word`` (``loss``, ``acc``)."""
    for key, value in (record or {}).items():
        if word in key.lower() and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value) if np.isfinite(value) else None
    return None


def final_metrics(
    result: Any, num_rounds: int, stopped_at_round: int | None = None
) -> dict[str, float]:
    """Accuracy and loss of the final model: the ServerApp's ``evaluate_fn`` if it ran, else the
    clients' aggregated evaluation of the last round. Stopped on alarm after round ``s``: the
    model stays that of round ``s``, which ``evaluate_fn`` evaluates at every later round too."""
    out: dict[str, float] = {}
    stopped = num_rounds if stopped_at_round is None else int(stopped_at_round)
    for source, rounds in (
        ("evaluate_metrics_serverapp", (num_rounds, stopped)),
        ("evaluate_metrics_clientapp", (stopped,)),
    ):
        records = getattr(result, source, {})
        record = next((records[t] for t in rounds if t in records), None)
        for name, word in (("accuracy", "acc"), ("loss", "loss")):
            value = find_metric(record, word)
            if name not in out and value is not None and (name != "accuracy" or 0 <= value <= 1):
                out[name] = value
    return out
