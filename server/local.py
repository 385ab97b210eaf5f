"""Canaries made in this process from the secret seed (:class:`LocalCanaries`): the built-in
ServerApp under Flower's simulation engine (the seed handed over in memory), the stand-alone
``flwr run`` demo, and the strategy wrappers' tests and local use without a service. The
schedule is the one every caller builds (:func:`flaudit.auditor.schedules.canary_plan`; from an
audit's spec: :func:`flaudit.auditor.schedules.audit_canary_plan`)."""

from __future__ import annotations

import numpy as np

from ..auditor.canaries import Canaries, CanaryFamily, resolve_canary_family, seen_mask
from ..auditor.schedules import CanarySchedule, audit_canary_plan, canary_plan
from ..auditor.spec import AuditSpec
from ..auditor.validation import check_at_least

__all__ = ["LocalCanaries"]


class LocalCanaries:
    """Canaries generated in this process from a seed (never shown in ``repr``).

    The same rule as the service's (:func:`flaudit.auditor.schedules.audit_canary_plan`,
    :class:`flaudit.auditor.schedules.CanarySchedule`): the seen set from the seed,
    ``canary_repeats`` rounds per seen canary from ``data_seed``, at most ``clients_per_round``
    canaries per round (they take cohort slots; ``None``: no cap), the family from
    ``canary_family`` by :func:`flaudit.auditor.canaries.resolve_canary_family` once the model
    size is known (``None``: orthogonal where ``num_canaries <= d``). :meth:`for_audit` takes
    all of it from an audit's spec.

    Round ``t``'s canaries come as unit vectors (:meth:`round_canaries`: a wrapper's canary
    replies) or as their sum (:meth:`round_sum`: a strategy that takes the sum,
    :class:`flaudit.server.canary_sums.CanarySums`).
    """

    def __init__(
        self,
        canary_seed: int,
        *,
        num_canaries: int,
        num_rounds: int,
        canary_repeats: int = 1,
        data_seed: int = 0,
        canary_family: CanaryFamily | str | None = None,
        clients_per_round: int | None = None,
    ) -> None:
        check_at_least(num_canaries, "num_canaries", 2)
        check_at_least(num_rounds, "num_rounds", 1)
        if not 1 <= canary_repeats <= num_rounds:
            raise ValueError(f"canary_repeats must be in [1, num_rounds], got {canary_repeats}")
        self._setup(
            canary_seed,
            num_canaries,
            canary_family,
            canary_plan(
                int(canary_seed),
                num_canaries=num_canaries,
                num_rounds=num_rounds,
                canary_repeats=canary_repeats,
                data_seed=data_seed,
                max_per_round=clients_per_round,
            ),
        )

    @classmethod
    def for_audit(cls, canary_seed: int, spec: AuditSpec) -> LocalCanaries:
        """The canaries of the audit ``spec`` (its schedule:
        :func:`flaudit.auditor.schedules.audit_canary_plan`; built-in engines uncapped)."""
        local = cls.__new__(cls)
        local._setup(
            canary_seed,
            spec.num_canaries,
            spec.canary_family,
            audit_canary_plan(int(canary_seed), spec),
        )
        return local

    def _setup(
        self,
        canary_seed: int,
        num_canaries: int,
        canary_family: CanaryFamily | str | None,
        plan: CanarySchedule,
    ) -> None:
        self._seed = int(canary_seed)
        self.num_canaries = int(num_canaries)
        self.canary_family = None if canary_family is None else CanaryFamily(canary_family)
        self._plan = plan
        #: round -> indices of the seen canaries inserted in it (secret, like the seed)
        self.by_round = {t: plan.seen(t) for t in range(1, plan.num_rounds + 1)}
        #: how many canaries are seen (inserted at all); a count, not which
        self.num_seen = int(seen_mask(self._seed, self.num_canaries).sum())
        self._canaries: Canaries | None = None

    def __repr__(self) -> str:
        return f"LocalCanaries(num_rounds={self._plan.num_rounds})"

    def participants(self, server_round: int) -> np.ndarray:
        """Canary indices "in" the round (seen inserted + unseen drawn), for the known-rounds
        statistic; what the service derives itself for an external audit."""
        return self._plan.participants(server_round)

    def _family(self, dim: int) -> Canaries:
        if self._canaries is None or self._canaries.dim != int(dim):  # signs derived once per run
            family = resolve_canary_family(
                self.canary_family, num_canaries=self.num_canaries, dim=int(dim)
            )
            self._canaries = Canaries(self._seed, int(dim), family=family)
        return self._canaries

    def _seen(self, server_round: int) -> np.ndarray:
        return self.by_round.get(int(server_round), np.empty(0, dtype=np.int64))  # past: none

    def round_canaries(self, server_round: int, dim: int) -> np.ndarray:
        """The unit vectors of round ``t``'s seen canaries, ``(c, dim)``."""
        return self._family(dim).vectors(self._seen(server_round))

    def round_sum(self, server_round: int, dim: int) -> tuple[np.ndarray, int]:
        """``(sum, c)``: the sum of round ``t``'s ``c`` seen unit canaries, ``(dim,)``."""
        scheduled = self._seen(server_round)
        return self._family(dim).sum_of(scheduled), int(scheduled.size)
