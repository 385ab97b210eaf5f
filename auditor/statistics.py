"""Streaming cosine statistics between canaries and model updates.

Per round ``t`` the auditor needs ``cos(c_j, Delta_t)`` for every canary and keeps the running
maximum over rounds (Andrew et al. Alg. 3); at the end it needs ``cos(c_j, theta_T - theta_0)``
(Alg. 2) and ``cos(c_j, theta_T)`` (Alg. 2 as literally written). :class:`CosineTracker` does
this for either canary family (:class:`flaudit.auditor.canaries.CanaryFamily`):

- ``orthogonal``: all ``k`` cosines are coordinates of one fast transform ``R^T v``: two or three DCTs
  per vector whatever ``k``, memory ``O(d + k)``. The cosines are *null-standardized*: each
  canary coordinate is divided by the noise scale ``s`` measured on the ``d - k`` coordinates
  of ``R^T v`` that no canary touches, instead of by ``||v||``, and reported as the cosine of
  equal probability (:func:`null_standardized_cosines`). Without it the seen canaries' own
  energy in ``||v||`` shrinks every cosine by ``sqrt(1 - canary energy / ||v||^2)`` and the
  estimate measures the effective noise ``sqrt(sigma^2 + k/d)`` (the interference of Keinan et
  al. through the normalisation); with it an absent canary's statistic follows the cosine null
  ``F_d`` exactly (for a random basis) and a seen canary's is its signal over the noise
  (docs/estimators.md). Every canary of one release shares ``s``; the claim tests account for
  that (:func:`scale_dof`);
- ``gaussian``: canaries regenerated chunk by chunk (memory ``O(chunk_size * d + k)``, ``k d``
  normal draws per vector), or a bank kept in memory when the caller grants a byte budget
  (``cache_bytes``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .canaries import CanaryFamily, OrthogonalCanaries, canary_vectors, resolve_canary_family
from .estimators.null import cosine_equivalent
from .transform import CHUNK, is_torch_tensor, map_chunks, sum_of_squares, torch
from .validation import check_at_least, check_integer_at_least

__all__ = ["cosines", "null_standardized_cosines", "scale_dof", "CosineTracker", "TrackerState"]


def _all_finite(array, workers: int = 1) -> bool:
    """Chunk by chunk (on ``workers`` threads): no ``d``-sized boolean temporary."""
    if is_torch_tensor(array):
        step = CHUNK * 16 if array.device.type == "cuda" else CHUNK
        return all(
            bool(torch.isfinite(array[a : a + step]).all()) for a in range(0, array.shape[0], step)
        )
    return all(
        map_chunks(
            array.shape[0], lambda a, b: bool(np.isfinite(array[a:b]).all()), workers=workers
        )
    )


def _as_finite_vector(name: str, value, dim: int, workers: int = 1):
    if is_torch_tensor(value):  # kept on its device (the torch back end transforms it there)
        if value.ndim != 1 or value.shape[0] != dim:
            raise ValueError(
                f"{name} must be a vector of length {dim}, got shape {tuple(value.shape)}"
            )
        if not value.is_floating_point():
            raise ValueError(f"{name} must be floating point, got dtype {value.dtype}")
        if not _all_finite(value):
            raise ValueError(f"{name} contains NaN or Inf")
        return value if value.dtype == torch.float32 else value.to(torch.float32)
    array = np.asarray(value)
    if array.ndim != 1 or array.shape[0] != dim:
        raise ValueError(f"{name} must be a vector of length {dim}, got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.floating):
        raise ValueError(f"{name} must be floating point, got dtype {array.dtype}")
    if not _all_finite(array, workers):
        raise ValueError(f"{name} contains NaN or Inf")
    return array.astype(np.float32, copy=False)


def _rescaled(vector: np.ndarray, workers: int = 1) -> np.ndarray:
    """``vector`` times a power of two that brings its largest entry near 1 when it is far from 1.

    Cosines do not depend on scale, and a power of two is exact; without it a finite float32
    vector of values near 3e38 overflows the float32 dot products (and tiny values underflow).
    """
    if is_torch_tensor(vector):
        if vector.numel() == 0 or not vector.is_floating_point():
            return vector
        peak = max(abs(float(vector.max())), abs(float(vector.min())))
        if not math.isfinite(peak) or peak == 0.0:
            return vector
        exponent = math.frexp(peak)[1]
        return (
            torch.ldexp(vector, torch.tensor(-exponent, device=vector.device))
            if abs(exponent) > 32
            else vector
        )
    vector = np.asarray(vector)
    if vector.size == 0 or not np.issubdtype(vector.dtype, np.floating):
        return vector
    if vector.ndim == 1:  # chunk by chunk on the workers' threads; NaN propagates as in max()
        ends = np.array(
            map_chunks(
                vector.shape[0],
                lambda a, b: (vector[a:b].max(), vector[a:b].min()),
                workers=workers,
            ),
            dtype=np.float64,
        )
        peak = float(np.max(np.abs(ends)))
    else:
        peak = max(abs(float(vector.max())), abs(float(vector.min())))  # no |v| temporary
    if not math.isfinite(peak) or peak == 0.0:
        return vector
    exponent = math.frexp(peak)[1]
    return np.ldexp(vector, -exponent) if abs(exponent) > 32 else vector


def cosines(unit_rows: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """Cosines between unit-norm rows and ``vector`` (0 where ``vector`` is zero), float64.

    No BLAS (``np.einsum`` without ``optimize``): this runs on the audit's threads, beside
    whatever BLAS work the process does elsewhere (issue #28)."""
    norm = math.sqrt(sum_of_squares(vector))
    if norm == 0.0:
        return np.zeros(unit_rows.shape[0], dtype=np.float64)
    return np.einsum("ij,j->i", unit_rows, vector).astype(np.float64) / norm


def null_standardized_cosines(projected, positions: np.ndarray, *, workers: int = 1) -> np.ndarray:
    """Orthogonal family: the canaries' statistic from ``y = R^T v`` (float64, in ``[-1, 1]``).

    Each canary coordinate is studentized by the noise scale measured where no canary is,
    ``t_j = y_j / s`` with ``s^2`` the mean square of ``y`` over the ``d - k`` coordinates
    outside ``positions`` (``dof = d - k``), and reported as the cosine with the same
    probability (:func:`flaudit.auditor.estimators.null.cosine_equivalent`): when canary ``j``
    is absent from ``v`` its statistic follows the exact cosine null ``F_d``, and a seen
    canary's is its signal over the noise, not shrunk by the other canaries' energy in
    ``||v||`` (module docstring). Plain cosines ``y[positions] / ||y||`` when there is no such
    coordinate (``k = d``) or ``v`` has no energy there; zeros for ``v = 0``. ``projected`` may
    be a torch tensor (any device): only ``k``-sized values leave it, the sum of squares
    accumulates in float64 chunk by chunk (on ``workers`` threads; the same result).
    """

    dim = projected.shape[0]
    if is_torch_tensor(projected):
        index = torch.as_tensor(positions, device=projected.device)
        dots = projected[index].double().cpu().numpy()
    else:
        dots = projected[positions].astype(np.float64)
    total = sum_of_squares(projected, workers=workers)
    if total == 0.0:
        return np.zeros(dots.shape[0], dtype=np.float64)
    dof = dim - positions.size
    outside = total - float(np.sum(np.square(dots)))
    if dof < 1 or outside <= 1e-12 * total:
        return np.clip(dots / np.sqrt(total), -1.0, 1.0)
    return cosine_equivalent(dots / np.sqrt(outside / dof), dof, dim)


def scale_dof(family: CanaryFamily, *, num_canaries: int, dim: int) -> int:
    """Degrees of freedom of the noise scale behind the canaries' statistics: ``d - k`` for the
    orthogonal family (:func:`null_standardized_cosines`), ``d`` for plain cosines (the Gaussian
    family, or ``k = d``), whose common ``||v||`` has relative spread ``1/sqrt(2 d)`` under
    isotropic noise. The exact claim tests (:mod:`flaudit.auditor.claims.normal_scores`) use
    it: the scale is shared by every canary of a release."""
    if CanaryFamily(family) is CanaryFamily.orthogonal and dim > num_canaries:
        return int(dim) - int(num_canaries)
    return int(dim)


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
    family : CanaryFamily or str, optional
        The canary family; ``None`` (default) applies :func:`flaudit.auditor.canaries.resolve_canary_family`
        (orthogonal where ``k <= d``). Must be the family the canaries were inserted with.
    chunk_size : int, optional
        Gaussian family: canaries regenerated at a time when they are not cached.
    cache_bytes : int, optional
        Gaussian family: byte budget for keeping canaries in memory between rounds. ``0``
        (default) regenerates every chunk each round; ``k * d * 4`` bytes or more caches all.
        The orthogonal family ignores it (it never holds canaries: at most ``16 d`` bytes of signs).
    workers : int, optional
        Threads generating gaussian canaries (default 1) or running the orthogonal family's
        transforms (default 2); results do not depend on it.
    backend : {"auto", "numpy", "torch"}, optional
        Orthogonal family: where the transform runs (:func:`flaudit.auditor.transform.resolve_backend`;
        ``"auto"``: torch on CUDA when the update is a CUDA tensor or a GPU is available, else the
        CPU back end measured faster). Results agree to float32 precision. Torch tensors are
        accepted as vectors on every back end.
    """

    def __init__(
        self,
        seed: int,
        num_canaries: int,
        dim: int,
        *,
        family: CanaryFamily | str | None = None,
        chunk_size: int = 64,
        cache_bytes: int = 0,
        state: TrackerState | None = None,
        workers: int | None = None,
        backend: str = "auto",
    ) -> None:
        check_at_least(num_canaries, "num_canaries", 1)
        check_at_least(dim, "dim", 2)
        check_at_least(chunk_size, "chunk_size", 1)
        if cache_bytes < 0:
            raise ValueError("cache_bytes must be >= 0")
        if workers is not None:
            check_integer_at_least(workers, "workers", 1)
        self.num_canaries = int(num_canaries)
        self.dim = int(dim)
        self.family = resolve_canary_family(family, num_canaries=self.num_canaries, dim=self.dim)
        self.chunk_size = int(chunk_size)
        self._bank = None
        self._num_cached = 0
        self._orthogonal = None
        if self.family is CanaryFamily.orthogonal:
            self._orthogonal = OrthogonalCanaries(seed, self.dim, workers=workers, backend=backend)
            self._positions = self._orthogonal.positions(np.arange(self.num_canaries))
            self.workers = self._orthogonal.workers
        else:
            self.workers = 1 if workers is None else int(workers)
            self._seed = seed
            cached = min(self.num_canaries, cache_bytes // (4 * self.dim))
            if cached:
                self._bank = canary_vectors(
                    seed, np.arange(cached), self.dim, family=self.family, workers=self.workers
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

    @property
    def scale_dof(self) -> int:
        """Degrees of freedom of the noise scale the statistics share (:func:`scale_dof`)."""
        return scale_dof(self.family, num_canaries=self.num_canaries, dim=self.dim)

    def __repr__(self) -> str:  # never show the seed
        return (
            f"CosineTracker(num_canaries={self.num_canaries}, dim={self.dim}, "
            f"family={self.family.value}, num_rounds={self._state.num_rounds}, "
            f"cached={self._num_cached})"
        )

    # -- core -----------------------------------------------------------------------------
    def all_cosines(self, vector, *, consume: bool = False) -> np.ndarray:
        """Cosines of every canary with ``vector`` (shape ``(k,)``, float64).

        ``consume=True``: ``vector`` (a writable float32 numpy array) may be overwritten, the
        orthogonal family's transform then runs in it without a working copy.

        Orthogonal family: null-standardized cosines (module docstring), clipped to ``[-1, 1]``;
        plain cosines when ``vector`` lies in the span of the seen canaries.
        """
        vector = _as_finite_vector(
            "vector", _rescaled(vector, self.workers), self.dim, self.workers
        )
        if self._orthogonal is not None:  # numpy or torch back end, chosen per call
            return null_standardized_cosines(
                self._orthogonal.transpose_apply(vector, consume=consume),
                self._positions,
                workers=self.workers,
            )
        if is_torch_tensor(vector):
            vector = vector.detach().cpu().numpy()
        out = np.empty(self.num_canaries, dtype=np.float64)
        if self._bank is not None:
            out[: self._num_cached] = cosines(self._bank, vector)
        for start in range(self._num_cached, self.num_canaries, self.chunk_size):
            stop = min(start + self.chunk_size, self.num_canaries)
            block = canary_vectors(
                self._seed,
                np.arange(start, stop),
                self.dim,
                family=self.family,
                workers=self.workers,
            )
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
