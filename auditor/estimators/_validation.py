"""Argument checks shared by the estimators: every error names the bad argument."""

from __future__ import annotations

import math

import numpy as np

from ..results import VarianceTreatment


def check_delta(delta: float, name: str = "delta") -> float:
    try:
        value = float(delta)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in (0, 1), got {delta!r}") from None
    if not (0.0 < value < 1.0):
        raise ValueError(f"{name} must be in (0, 1), got {delta!r}")
    return value


def check_confidence(confidence: float) -> float:
    return check_delta(confidence, "confidence")


def check_gaussian_variance(variance: VarianceTreatment | str) -> VarianceTreatment:
    """``variance`` as a :class:`VarianceTreatment` that fits a Gaussian: ``null`` or ``fitted``."""
    variance = VarianceTreatment(variance)
    if variance not in (VarianceTreatment.null, VarianceTreatment.fitted):
        raise ValueError(f"variance must be 'null' or 'fitted', got {variance.value!r}")
    return variance


def check_finite(value: float, name: str) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite number, got {value!r}") from None
    if not math.isfinite(out):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return out


def check_nonnegative(value: float, name: str) -> float:
    out = check_finite(value, name)
    if out < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return out


def check_dim(dim: int | float | None, name: str = "d") -> int:
    if dim is None or isinstance(dim, bool):
        raise ValueError(f"{name} must be an integer >= 2, got {dim!r}")
    try:
        value = float(dim)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer >= 2, got {dim!r}") from None
    if not math.isfinite(value) or value != int(value) or value < 2:
        raise ValueError(f"{name} must be an integer >= 2, got {dim!r}")
    return int(value)


def check_scores(values, name: str, *, allow_empty: bool = False) -> np.ndarray:
    """Return ``values`` as a finite 1-d float64 array or raise ``ValueError`` naming it."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an array of numbers") from None
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    if array.size == 0 and not allow_empty:
        raise ValueError(f"{name} must not be empty")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} contains NaN or Inf")
    return array


def check_mask(values, name: str, length: int, length_name: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    if array.shape[0] != length:
        raise ValueError(
            f"{name} has length {array.shape[0]} but {length_name} has length {length}"
        )
    if array.dtype != np.bool_:
        if not np.issubdtype(array.dtype, np.number) or not np.all(np.isin(array, (0, 1))):
            raise ValueError(f"{name} must be boolean (True = seen)")
        array = array.astype(bool)
    return array
