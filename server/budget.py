"""The time the audit may hold up one training round (issue #28: never stall a round).

:class:`CanaryAuditStrategy` waits on its audit work (the round's canaries, the previous
round's report) only through a :class:`RoundBudget`: every wait of one round draws on the same
``seconds`` (default :data:`DEFAULT_ROUND_BUDGET`). Past the budget the round goes on without
what it waited for (fail open): the canaries that did not arrive are a stated gap, a report
still in flight keeps going in the background and is delivered in order.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

from ..auditor.validation import check_positive

__all__ = ["DEFAULT_ROUND_BUDGET", "RoundBudget"]

#: Seconds per round the audit may add to training, all its waits together.
DEFAULT_ROUND_BUDGET = 5.0


class RoundBudget:
    """``seconds`` of waiting per round, shared by every :meth:`wait` until the next
    :meth:`start`.

    Parameters
    ----------
    seconds : float
        The budget of one round (> 0).

    Raises
    ------
    ValueError
        Naming ``round_budget_seconds`` when ``seconds`` is not a number > 0.
    """

    def __init__(self, seconds: float) -> None:
        check_positive(seconds, "round_budget_seconds")
        self.seconds = float(seconds)
        self.round: int | None = None
        self.spent = 0.0
        #: Rounds whose waits ran out of budget (what was waited for, per round).
        self.exceeded: dict[int, list[str]] = {}

    def __repr__(self) -> str:
        return f"RoundBudget(seconds={self.seconds:g})"

    def start(self, server_round: int) -> None:
        """A new round: the full budget again (a round already started keeps what it spent)."""
        if self.round != int(server_round):
            self.round = int(server_round)
            self.spent = 0.0

    def left(self) -> float:
        return max(0.0, self.seconds - self.spent)

    def wait(self, future: Future, what: str) -> tuple[bool, Any]:
        """Wait for ``future`` within what is left of the round's budget.

        Returns
        -------
        (done, value)
            ``(True, result)``, or ``(False, None)`` when the budget ran out first (the work
            goes on in the background; ``what`` is recorded in :attr:`exceeded`).

        Raises
        ------
        Exception
            The future's own error, when it finished with one.
        """
        if future.done():
            return True, future.result()
        began = time.monotonic()
        try:
            return True, future.result(timeout=self.left())
        except TimeoutError:
            if future.done():  # finished with its own TimeoutError
                raise
            if self.round is not None:
                self.exceeded.setdefault(self.round, []).append(what)
            return False, None
        finally:
            self.spent += time.monotonic() - began
