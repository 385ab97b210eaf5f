"""Canaries made in this process from a seed (:class:`LocalCanaries`): tests and local use of the
strategy wrappers without a service. The schedule is the one every caller builds
(:func:`flaudit.auditor.schedules.canary_plan`)."""

from __future__ import annotations

import numpy as np

from ..auditor.canaries import Canaries, CanaryFamily, resolve_canary_family
from ..auditor.schedules import canary_plan
from ..auditor.validation import check_at_least

__all__ = ['LocalCanaries']


class LocalCanaries:
    """Canaries generated in this process from a seed (tests, ``flaudit run``-style local use).

    The same rule as the service's external audits
    (:func:`flaudit.auditor.schedules.audit_canary_plan`,
    :class:`flaudit.auditor.schedules.CanarySchedule`): the seen set from the seed,
    ``canary_repeats`` rounds per seen canary from ``data_seed``, at most ``clients_per_round``
    canaries per round (they take cohort slots; ``None``: no cap), the family from
    ``canary_family`` by :func:`flaudit.auditor.canaries.resolve_canary_family` once the model
    size is known (``None``: orthogonal where ``num_canaries <= d``). The seed never appears in
    ``repr``.
    """

    def __init__(self, canary_seed: int, *, num_canaries: int, num_rounds: int,
                 canary_repeats: int = 1, data_seed: int = 0,
                 canary_family: CanaryFamily | str | None = None,
                 clients_per_round: int | None = None) -> None:
        check_at_least(num_canaries, "num_canaries", 2)
        check_at_least(num_rounds, "num_rounds", 1)
        if not 1 <= canary_repeats <= num_rounds:
            raise ValueError(f"canary_repeats must be in [1, num_rounds], got {canary_repeats}")
        self._seed = int(canary_seed)
        self.num_canaries = int(num_canaries)
        self.canary_family = None if canary_family is None else CanaryFamily(canary_family)
        self._plan = canary_plan(
            self._seed, num_canaries=num_canaries, num_rounds=num_rounds,
            canary_repeats=canary_repeats, data_seed=data_seed, max_per_round=clients_per_round,
        )
        self.by_round = {t: self._plan.seen(t) for t in range(1, int(num_rounds) + 1)}
        self._canaries: Canaries | None = None

    def __repr__(self) -> str:
        return f"LocalCanaries(num_rounds={len(self.by_round)})"

    def participants(self, server_round: int) -> np.ndarray:
        """Canary indices "in" the round (seen inserted + unseen drawn), for the known-rounds
        statistic; what the service derives itself for an external audit."""
        return self._plan.participants(server_round)

    def round_canaries(self, server_round: int, dim: int) -> np.ndarray:
        if self._canaries is None or self._canaries.dim != int(dim):  # derived once per run
            family = resolve_canary_family(
                self.canary_family, num_canaries=self.num_canaries, dim=int(dim)
            )
            self._canaries = Canaries(self._seed, int(dim), family=family)
        scheduled = self.by_round.get(server_round, np.empty(0, int))
        return self._canaries.vectors(scheduled)
