"""Plain-text tables for the ``flaudit`` subcommands (stdlib only)."""

from __future__ import annotations

import math
from collections.abc import Iterable


def fmt_number(value, digits: int = 4) -> str:
    """``value`` to ``digits`` significant digits (``inf``, ``nan``; ``-`` for None)."""
    if value is None:
        return "-"
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.{digits}g}"


def print_table(head: str, lines: Iterable[str]) -> None:
    """Print ``head``, a rule of dashes as wide as it, then each of ``lines``."""
    print(head)
    print("-" * len(head))
    for line in lines:
        print(line)
