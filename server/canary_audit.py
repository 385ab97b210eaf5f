"""The core both strategy wrappers share (:class:`CanaryAudit`): the claim declared once, theta_0
reported once, round ``t``'s canaries from the one source, the cohort slots they take, the
weight a canary reply carries, the numbers of a canary reply (:func:`canary_models`,
:func:`canary_metrics`) and of the round's report (:meth:`CanaryAudit.round_metadata`), the
round's participants.

:class:`flaudit.server.wrapper.CanaryAuditStrategy` (Message API) and
:class:`flaudit.server.legacy.LegacyCanaryAuditStrategy` (``flwr.server.strategy``) are shells
over it that translate between their Flower API (messages or ``FitRes``) and these steps; the
schedule behind the canaries is :func:`flaudit.auditor.schedules.audit_canary_plan`, kept by the
service (or by a local source made from the seed).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from logging import ERROR, INFO
from typing import Any

import numpy as np
from flwr.common.logger import log
from flwr.supercore.differential_privacy import KEY_NORM_BIT

from ..auditor.claims.verdict import WEIGHTING_TOLERANCE
from ..auditor.validation import check_positive
from .audit_notes import design_line, refusal_line
from .http_reporter import ReportingError
from .noise_calibration import NoiseCalibration, split_sentence
from .reporting import RoundMetadata, RoundReporter
from .strategies import (
    current_clip_norm,
    current_noise_multiplier,
    find_metric,
    read_claim,
    warn_weighting,
    weighted_mean_value,
)

__all__ = ["CanaryAudit", "canary_metrics", "canary_models", "update_norms"]


def update_norms(current: np.ndarray, models: Iterable[np.ndarray]) -> np.ndarray:
    """The norm of each real reply's update ``model - theta_{t-1}`` (float64), taken before the
    wrapped strategy aggregates (a DP wrapper clips the replies in place)."""
    return np.asarray(
        [np.linalg.norm((np.asarray(model) - current).astype(np.float64)) for model in models],
        dtype=np.float64,
    )


def canary_models(current: np.ndarray, block: np.ndarray, clip_norm: float) -> Iterator[np.ndarray]:
    """Each canary reply's model ``theta_{t-1} + S(t) c_j`` (float32), one at a time: ``block``
    holds the round's canaries per unit of clip norm (:meth:`CanaryAudit.round_canaries`)."""
    for direction in block:
        yield (current + clip_norm * direction).astype(np.float32)


def canary_metrics(
    columns: Mapping[str, list],
    weights: np.ndarray,
    *,
    weight_key: str | None = None,
    weight: float = 1.0,
) -> dict[str, Any]:
    """The metrics a canary reply carries, from the real replies' ``columns`` (key: the values
    of the replies that have it, in the order of ``weights``, one weight per real reply).

    ``weight_key``: ``weight`` (the canary's, in the metric's type); adaptive clipping's norm
    bit: 0 (a canary has norm ``S(t)``, so it is not clipped); a column every reply has and
    that holds numbers: its weighted mean, in its own type; any other key is left out.
    """
    out: dict[str, Any] = {}
    for key, column in columns.items():
        first = column[0]
        if key == weight_key:
            out[key] = type(first)(weight)
        elif key == KEY_NORM_BIT:
            out[key] = type(first)(0)
        elif len(column) == len(weights) and all(
            isinstance(v, (int, float, list, tuple)) and not isinstance(v, bool) for v in column
        ):
            out[key] = weighted_mean_value(column, weights)
    return out


