"""The core both strategy wrappers share (:class:`CanaryAudit`): the claim declared once, theta_0
reported once, round ``t``'s canaries from the one source, the cohort slots they take, the
weight a canary reply carries, the round's participants.

:class:`flaudit.server.wrapper.CanaryAuditStrategy` (Message API) and
:class:`flaudit.server.legacy.LegacyCanaryAuditStrategy` (``flwr.server.strategy``) are shells
over it that translate between their Flower API (messages or ``FitRes``) and these steps; the
schedule behind the canaries is :func:`flaudit.auditor.schedules.audit_canary_plan`, kept by the
service (or by a local source made from the seed).
"""

from __future__ import annotations

from logging import ERROR, INFO
from typing import Any

import numpy as np
from flwr.common.logger import log

from ..auditor.validation import check_positive
from .audit_notes import design_line, refusal_line
from .http_reporter import ReportingError
from .noise_calibration import NoiseCalibration, split_sentence
from .reporting import RoundReporter
from .strategies import _current_clip_norm, _warn_weighting, read_claim

__all__ = ["CanaryAudit"]


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

    def __init__(self, strategy: Any, reporter: RoundReporter, *, canaries: Any = None,
                 clip_norm: float | None = None,
                 wrapper_hint: str = "DifferentialPrivacyServerSideFixedClipping") -> None:
        if clip_norm is not None:
            check_positive(clip_norm, "clip_norm")
        if clip_norm is None and _current_clip_norm(strategy) is None:
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
        norm = _current_clip_norm(self.strategy)
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
        log(INFO, "flaudit: claim declared: %s, %s, %d of %d nodes per round, "
            "%d rounds", split_sentence(claim) or f"noise multiplier {claim['noise_multiplier']}",
            f"clip norm {claim['clip_norm']}" if "clip_norm" in claim else "adaptive clipping",
            claim["clients_per_round"], claim["num_clients"], num_rounds)
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
            block = np.asarray(self.canaries.round_canaries(server_round, dim),
                               dtype=np.float64).reshape(-1, dim)
            return block / np.linalg.norm(block, axis=1, keepdims=True)
        return np.asarray(self.reporter.round_canaries(server_round),
                          dtype=np.float32).reshape(-1, dim)

    def participants(self, server_round: int) -> tuple[int, ...] | None:
        """Canary indices "in" the round from a local source; None: the service derives them."""
        participants = getattr(self.canaries, "participants", None)
        found = None if participants is None else participants(server_round)
        return None if found is None else tuple(int(j) for j in found)

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

    def canary_weight(self, server_round: int, weights: list[float], count: int, *, key: str,
                      integer: bool = False) -> tuple[float, float | None]:
        """The weight each of the round's ``count`` canary replies carries, and the round's
        weight factor.

        Worst case for the claim: a canary weighs what the heaviest client seen so far in the
        run weighs (it could have been sampled into this round); equal weights: exactly the
        clients' weight. The factor ``w_max * replies / sum(w)`` (None without replies) is
        recorded in ``weight_factors[t]``; above 1, the weighting warning, once per run.
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
        if factor > 1 + 1e-9 and not self._weighting_warned:
            self._weighting_warned = True
            _warn_weighting(server_round, key, factor)
        return weight, factor
