"""Plain-text tables for the ``flaudit`` subcommands (stdlib only)."""

from __future__ import annotations

from collections.abc import Iterable


def print_table(head: str, lines: Iterable[str]) -> None:
    """Print ``head``, a rule of dashes as wide as it, then each of ``lines``."""
    print(head)
    print("-" * len(head))
    for line in lines:
        print(line)