class CanaryAudit:
    """One run's audit state, whatever Flower API the wrapped strategy speaks.

    Parameters
    ----------
    reporter : RoundReporter
        Where the claim, theta_0, the rounds and theta_T go (and, for an external audit, where
        the canaries come from: ``round_canaries(t)``).
    canaries : object, optional
        A local canary source: ``round_canaries(t, dim)`` (unit vectors ``(c, dim)``) and
        optionally ``participants(t)``; or, for a strategy that takes the round's sum,
        ``round_sum(t, dim)`` (:class:`flaudit.server.canary_sums.CanarySums`).
    clip_norm : float, optional
        The clip norm of a strategy without a Flower DP wrapper.
    wrapper_hint : str
        The Flower DP wrapper to name when neither gives a clip norm.
    """

    def __init__(
        self,
        strategy: Any,
        reporter: RoundReporter,
        *,
        canaries: Any = None,
        clip_norm: float | None = None,
        wrapper_hint: str = "DifferentialPrivacyServerSideFixedClipping",
    ) -> None:
        if clip_norm is not None:
            check_positive(clip_norm, "clip_norm")
        if clip_norm is None and current_clip_norm(strategy) is None:
            raise ValueError(
                "clip_norm: the wrapped strategy has no Flower DP wrapper to read the clipping "
                f"norm from; wrap it in {wrapper_hint} (or another DP wrapper), or pass "
                "clip_norm= for your own clipping"
            )
        self.strategy = strategy
        self.reporter = reporter
        self.canaries = canaries
        self.fallback_clip_norm = None if clip_norm is None else float(clip_norm)
        self.claimed = False
        self.initial_reported = False
        self.final_reported = False
        #: per round: how many of the sampled clients the canaries displaced (sent nothing)
        self.displaced: dict[int, int] = {}
        #: per round: largest weight x replies / total weight (1: equal weights); above 1 the
        #: weighting gives the heaviest reply more than the C/n the noise is calibrated for
        self.weight_factors: dict[int, float] = {}
        self._max_weight = 0.0
        self._weighting_warned = False  # the weighting warning: once per run
        self._slot_rng = np.random.default_rng()
        #: per round: the clip norm the updates were clipped to and the one the noise was for
        self.calibration = NoiseCalibration()

    @property
    def clip_norm(self) -> float:
        """``S(t)`` now: the wrapped DP strategy's current clipping norm (adaptive moves it)."""
        norm = current_clip_norm(self.strategy)
        return float(norm if norm is not None else self.fallback_clip_norm)

    def declare(self, *, num_rounds: int, num_nodes: int, **extra: Any) -> dict[str, Any]:
        """Read the claim off the strategy chain and send it to the service (once); log what
        the audit will catch. ``extra``: claim fields the wrapper adds (``stop_on_alarm``, ...).

        Raises
        ------
        ReportingError
            The service refused the claim (logged, naming the audit).
        """
        claim = read_claim(self.strategy, num_rounds=num_rounds, num_nodes=num_nodes)
        if "clip_norm" not in claim and "adaptive_clipping" not in claim:
            claim["clip_norm"] = self.fallback_clip_norm
        claim.update({k: v for k, v in extra.items() if v is not None})
        declare = getattr(self.reporter, "declare_claim", None)
        if declare is not None:
            try:
                declare(claim)
            except ReportingError as error:  # e.g. more canaries than the federation holds
                log(ERROR, refusal_line(getattr(self.reporter, "audit_id", "?"), error))
                raise
        self.claimed = True
        log(
            INFO,
            "flaudit: claim declared: %s, %s, %d of %d nodes per round, %d rounds",
            split_sentence(claim) or f"noise multiplier {claim['noise_multiplier']}",
            f"clip norm {claim['clip_norm']}" if "clip_norm" in claim else "adaptive clipping",
            claim["clients_per_round"],
            claim["num_clients"],
            num_rounds,
        )
        design = design_line(getattr(self.reporter, "claim_ack", None))
        if design is not None:  # what the audit will catch, before round 1
            log(INFO, "%s", design)
        return claim

    def report_initial(self, vector: np.ndarray) -> None:
        """theta_0, once, before round 1 (like the claim: the canaries need it)."""
        if not self.initial_reported:
            self.reporter.report_initial(vector)
            self.initial_reported = True

    def round_canaries(self, server_round: int, dim: int) -> np.ndarray:
        """The round's ``c`` canary replies per unit of clip norm, ``(c, dim)``.

        From the service: ``sum / c`` for each of the ``c`` replies (a read-only broadcast view:
        ``4 d`` bytes fetched and held whatever ``c``); each has norm ``<= 1``, so the wrapped
        strategy's clipping at ``clip_norm`` leaves ``clip_norm * sum / c`` unchanged and the
        ``c`` replies add up to ``clip_norm`` times the canaries' sum, exactly what ``c``
        full-norm canary replies add (docs/estimators.md, "Canary replies from the round's sum").
        From a local source: its unit vectors, renormalised in float64.
        """
        if self.canaries is not None:
            block = np.asarray(
                self.canaries.round_canaries(server_round, dim), dtype=np.float64
            ).reshape(-1, dim)
            return block / np.linalg.norm(block, axis=1, keepdims=True)
        return np.asarray(self.reporter.round_canaries(server_round), dtype=np.float32).reshape(
            -1, dim
        )

    def participants(self, server_round: int) -> tuple[int, ...] | None:
        """Canary indices "in" the round from a local source; None: the service derives them."""
        participants = getattr(self.canaries, "participants", None)
        found = None if participants is None else participants(server_round)
        return None if found is None else tuple(int(j) for j in found)

    def round_metadata(
        self,
        server_round: int,
        *,
        norms: np.ndarray,
        inserted: int,
        num_failures: int,
        clip_norm: float,
        metrics: Mapping[str, Any] | None,
        weight_factor: float | None,
        noise_clip_norm: float | None = None,
    ) -> RoundMetadata:
        """What round ``t`` reports beside its release, computed alike for both wrappers.

        ``norms``: the real replies' update norms (:func:`update_norms`); ``cohort_size``: those
        replies and the ``inserted`` canaries; ``clipped_fraction``: the share of real replies
        with a norm above ``clip_norm`` (what a server-side DP wrapper clips; a client that
        clipped itself counts as not clipped, and a SecAgg+ result carries the aggregate, so
        its norm is the aggregate's); ``noise_stddev``: ``z`` times the norm the noise was
        calibrated for (``noise_clip_norm``: under Flower's adaptive clipping the norm after its
        geometric update, issue #38; else ``S(t)``); ``train_loss``: the aggregated
        ``metrics``' loss.
        """
        real = len(norms)
        return RoundMetadata(
            clip_norm=clip_norm,
            cohort_size=real + int(inserted),
            num_canaries_inserted=int(inserted),
            num_failures=int(num_failures),
            clipped_fraction=float(np.mean(np.asarray(norms) > clip_norm)) if real else 0.0,
            noise_stddev=current_noise_multiplier(self.strategy)
            * (clip_norm if noise_clip_norm is None else noise_clip_norm),
            train_loss=find_metric(metrics, "loss"),
            participants=self.participants(server_round),
            weight_factor=weight_factor,
            noise_clip_norm=noise_clip_norm,
        )

    def take_slots(self, server_round: int, sampled: list, count: int, *, what: str) -> list:
        """``sampled`` less ``count`` items chosen at random: the cohort slots round ``t``'s
        canaries take (``displaced[t]``).

        Raises
        ------
        ValueError
            More canaries than sampled clients, saying what to change (``what``: how the
            strategy samples).
        """
        if count > len(sampled):
            raise ValueError(
                f"round {server_round}: {count} canaries are scheduled but the strategy sampled "
                f"only {len(sampled)} nodes; canaries take cohort slots, so num_sampled_clients "
                f"must match the nodes the strategy samples ({what}), or use fewer canaries"
            )
        self.displaced[server_round] = int(count)
        if count == 0:
            return sampled
        drop = set(self._slot_rng.choice(len(sampled), size=count, replace=False).tolist())
        return [item for i, item in enumerate(sampled) if i not in drop]

    def canary_weight(
        self,
        server_round: int,
        weights: list[float],
        count: int,
        *,
        key: str,
        integer: bool = False,
    ) -> tuple[float, float | None]:
        """The weight each of the round's ``count`` canary replies carries, and the round's
        weight factor.

        Worst case for the claim: a canary weighs what the heaviest client seen so far in the
        run weighs (it could have been sampled into this round); equal weights: exactly the
        clients' weight. The factor ``w_max * replies / sum(w)`` (None without replies) is
        recorded in ``weight_factors[t]``; above ``1 + WEIGHTING_TOLERANCE`` (where the
        verdict too says the weighting breaks the claim), the weighting warning, once per run.
        """
        self._max_weight = max([self._max_weight, *weights])
        weight = self._max_weight if self._max_weight > 0 else 1.0
        if integer:
            weight = float(round(weight))
        total, replies = sum(weights) + count * weight, len(weights) + count
        if total <= 0 or not replies:
            return weight, None
        factor = weight * replies / total
        self.weight_factors[server_round] = factor
        if factor > 1 + WEIGHTING_TOLERANCE and not self._weighting_warned:  # as the verdict
            self._weighting_warned = True
            warn_weighting(server_round, key, factor)
        return weight, factor
