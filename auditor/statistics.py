"""Streaming cosine statistics between canaries and model updates.

Per round ``t`` the auditor needs ``cos(c_j, Delta_t)`` for every canary and keeps the running
maximum over rounds (Andrew et al. Alg. 3); at the end it needs ``cos(c_j, theta_T - theta_0)``
(Alg. 2) and ``cos(c_j, theta_T)`` (Alg. 2 as literally written). :class:`CosineTracker` does
this in memory ``O(chunk_size * d + k)`` by regenerating canaries chunk by chunk, or keeps a
bank of canaries in memory when the caller grants a byte budget (``cache_bytes``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from auditor.canaries import canary_vectors
from auditor.validation import check_at_least, check_integer_at_least

__all__ = ["cosines", "CosineTracker", "TrackerState"]


def _as_finite_vector(name: str, value: np.ndarray, dim: int) -> np.ndarray:
    array = np.asarray(value)
    if array.ndim != 1 or array.shape[0] != dim:
        raise ValueError(f"{name} must be a vector of length {dim}, got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.floating):
        raise ValueError(f"{name} must be floating point, got dtype {array.dtype}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} contains NaN or Inf")
    return array.astype(np.float32, copy=False)


def _rescaled(vector: np.ndarray) -> np.ndarray:
    """``vector`` times a power of two that brings its largest entry near 1 when it is far from 1.

    Cosines do not depend on scale, and a power of two is exact; without it a finite float32
    vector of values near 3e38 overflows the float32 dot products (and tiny values underflow).
    """
    vector = np.asarray(vector)
    if vector.size == 0 or not np.issubdtype(vector.dtype, np.floating):
        return vector
    peak = float(np.max(np.abs(vector)))
    if not math.isfinite(peak) or peak == 0.0:
        return vector
    exponent = math.frexp(peak)[1]
    return np.ldexp(vector, -exponent) if abs(exponent) > 32 else vector


def cosines(unit_rows: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """Cosines between unit-norm rows and ``vector`` (0 where ``vector`` is zero), float64."""
    norm = float(np.sqrt(np.sum(np.square(vector), dtype=np.float64)))
    if norm == 0.0:
        return np.zeros(unit_rows.shape[0], dtype=np.float64)
    return (unit_rows @ vector).astype(np.float64) / norm


@dataclass
class TrackerState:
    """Everything needed to resume a :class:`CosineTracker` (no canary vectors, no seed)."""

    num_rounds: int
    max_cosines: np.ndarray  # (k,), -inf before the first round
    last_cosines: np.ndarray  # (k,), cosines of the latest round
    final_cosines: np.ndarray | None = None  # (k,), cos(c_j, theta_T - theta_0)
    final_model_cosines: np.ndarray | None = None  # (k,), cos(c_j, theta_T)


class CosineTracker:
    """Running canary statistics for one audit.

    Parameters
    ----------
    seed : int
        Secret master seed of the audit (kept private; never part of :meth:`state`).
    num_canaries : int
        Number of canaries ``k`` (seen and unseen alike; all are tracked).
    dim : int
        Model dimension ``d``.
    chunk_size : int, optional
        Canaries regenerated at a time when they are not cached.
    cache_bytes : int, optional
        Byte budget for keeping canaries in memory between rounds. ``0`` (default) regenerates
        every chunk each round; a budget of ``k * d * 4`` bytes or more caches all canaries.
    workers : int, optional
        Threads used to generate canaries (bank and regenerated chunks); results do not depend
        on it. Default 1.
    """

    def __init__(
        self,
        seed: int,
        num_canaries: int,
        dim: int,
        *,
        chunk_size: int = 64,
        cache_bytes: int = 0,
        state: TrackerState | None = None,
        workers: int = 1,
    ) -> None:
        check_at_least(num_canaries, "num_canaries", 1)
        check_at_least(dim, "dim", 2)
        check_at_least(chunk_size, "chunk_size", 1)
        if cache_bytes < 0:
            raise ValueError("cache_bytes must be >= 0")
        check_integer_at_least(workers, "workers", 1)
        self.workers = workers
        self._seed = seed
        self.num_canaries = int(num_canaries)
        self.dim = int(dim)
        self.chunk_size = int(chunk_size)
        cached = min(self.num_canaries, cache_bytes // (4 * self.dim))
        self._bank = (
            canary_vectors(seed, np.arange(cached), self.dim, workers=workers) if cached else None
        )
        self._num_cached = int(cached)
        if state is None:
            state = TrackerState(
                num_rounds=0,
                max_cosines=np.full(self.num_canaries, -np.inf),
                last_cosines=np.zeros(self.num_canaries),
            )
        elif state.max_cosines.shape != (self.num_canaries,):
            raise ValueError("state does not match num_canaries")
        self._state = state

    def __repr__(self) -> str:  # never show the seed
        return (
            f"CosineTracker(num_canaries={self.num_canaries}, dim={self.dim}, "
            f"num_rounds={self._state.num_rounds}, cached={self._num_cached})"
        )

    # -- core -----------------------------------------------------------------------------
    def all_cosines(self, vector: np.ndarray) -> np.ndarray:
        """Cosines of every canary with ``vector`` (shape ``(k,)``, float64)."""
        vector = _as_finite_vector("vector", _rescaled(vector), self.dim)
        out = np.empty(self.num_canaries, dtype=np.float64)
        if self._bank is not None:
            out[: self._num_cached] = cosines(self._bank, vector)
        for start in range(self._num_cached, self.num_canaries, self.chunk_size):
            stop = min(start + self.chunk_size, self.num_canaries)
            block = canary_vectors(self._seed, np.arange(start, stop), self.dim, workers=self.workers)
            out[start:stop] = cosines(block, vector)
        return out

    def update(self, delta: np.ndarray) -> np.ndarray:
        """Ingest one round's model delta; return this round's cosines."""
        round_cosines = self.all_cosines(delta)
        np.maximum(self._state.max_cosines, round_cosines, out=self._state.max_cosines)
        self._state.last_cosines = round_cosines
        self._state.num_rounds += 1
        return round_cosines

    def finalize(self, final_model: np.ndarray, initial_model: np.ndarray) -> None:
        """Compute the final-model statistics from ``theta_T`` and ``theta_0``."""
        final_model = _as_finite_vector("final_model", final_model, self.dim)
        initial_model = _as_finite_vector("initial_model", initial_model, self.dim)
        self._state.final_cosines = self.all_cosines(final_model.astype(np.float64) - initial_model)
        self._state.final_model_cosines = self.all_cosines(final_model)

    # -- accessors ------------------------------------------------------------------------
    @property
    def num_rounds(self) -> int:
        return self._state.num_rounds

    @property
    def max_cosines(self) -> np.ndarray:
        return self._state.max_cosines.copy()

    @property
    def final_cosines(self) -> np.ndarray | None:
        fc = self._state.final_cosines
        return None if fc is None else fc.copy()

    @property
    def final_model_cosines(self) -> np.ndarray | None:
        fc = self._state.final_model_cosines
        return None if fc is None else fc.copy()

    def state(self) -> TrackerState:
        """A copy of the resumable state (contains no seed and no canary vectors)."""
        s = self._state
        return TrackerState(
            num_rounds=s.num_rounds,
            max_cosines=s.max_cosines.copy(),
            last_cosines=s.last_cosines.copy(),
            final_cosines=None if s.final_cosines is None else s.final_cosines.copy(),
            final_model_cosines=None
            if s.final_model_cosines is None
            else s.final_model_cosines.copy(),
        )
