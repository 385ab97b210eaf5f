"""Where the built-in ServerApp gets each round's canaries (:class:`CanarySums`, issue #29).

The built-in ServerApp (:func:`flaudit.server.app.run_audit`) runs its DP strategy inside
:class:`flaudit.server.wrapper.CanaryAuditStrategy`, which takes ``S(t)`` times the sum of round
``t``'s scheduled seen canaries from one of these (while the clients train), hands it to the
strategy and reports the round's canary participants. The secret canary seed is in this
process only where it was handed over in memory:

:class:`flaudit.server.local.LocalCanaries` (:meth:`~flaudit.server.local.LocalCanaries.for_audit`)
    from the seed, in this process: Flower's simulation engine (the seed handed over in memory)
    and the stand-alone ``flwr run`` demo without a service.
:class:`ServiceCanarySums`
    from the audit service (``GET /audits/{id}/rounds/{t}/canary-sum``, through the run's
    :class:`flaudit.server.http_reporter.HttpRoundReporter`): a deployment audit on a SuperLink.
    The ServerApp never holds the seed, so it cannot say which canaries were in a round; the
    service derives the participants itself, as for an external run.

Both follow the one schedule of the audit (:func:`flaudit.auditor.schedules.audit_canary_plan`).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..auditor.validation import check_at_least
from .http_reporter import HttpRoundReporter

__all__ = ["CanarySums", "ServiceCanarySums"]


class CanarySums(Protocol):
    """Round ``t``'s canaries as the wrapper needs them for a strategy that takes their sum.

    Attributes
    ----------
    num_seen : int
        How many canaries are seen (inserted at all): the participation schedule draws their
        rounds with the real clients'. A count, not which ones.
    """

    num_seen: int

    def round_sum(self, t: int, dim: int) -> tuple[np.ndarray, int]:
        """``(sum, c)``: the sum of the ``c`` unit canaries inserted in round ``t`` (1-based),
        shape ``(dim,)``; ``c = 0`` when the round trains without canaries."""
        ...

    def participants(self, t: int) -> np.ndarray | None:
        """Canary indices "in" round ``t`` for the known-rounds statistic, or ``None`` when the
        service derives them itself."""
        ...


class ServiceCanarySums:
    """Canary sums fetched from the audit service, which keeps the seed (deployment audits).

    Each round's sum comes from ``GET /audits/{id}/rounds/{t}/canary-sum`` through the run's
    reporter (:meth:`flaudit.server.http_reporter.HttpRoundReporter.round_canary_sum`: the next
    rounds' are fetched ahead; when the service cannot be reached the round trains without
    canaries and is reported with ``canaries_missing``, as an external run's).

    Parameters
    ----------
    reporter : HttpRoundReporter
        The run's service client (it reports the rounds too).
    num_seen : int
        The number of seen canaries (run config ``flaudit-num-seen-canaries``).
    """

    def __init__(self, reporter: HttpRoundReporter, *, num_seen: int) -> None:
        check_at_least(num_seen, "num_seen", 0)
        self.reporter = reporter
        self.num_seen = int(num_seen)

    def __repr__(self) -> str:
        return f"ServiceCanarySums({self.reporter!r})"

    def round_sum(self, t: int, dim: int) -> tuple[np.ndarray, int]:
        total, count = self.reporter.round_canary_sum(t)
        if count == 0:
            return np.zeros(int(dim), dtype=np.float32), 0
        if total.shape != (int(dim),):
            raise ValueError(
                f"the service served a canary sum of d={total.shape[0]} for round "
                f"{t}; the model has d={dim}"
            )
        return total, int(count)

    def participants(self, t: int) -> None:
        return None  # the service knows them (it scheduled the canaries)
