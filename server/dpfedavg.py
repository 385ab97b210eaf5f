"""DP-FedAvg aggregation math (pure numpy): clip, insert canaries, sum, noise, server step.

Round ``t`` with clip norm ``S(t)``, noise multiplier ``z`` and calibration cohort size ``m``::

    rho    = sum_i clip(Delta_i, S(t)) + sum_{scheduled seen canaries j} S(t) * c_j
    update = (rho + N(0, (z S(t))^2 I)) / m          # uniform weights, never example counts
    v      = momentum * v + update
    Delta_t = learning_rate * v;  theta_t = theta_{t-1} + Delta_t

``m`` is the cohort size used in the noise calibration (``AuditSpec.clients_per_round``), not the
number of updates that arrived, so the sensitivity of ``update`` is ``S(t) / m`` whatever the
participation. Adaptive clipping follows Andrew et al. (2021): the server tracks the
``target_quantile`` of the update norms geometrically, from a noised count of unclipped updates.

``update`` is the *released* noisy aggregate: the one vector of the round that the DP guarantee
covers, and what the server reports to the auditor for the per-round cosines (the server
optimizer's ``Delta_t`` mixes rounds under momentum). A deliberate bug
(:class:`flaudit.auditor.bugs.InjectedBug`, testing only) changes the noise or the clipping here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..auditor.bugs import DPBug, InjectedBug
from ..auditor.validation import check_at_least, check_positive

__all__ = [
    "clip_update",
    "canary_update",
    "RoundAggregate",
    "aggregate_round",
    "ServerOptimizer",
    "AdaptiveClipNorm",
]


def _norm(vector: np.ndarray) -> float:
    vector = vector.astype(np.float64, copy=False)
    return float(np.sqrt(np.einsum("i,i->", vector, vector)))  # no BLAS (issue #28)


def clip_update(update: np.ndarray, clip_norm: float) -> tuple[np.ndarray, float]:
    """Scale ``update`` to norm at most ``clip_norm``; return ``(clipped float64, original norm)``."""
    check_positive(clip_norm, "clip_norm")
    update = np.asarray(update, dtype=np.float64)
    norm = _norm(update)
    if norm > clip_norm:
        return update * (clip_norm / norm), norm
    return update, norm


def canary_update(direction: np.ndarray, clip_norm: float) -> np.ndarray:
    """``S(t) * c_j`` in float64, renormalized so its norm is ``clip_norm`` to float64 precision.

    A canary acts like a client whose (clipped) update has the full clip norm (Proj in
    Andrew et al. Alg. 2).
    """
    check_positive(clip_norm, "clip_norm")
    direction = np.asarray(direction, dtype=np.float64)
    norm = _norm(direction)
    if norm == 0.0:
        raise ValueError("direction must be non-zero")
    return direction * (clip_norm / norm)


@dataclass(frozen=True)
class RoundAggregate:
    """Result of one round's aggregation.

    Attributes
    ----------
    update : numpy.ndarray
        ``(rho + noise) / m`` (float64): the released aggregate, what the server optimizer
        consumes and what the auditor's per-round cosines are computed on.
    clipped_sum : numpy.ndarray
        ``rho`` without noise (float64; for tests and diagnostics, never reported).
    noise_stddev : float
        ``z * S(t)`` (per coordinate, on the sum): what the implementation claims, also when an
        injected bug changes the noise actually added.
    num_clients, num_canaries : int
        Real updates and canaries that went into ``rho``.
    num_clipped : int
        Real updates whose norm exceeded ``S(t)``.
    """

    update: np.ndarray
    clipped_sum: np.ndarray
    noise_stddev: float
    num_clients: int
    num_canaries: int
    num_clipped: int

    @property
    def clipped_fraction(self) -> float:
        return self.num_clipped / self.num_clients if self.num_clients else 0.0


def aggregate_round(
    *,
    client_updates: Sequence[np.ndarray],
    canary_directions: np.ndarray | Sequence[np.ndarray],
    clip_norm: float,
    noise_multiplier: float,
    expected_cohort_size: int,
    dim: int,
    rng: np.random.Generator,
    bug: InjectedBug | None = None,
    canary_sum: np.ndarray | None = None,
    num_summed_canaries: int = 0,
) -> RoundAggregate:
    """Clip, add canaries, sum, add Gaussian noise, divide by ``m``.

    Parameters
    ----------
    client_updates : sequence of numpy.ndarray
        Real clients' model deltas (length ``dim`` each).
    canary_directions : array of shape (c, dim) or sequence of vectors
        Unit directions of the seen canaries scheduled this round.
    canary_sum : numpy.ndarray, optional
        Alternatively (or in addition), the sum of ``num_summed_canaries`` unit canary
        directions (:func:`flaudit.auditor.canaries.canary_sum`: one fast transform for the orthogonal
        family); added times ``S(t)``, as that many clipped canary updates.
    num_summed_canaries : int
        How many canaries ``canary_sum`` holds.
    clip_norm : float
        ``S(t) > 0``.
    noise_multiplier : float
        ``z >= 0``; the noise standard deviation on the sum is ``z * S(t)``.
    expected_cohort_size : int
        ``m >= 1`` used in the calibration (divides the noisy sum).
    dim : int
        Model dimension ``d``.
    rng : numpy.random.Generator
        Source of the DP noise.
    bug : InjectedBug, optional
        Testing only: ``no_noise``, ``noise_scale`` (noise std times ``factor``),
        ``noise_divided_twice`` (noise std divided by ``m`` once more) or ``no_clipping`` (real
        updates not clipped, canaries of norm ``factor * S(t)``). Other kinds act elsewhere
        (``extra_participation``: the schedule) and leave the aggregation alone.

    Raises
    ------
    ValueError
        Naming the bad argument.
    """
    if not clip_norm > 0 or not math.isfinite(clip_norm):
        raise ValueError(f"clip_norm must be a finite number > 0, got {clip_norm}")
    if noise_multiplier < 0 or not math.isfinite(noise_multiplier):
        raise ValueError(f"noise_multiplier must be a finite number >= 0, got {noise_multiplier}")
    check_at_least(expected_cohort_size, "expected_cohort_size", 1)
    kind = bug.kind if bug is not None else DPBug.none
    total = np.zeros(dim, dtype=np.float64)
    num_clipped = 0
    for index, update in enumerate(client_updates):
        update = np.asarray(update)
        if update.shape != (dim,):
            raise ValueError(f"client_updates[{index}] has shape {update.shape}, expected ({dim},)")
        if not np.all(np.isfinite(update)):
            raise ValueError(f"client_updates[{index}] contains NaN or Inf")
        clipped, norm = clip_update(update, clip_norm)
        num_clipped += int(norm > clip_norm)
        total += np.asarray(update, dtype=np.float64) if kind is DPBug.no_clipping else clipped
    canary_norm = clip_norm * bug.factor if kind is DPBug.no_clipping else clip_norm
    num_canaries = 0
    if canary_sum is not None:
        canary_sum = np.asarray(canary_sum, dtype=np.float64)
        if canary_sum.shape != (dim,):
            raise ValueError(f"canary_sum has shape {canary_sum.shape}, expected ({dim},)")
        check_at_least(num_summed_canaries, "num_summed_canaries", 0)
        total += canary_norm * canary_sum
        num_canaries += int(num_summed_canaries)
    for direction in canary_directions:
        total += canary_update(direction, canary_norm)
        num_canaries += 1
    stddev = float(noise_multiplier * clip_norm)
    added = stddev
    if kind is DPBug.no_noise:
        added = 0.0
    elif kind is DPBug.noise_scale:
        added = stddev * bug.factor
    elif kind is DPBug.noise_divided_twice:
        added = stddev / expected_cohort_size
    noisy = total + added * rng.standard_normal(dim) if added > 0 else total.copy()
    return RoundAggregate(
        update=noisy / expected_cohort_size,
        clipped_sum=total,
        noise_stddev=stddev,
        num_clients=len(client_updates),
        num_canaries=num_canaries,
        num_clipped=num_clipped,
    )


class ServerOptimizer:
    """Server SGD with optional (heavy-ball) momentum.

    Parameters
    ----------
    learning_rate : float
        ``eta > 0``.
    momentum : float
        ``0 <= beta < 1``.
    """

    def __init__(self, *, learning_rate: float = 1.0, momentum: float = 0.0) -> None:
        check_positive(learning_rate, "learning_rate")
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.learning_rate = float(learning_rate)
        self.momentum = float(momentum)
        self._velocity: np.ndarray | None = None

    def step(self, model: np.ndarray, update: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(theta_t, Delta_t)`` as float32 with ``theta_t = model + Delta_t`` exactly."""
        update = np.asarray(update, dtype=np.float64)
        if self._velocity is None or self.momentum == 0.0:
            self._velocity = update
        else:
            self._velocity = self.momentum * self._velocity + update
        delta = (self.learning_rate * self._velocity).astype(np.float32)
        new_model = (np.asarray(model, dtype=np.float32) + delta).astype(np.float32)
        # Report the delta actually applied in float32 arithmetic.
        return new_model, new_model - np.asarray(model, dtype=np.float32)


