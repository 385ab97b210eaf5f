"""Round reporting: the one path of round data from the ServerApp to the auditor.

:class:`RoundReporter` is the interface (docs/architecture.md). Per round it carries the released
aggregate ``rho_bar_t`` (the noisy average DP-FedAvg releases, before the server optimizer; a
wrapper that sees only the new model sends the delta of the aggregated model) with its
:class:`RoundMetadata`, including the round's canary participants. :class:`.http_reporter.HttpRoundReporter`
PUTs raw little-endian float32 (then int32 participant indices) to the service's ingest routes;
:class:`LocalRoundReporter` feeds an in-process :class:`flaudit.auditor.statistics.CosineTracker` and the
known-rounds statistic (``flaudit run`` and tests).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from ..auditor.canaries import CanaryFamily, seen_mask
from ..auditor.claims.known_rounds import KnownRoundsStatistic
from ..auditor.noise_calibration import noise_clip_factor, signal_factor
from ..auditor.statistics import CosineTracker
from ..auditor.validation import check_at_least

__all__ = [
    "RoundMetadata",
    "RoundReporter",
    "LocalRoundReporter",
    "ReportingError",
    "participant_mask",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoundMetadata:
    """What the auditor gets with each round's released aggregate (no seed).

    ``participants`` are the canary indices "in" the round: the seen canaries inserted and the
    unseen canaries whose rounds (drawn by the same schedule, never inserted) include it, merged
    and sorted (:func:`flaudit.auditor.schedules.canary_participants`). The list does not reveal which
    canaries are seen, but it is secret data all the same: kept out of ``repr`` and of the query.
    """

    clip_norm: float
    cohort_size: int  # real clients that returned an update + canaries inserted
    num_canaries_inserted: int
    num_failures: int
    clipped_fraction: float
    noise_stddev: float
    train_loss: float | None = None
    accuracy: float | None = None
    participants: tuple[int, ...] | None = field(default=None, repr=False)
    # largest reply weight x replies / total weight (CanaryAuditStrategy; 1: equal weights):
    # above 1 the weighting, not the noise, gives a client more than the calibrated C/n
    weight_factor: float | None = None
    # the clip norm the noise was calibrated for (Flower's adaptive wrappers: the norm after
    # its geometric update, not clip_norm, the one the updates were clipped to; issue #38)
    noise_clip_norm: float | None = None

    def as_query(self) -> dict[str, float | int]:
        """Query parameters of the ingest route (``num_participants`` instead of the list)."""
        query = {k: v for k, v in asdict(self).items() if v is not None and k != "participants"}
        if self.participants is not None:
            query["num_participants"] = len(self.participants)
        return query


@runtime_checkable
class RoundReporter(Protocol):
    def report_initial(self, initial_model: np.ndarray) -> None: ...

    def report_round(
        self, server_round: int, update: np.ndarray, metadata: RoundMetadata
    ) -> None: ...

    def report_final(self, final_model: np.ndarray, metrics: dict[str, float]) -> None: ...


def participant_mask(participants, num_canaries: int) -> np.ndarray:
    """Boolean mask of length ``num_canaries`` from a list of participant indices.

    Raises
    ------
    ValueError
        Naming ``participants`` for a negative, out-of-range or repeated index.
    """
    indices = np.asarray(participants, dtype=np.int64).reshape(-1)
    if indices.size:
        if indices.min() < 0:
            raise ValueError(f"participants: negative canary index {int(indices.min())}")
        if indices.max() >= num_canaries:
            raise ValueError(
                f"participants: canary index {int(indices.max())} out of range (k={num_canaries})"
            )
        if np.unique(indices).size != indices.size:
            raise ValueError("participants: a canary index is listed twice")
    mask = np.zeros(num_canaries, dtype=bool)
    mask[indices] = True
    return mask


def _held_bytes(block: np.ndarray) -> int:
    """Memory a canary block holds (a broadcast block holds one row)."""
    if block.ndim == 2 and block.shape[0] > 1 and block.strides[0] == 0:
        return int(block[0].nbytes)
    return int(block.nbytes)


class ReportingError(RuntimeError):
    """The auditor rejected round data, or (``on_service_error="stop"``) could not be reached."""


class ServiceUnreachable(Exception):
    """Connection error or 5xx after the attempts allowed: the service is away."""

    def __init__(self, problem: str, attempts: int) -> None:
        super().__init__(problem)
        self.problem = problem
        self.attempts = attempts


@dataclass
class LocalRoundReporter:
    """Feeds a :class:`CosineTracker` and the known-rounds statistic in this process.

    Parameters
    ----------
    tracker : CosineTracker
        Tracks every canary (seen and unseen) of the audit.
    null_mask : numpy.ndarray of bool, optional
        The unseen canaries. With it, rounds that carry participants also update
        :attr:`known_rounds` (:meth:`for_audit` sets it from the seed).
    """

    tracker: CosineTracker | None = None
    null_mask: np.ndarray | None = field(default=None, repr=False)
    known_rounds: KnownRoundsStatistic | None = field(default=None, repr=False)
    initial_model: np.ndarray | None = field(default=None, repr=False)
    final_model: np.ndarray | None = field(default=None, repr=False)
    rounds: list[tuple[int, RoundMetadata]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    _lazy: tuple[int, int, CanaryFamily | None] | None = field(default=None, repr=False)

    @classmethod
    def for_audit(
        cls,
        *,
        canary_seed: int,
        num_canaries: int,
        canary_family: CanaryFamily | str | None = None,
    ) -> LocalRoundReporter:
        """A reporter whose tracker is created when ``theta_0`` (hence ``d``) arrives.

        ``canary_family`` is the spec's (``None``: the default rule of
        :func:`flaudit.auditor.canaries.resolve_canary_family`, as the ServerApp applies it).
        """
        check_at_least(num_canaries, "num_canaries", 1)
        family = None if canary_family is None else CanaryFamily(canary_family)
        return cls(
            tracker=None,
            null_mask=~seen_mask(canary_seed, int(num_canaries)),
            _lazy=(canary_seed, int(num_canaries), family),
        )

    def report_initial(self, initial_model: np.ndarray) -> None:
        self.initial_model = np.array(initial_model, dtype=np.float32)
        if self.tracker is None:
            if self._lazy is None:
                raise ValueError("tracker is required (or use LocalRoundReporter.for_audit)")
            seed, k, family = self._lazy
            self.tracker = CosineTracker(seed, k, int(self.initial_model.shape[0]), family=family)

    def report_round(self, server_round: int, update: np.ndarray, metadata: RoundMetadata) -> None:
        expected = len(self.rounds) + 1
        if server_round != expected:
            raise ValueError(f"server_round must be {expected}, got {server_round}")
        round_cosines = self.tracker.update(np.asarray(update, dtype=np.float32))
        if self.null_mask is not None and metadata.participants is not None:
            k = self.tracker.num_canaries
            if self.known_rounds is None:
                self.known_rounds = KnownRoundsStatistic(
                    k, dim=self.tracker.dim, scale_dof=self.tracker.scale_dof
                )
            self.known_rounds.update(
                round_cosines,
                participant_mask(metadata.participants, k),
                self.null_mask,
                # the round's own signal under the claim (issue #38): its weight over its
                # noise's clip-norm factor; 1 for equal weights and matched noise
                factor=signal_factor(
                    metadata.weight_factor,
                    noise_clip_factor(metadata.clip_norm, metadata.noise_clip_norm),
                ),
            )
        self.rounds.append((server_round, metadata))

    def report_final(self, final_model: np.ndarray, metrics: dict[str, float]) -> None:
        if self.initial_model is None:
            raise ValueError("report_initial must be called before report_final")
        self.final_model = np.array(final_model, dtype=np.float32)
        self.tracker.finalize(self.final_model, self.initial_model)
        self.metrics = dict(metrics)
