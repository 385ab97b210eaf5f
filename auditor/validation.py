"""Argument checks shared by the auditor core and the Flower server code.

Each raises ``ValueError`` naming the bad argument and its value. Never pass a secret (a canary
seed, a token) as ``value``: the value is part of the message. The estimators' own checks (deltas,
score arrays, masks) live in :mod:`flaudit.auditor.estimators._validation`.
"""

from __future__ import annotations

__all__ = ["check_at_least", "check_integer_at_least", "check_positive"]


def check_at_least(value, name: str, minimum) -> None:
    """Raise ``ValueError`` ("``name`` must be >= ``minimum``") if ``value < minimum``.

    Parameters
    ----------
    value : int or float
        The argument's value (compared with ``<``, so NaN passes: use a finite check for floats
        that may be NaN).
    name : str
        The argument's name, as the caller spells it.
    minimum : int or float
        Smallest allowed value.

    Raises
    ------
    ValueError
        Naming ``name`` and ``value``.
    """
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_positive(value, name: str) -> None:
    """Raise ``ValueError`` ("``name`` must be > 0") unless ``value > 0`` (NaN fails).

    Raises
    ------
    ValueError
        Naming ``name`` and ``value``.
    """
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def check_integer_at_least(value, name: str, minimum: int) -> None:
    """Raise ``ValueError`` unless ``value`` is an ``int`` (not a ``bool``) and ``>= minimum``.

    Raises
    ------
    ValueError
        Naming ``name`` and ``value`` (its ``repr``).
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
