"""Random canary clients: unit vectors drawn from a counter-based stream.

Canary ``j`` of an audit is ``c_j = z_j / ||z_j||`` with ``z_j ~ N(0, I_d)`` drawn from a
Philox (counter-based) generator keyed by ``(master seed, j)``. Any canary can be regenerated on
its own, in any order and in any chunking, so canaries are never stored. Each canary is secretly
*seen* (inserted into training) or *unseen* (held out) with probability 1/2; the split comes from
its own stream keyed by the master seed.

The master seed is a secret: nothing here prints, logs or returns it.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from auditor.validation import check_at_least, check_integer_at_least

__all__ = [
    "new_master_seed",
    "canary_vector",
    "canary_vectors",
    "iter_canary_chunks",
    "seen_mask",
]

_CANARY_STREAM = 0
_SPLIT_STREAM = 1


def new_master_seed() -> int:
    """Draw a fresh 128-bit secret master seed from the OS entropy pool."""
    return secrets.randbits(128)


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError("seed must be an integer")
    if seed < 0:
        raise ValueError("seed must be non-negative")
    return int(seed)


def _check_dim(dim: int) -> int:
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 2:
        raise ValueError(f"dim must be an integer >= 2, got {dim!r}")
    return int(dim)


def _generator(seed: int, stream: int, index: int = 0) -> np.random.Generator:
    sequence = np.random.SeedSequence(entropy=seed, spawn_key=(stream, index))
    return np.random.Generator(np.random.Philox(sequence))


def canary_vector(seed: int, index: int, dim: int) -> np.ndarray:
    """Return canary ``index`` as a float32 unit vector of length ``dim``.

    Parameters
    ----------
    seed : int
        The audit's secret master seed.
    index : int
        Canary index ``j >= 0``.
    dim : int
        Model dimension ``d >= 2``.

    Returns
    -------
    numpy.ndarray
        Shape ``(dim,)``, dtype float32, Euclidean norm 1 (to float32 precision).
    """
    seed = _check_seed(seed)
    dim = _check_dim(dim)
    check_at_least(index, "index", 0)
    out = np.empty(dim, dtype=np.float32)
    _fill_canary(seed, int(index), out)
    return out


def _fill_canary(seed: int, index: int, out: np.ndarray) -> None:
    """Write canary ``index`` into the float32 vector ``out`` (no validation, no copy)."""
    _generator(seed, _CANARY_STREAM, index).standard_normal(out.shape[0], dtype=np.float32, out=out)
    norm = np.sqrt(np.sum(np.square(out), dtype=np.float64))
    out /= np.float32(norm)


def canary_vectors(
    seed: int, indices: Sequence[int] | np.ndarray, dim: int, *, workers: int = 1
) -> np.ndarray:
    """Return the canaries ``indices`` stacked as a float32 array of shape ``(len(indices), dim)``.

    ``workers > 1`` generates rows in that many threads (numpy's generators release the GIL
    while filling); the result is identical for any ``workers``.
    """
    seed = _check_seed(seed)
    dim = _check_dim(dim)
    check_integer_at_least(workers, "workers", 1)
    indices = np.asarray(indices, dtype=np.int64).reshape(-1)
    if indices.size and indices.min() < 0:
        raise ValueError("indices must be >= 0")
    out = np.empty((indices.size, dim), dtype=np.float32)

    def fill(row: int) -> None:
        _fill_canary(seed, int(indices[row]), out[row])

    if workers == 1 or indices.size < 2:
        for row in range(indices.size):
            fill(row)
    else:
        with ThreadPoolExecutor(max_workers=min(workers, indices.size)) as pool:
            list(pool.map(fill, range(indices.size)))
    return out


def iter_canary_chunks(
    seed: int, num_canaries: int, dim: int, chunk_size: int = 64, *, workers: int = 1
) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(start, block)`` with ``block = canaries[start:start + chunk_size]``.

    Memory is ``O(chunk_size * dim)``; the blocks concatenate to the same array whatever the
    chunk size.
    """
    if chunk_size < 1:
        raise ValueError("chunk_size must be >= 1")
    for start in range(0, num_canaries, chunk_size):
        stop = min(start + chunk_size, num_canaries)
        yield start, canary_vectors(seed, np.arange(start, stop), dim, workers=workers)


def seen_mask(seed: int, num_canaries: int) -> np.ndarray:
    """Return the secret seen/unseen split: ``True`` where canary ``j`` is seen (inserted).

    Each canary is seen independently with probability 1/2.
    """
    seed = _check_seed(seed)
    if num_canaries < 0:
        raise ValueError("num_canaries must be >= 0")
    return _generator(seed, _SPLIT_STREAM).random(num_canaries) < 0.5
