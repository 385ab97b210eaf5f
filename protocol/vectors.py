"""Model <-> one float32 vector (the space canaries live in).

A model is flattened by concatenating its parameter arrays in ``state_dict()`` order; ``d`` is the
total length. :func:`unflatten` needs the shapes (and optionally dtypes) to go back.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["flatten", "unflatten", "shapes_of"]


def shapes_of(arrays: Sequence[np.ndarray]) -> list[tuple[int, ...]]:
    """Shapes of ``arrays`` in order."""
    return [tuple(np.shape(a)) for a in arrays]


def flatten(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Concatenate ``arrays`` (raveled, in order) into one float32 vector."""
    if len(arrays) == 0:
        return np.empty(0, dtype=np.float32)
    return np.concatenate([np.asarray(a, dtype=np.float32).ravel() for a in arrays])


def unflatten(
    vector: np.ndarray,
    shapes: Sequence[tuple[int, ...]],
    *,
    dtypes: Sequence[np.dtype] | None = None,
) -> list[np.ndarray]:
    """Split ``vector`` back into arrays of ``shapes`` (views cast to ``dtypes`` if given).

    Raises
    ------
    ValueError
        If the lengths do not add up to ``len(vector)``.
    """
    vector = np.asarray(vector)
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    if vector.ndim != 1 or sum(sizes) != vector.shape[0]:
        raise ValueError(f"vector has shape {vector.shape}, but shapes need {sum(sizes)} elements")
    out = []
    start = 0
    for index, (shape, size) in enumerate(zip(shapes, sizes)):
        part = vector[start : start + size].reshape(shape)
        if dtypes is not None:
            part = part.astype(dtypes[index], copy=False)
        out.append(part)
        start += size
    return out