class AdaptiveClipNorm:
    """Quantile-tracking clip norm with a noised unclipped count (Andrew et al. 2021).

    ``S <- S * exp(-learning_rate * (b_noisy - target_quantile))`` where ``b_noisy`` is the
    fraction of real updates with norm ``<= S`` plus ``N(0, count_stddev^2) / expected_count``.

    Parameters
    ----------
    initial_clip_norm : float
        ``S(0) > 0``.
    target_quantile : float
        ``gamma`` in ``(0, 1)``.
    learning_rate : float
        ``eta_C > 0``.
    count_stddev : float
        Noise std of the unclipped count (``>= 0``).
    """

    def __init__(
        self,
        *,
        initial_clip_norm: float,
        target_quantile: float = 0.5,
        learning_rate: float = 0.2,
        count_stddev: float = 0.0,
    ) -> None:
        check_positive(initial_clip_norm, "initial_clip_norm")
        if not 0 < target_quantile < 1:
            raise ValueError(f"target_quantile must be in (0, 1), got {target_quantile}")
        check_positive(learning_rate, "learning_rate")
        check_at_least(count_stddev, "count_stddev", 0)
        self.clip_norm = float(initial_clip_norm)
        self.target_quantile = float(target_quantile)
        self.learning_rate = float(learning_rate)
        self.count_stddev = float(count_stddev)

    def update(
        self, *, num_unclipped: int, expected_count: float, rng: np.random.Generator
    ) -> float:
        """Move the clip norm towards the target quantile; return the new ``S``."""
        if expected_count <= 0:
            raise ValueError(f"expected_count must be > 0, got {expected_count}")
        noise = self.count_stddev * rng.standard_normal() if self.count_stddev > 0 else 0.0
        fraction = (num_unclipped + noise) / expected_count
        self.clip_norm *= math.exp(-self.learning_rate * (fraction - self.target_quantile))
        return self.clip_norm
