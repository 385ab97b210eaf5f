"""Participation schedules: who is in round ``t``.

One function, :func:`participation_schedule`, picks the cohort of every round for the whole
client population: real clients *and* seen canaries. Population ids ``0 .. num_clients - 1`` are
the real clients (stable partition ids); ids ``num_clients .. num_clients + num_seen_canaries - 1``
are the seen canaries in the order of their canary index.

Real clients follow the participation scheme:

``poisson``
    each client independently with probability ``q`` in every round (cohort size random).
``uniform``
    a fixed-size sample without replacement each round.
``shuffled``
    shuffled epochs: a fresh random permutation of the clients per epoch, cut into consecutive
    cohorts, so each client participates exactly once per (complete) epoch.
``batch_then_shuffle``
    the deliberately wrong variant of Annamalai et al. (2024): the clients are cut into cohorts
    *once*, in index order, and only the order of these fixed cohorts is shuffled each epoch.
    Every epoch has the same per-client participation counts as ``shuffled``, but the co-members
    of a client never change. Use it to demonstrate that audits catch such bugs.

Seen canaries are presented in exactly ``canary_repeats`` rounds (Andrew et al. 2023 §5.2): the
run is split into ``r`` periods of (almost) equal length and each canary joins one uniformly
random round of each period, the worst case of "a client checks in once per period". In the
fixed-size schemes a canary takes a cohort slot, so the cohort size (real + canaries) stays the
calibration size ``m``.

A participation cap limits how many rounds any real client joins over the run; capped clients
are no longer eligible. Everything is pure numpy, seeded and reproducible.

Unseen canaries are never inserted, but the known-rounds statistic needs rounds for them too:
:func:`unseen_canary_rounds` draws them with the same rule (:func:`canary_rounds`) from a stream
of their own, and :func:`canary_participants` merges them with the seen canaries' real rounds
into one list of canary indices per round, which does not tell the two apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from .bugs import DPBug
from .canaries import seen_mask
from .spec import AuditSpec, Engine
from .validation import check_at_least

__all__ = [
    "canary_plan",
    "audit_canary_plan",
    "audit_canary_repeats",
    "Schedule",
    "participation_schedule",
    "canary_rounds",
    "canary_schedule",
    "unseen_canary_rounds",
    "canary_participants",
    "CanarySchedule",
]


def _name(value: object) -> str:
    return value.value if isinstance(value, Enum) else str(value)


_SCHEMES = ("poisson", "uniform", "shuffled", "batch_then_shuffle")


@dataclass(frozen=True)
class Schedule:
    """The cohorts of a run.

    Attributes
    ----------
    num_clients : int
        Real clients ``N`` (population ids ``0 .. N-1``).
    num_seen_canaries : int
        Seen canaries (population ids ``N .. N + s - 1``).
    cohorts : list of numpy.ndarray
        ``cohorts[t]`` holds the sorted population ids of round ``t + 1`` (int64).
    """

    num_clients: int
    num_seen_canaries: int
    cohorts: list[np.ndarray] = field(repr=False)

    @property
    def num_rounds(self) -> int:
        return len(self.cohorts)

    def real_clients(self, t: int) -> np.ndarray:
        """Partition ids of the real clients in round ``t`` (1-based)."""
        cohort = self.cohorts[t - 1]
        return cohort[cohort < self.num_clients]

    def canaries(self, t: int) -> np.ndarray:
        """Positions (0 .. s-1) in the seen-canary list of the canaries in round ``t``."""
        cohort = self.cohorts[t - 1]
        return cohort[cohort >= self.num_clients] - self.num_clients

    def participation_counts(self) -> np.ndarray:
        """Rounds joined per population id (length ``N + s``)."""
        total = self.num_clients + self.num_seen_canaries
        counts = np.zeros(total, dtype=np.int64)
        for cohort in self.cohorts:
            counts[cohort] += 1
        return counts


def canary_rounds(
    num_seen_canaries: int,
    *,
    num_rounds: int,
    repeats: int,
    rng: np.random.Generator,
    max_per_round: int | None = None,
) -> np.ndarray:
    """Rounds (0-based) of each canary: shape ``(s, repeats)``, one round per period.

    Period ``p`` covers rounds ``floor(p T / r) .. floor((p + 1) T / r) - 1``. With
    ``max_per_round`` (the cohort size ``m``: canaries take cohort slots) no round gets more
    canaries than that: a canary whose drawn round is full moves to a uniformly random round of
    the same period that is not (in canary order; no change where no round overflows).

    Raises
    ------
    ValueError
        If ``repeats`` exceeds ``num_rounds``, or the canaries do not fit ``max_per_round``
        slots per round (naming ``num_canaries``).
    """
    check_at_least(repeats, "canary_repeats", 1)
    if repeats > num_rounds:
        raise ValueError(f"canary_repeats ({repeats}) must not exceed num_rounds ({num_rounds})")
    bounds = (np.arange(repeats + 1) * num_rounds) // repeats
    lengths = np.diff(bounds)
    offsets = np.floor(rng.random((num_seen_canaries, repeats)) * lengths).astype(np.int64)
    rounds = bounds[:-1] + offsets
    if max_per_round is None or num_seen_canaries == 0:
        return rounds
    check_at_least(max_per_round, "max_per_round", 1)
    if num_seen_canaries > max_per_round * int(lengths.min()):
        shortest = int(lengths.min())
        raise ValueError(  # no count of seen canaries in the message: it is the audit's secret
            f"num_canaries: the seen canaries take cohort slots, and a period of {shortest} "
            f"round(s) ({repeats} period(s): canary_repeats) has {max_per_round * shortest} "
            f"slots ({max_per_round} per round); use at most {max_per_round * shortest} "
            "canaries (about half are seen), more rounds, or fewer canary_repeats"
        )
    counts = np.bincount(rounds.ravel(), minlength=num_rounds)
    if counts.max() <= max_per_round:
        return rounds
    counts = np.zeros(num_rounds, dtype=np.int64)
    for i in range(num_seen_canaries):
        for p in range(repeats):
            t = int(rounds[i, p])
            if counts[t] >= max_per_round:
                period = np.arange(bounds[p], bounds[p + 1])
                free = period[counts[period] < max_per_round]
                t = int(free[int(rng.integers(free.size))])
                rounds[i, p] = t
            counts[t] += 1
    return rounds


def _schedule_rngs(seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    """The canary and the real-client generators of a schedule seed (independent streams)."""
    root = np.random.SeedSequence(entropy=int(seed), spawn_key=(0x5C4ED,))
    canary_rng, client_rng = (np.random.default_rng(s) for s in root.spawn(2))
    return canary_rng, client_rng


def _canary_positions(
    num_seen_canaries: int,
    *,
    num_rounds: int,
    canary_repeats: int,
    rng: np.random.Generator,
    max_per_round: int | None = None,
) -> list[np.ndarray]:
    by_round: list[list[int]] = [[] for _ in range(num_rounds)]
    if num_seen_canaries:
        rounds = canary_rounds(
            num_seen_canaries,
            num_rounds=num_rounds,
            repeats=canary_repeats,
            rng=rng,
            max_per_round=max_per_round,
        )
        for position, row in enumerate(rounds):
            for t in row:
                by_round[int(t)].append(position)
    return [np.asarray(r, dtype=np.int64) for r in by_round]


def canary_schedule(
    num_seen_canaries: int,
    *,
    num_rounds: int,
    canary_repeats: int = 1,
    seed: int = 0,
    max_per_round: int | None = None,
) -> list[np.ndarray]:
    """Seen-canary positions (0 .. s-1) of every round, as :func:`participation_schedule` draws them.

    ``canary_schedule(s, ...)[t - 1]`` equals ``participation_schedule(..., seed=seed).canaries(t)``
    for any real-client scheme: the canary stream does not depend on the clients. The service
    uses it to serve the canaries of a run it does not start (``engine = "external"``), so
    built-in and external audits insert canaries by the same rule.

    Raises
    ------
    ValueError
        Naming the bad argument.
    """
    check_at_least(num_seen_canaries, "num_seen_canaries", 0)
    check_at_least(num_rounds, "num_rounds", 1)
    canary_rng, _ = _schedule_rngs(seed)
    return _canary_positions(
        num_seen_canaries,
        num_rounds=num_rounds,
        canary_repeats=canary_repeats,
        rng=canary_rng,
        max_per_round=max_per_round,
    )


def unseen_canary_rounds(
    num_unseen_canaries: int,
    *,
    num_rounds: int,
    repeats: int,
    seed: int,
    max_per_round: int | None = None,
) -> np.ndarray:
    """Rounds (0-based) of the unseen canaries, drawn exactly like the seen canaries' rounds
    (:func:`canary_rounds`, one per period) from their own stream; they are never inserted.

    Returns
    -------
    numpy.ndarray
        Shape ``(num_unseen_canaries, repeats)``.
    """
    check_at_least(num_unseen_canaries, "num_unseen_canaries", 0)
    rng = np.random.default_rng(
        np.random.SeedSequence(entropy=int(seed), spawn_key=(0x5C4ED, 0x0B5E))
    )
    return canary_rounds(
        num_unseen_canaries,
        num_rounds=num_rounds,
        repeats=repeats,
        rng=rng,
        max_per_round=max_per_round,
    )


def canary_participants(
    *,
    seen_by_round: list[np.ndarray],
    unseen_indices: np.ndarray,
    unseen_rounds: np.ndarray,
) -> list[np.ndarray]:
    """Canary indices "in" each round: seen canaries inserted there and unseen canaries whose
    drawn rounds include it, merged and sorted (the list alone does not reveal which is which).

    Parameters
    ----------
    seen_by_round : list of numpy.ndarray
        ``seen_by_round[t]``: indices of the seen canaries inserted in round ``t + 1``.
    unseen_indices : numpy.ndarray
        Canary indices of the unseen canaries.
    unseen_rounds : numpy.ndarray
        Their rounds (0-based), shape ``(len(unseen_indices), r)`` (:func:`unseen_canary_rounds`).

    Returns
    -------
    list of numpy.ndarray
        One sorted int64 array per round.
    """
    unseen_indices = np.asarray(unseen_indices, dtype=np.int64)
    unseen_rounds = np.asarray(unseen_rounds, dtype=np.int64)
    # (no unseen canary at all, e.g. every canary of a small audit came up seen: (0, r) or empty)
    unseen_rounds = (
        unseen_rounds.reshape(unseen_indices.size, -1)
        if unseen_indices.size
        else np.empty((0, 0), dtype=np.int64)
    )
    out = []
    for t, seen in enumerate(seen_by_round):
        virtual = unseen_indices[np.any(unseen_rounds == t, axis=1)]
        out.append(np.sort(np.concatenate([np.asarray(seen, dtype=np.int64), virtual])))
    return out


def participation_schedule(
    *,
    num_clients: int,
    num_seen_canaries: int,
    num_rounds: int,
    participation: str = "poisson",
    clients_per_round: int,
    sampling_probability: float | None = None,
    canary_repeats: int = 1,
    max_participations: int | None = None,
    seed: int = 0,
    max_canaries_per_round: int | None = None,
) -> Schedule:
    """Draw the cohorts of every round for real clients and seen canaries.

    Parameters
    ----------
    num_clients : int
        Real clients ``N >= 0``.
    num_seen_canaries : int
        Seen canaries ``s >= 0``.
    num_rounds : int
        Rounds ``T >= 1``.
    participation : {"poisson", "uniform", "shuffled", "batch_then_shuffle"}
        Scheme for the real clients (see the module docstring). Enum members are accepted.
    clients_per_round : int
        Calibration cohort size ``m`` (real clients + canaries) for the fixed-size schemes.
    sampling_probability : float, optional
        ``q`` in ``(0, 1]`` for ``poisson``; default ``m / (N + s)``.
    canary_repeats : int
        Rounds each seen canary is presented in, ``1 <= r <= T``.
    max_participations : int, optional
        Cap on the rounds a real client joins (None: no cap).
    seed : int
        Seed of the schedule (not secret; it does not decide which canaries are seen).
    max_canaries_per_round : int, optional
        At most this many seen canaries in a round (:func:`canary_rounds`). The built-in
        DP-FedAvg divides by the calibration size ``m`` whatever the replies, so canaries beyond
        the cohort do not dilute it (None, the default); a strategy that divides by its reply
        count (Flower's FedAvg under :class:`flaudit.server.wrapper.CanaryAuditStrategy`) needs
        ``m``.

    Returns
    -------
    Schedule

    Raises
    ------
    ValueError
        Naming the bad argument.
    """
    scheme = _name(participation)
    if scheme not in _SCHEMES:
        raise ValueError(f"participation must be one of {_SCHEMES}, got {scheme!r}")
    check_at_least(num_clients, "num_clients", 0)
    check_at_least(num_seen_canaries, "num_seen_canaries", 0)
    check_at_least(num_rounds, "num_rounds", 1)
    check_at_least(clients_per_round, "clients_per_round", 1)
    if max_participations is not None and max_participations < 1:
        raise ValueError(f"max_participations must be >= 1, got {max_participations}")
    population = num_clients + num_seen_canaries
    if sampling_probability is None:
        sampling_probability = min(1.0, clients_per_round / max(population, 1))
    if not 0.0 < sampling_probability <= 1.0:
        raise ValueError(f"sampling_probability must be in (0, 1], got {sampling_probability}")

    canary_rng, client_rng = _schedule_rngs(seed)

    # Seen canaries: exactly r rounds each, one per period.
    by_round = [
        list(num_clients + positions)
        for positions in _canary_positions(
            num_seen_canaries,
            num_rounds=num_rounds,
            canary_repeats=canary_repeats,
            rng=canary_rng,
            max_per_round=max_canaries_per_round,
        )
    ]
    canaries_per_round = np.array([len(r) for r in by_round], dtype=np.int64)

    # Real clients: the scheme, with slots left over by the canaries in fixed-size schemes.
    real_slots = np.maximum(clients_per_round - canaries_per_round, 0)
    if scheme == "poisson":
        real = _poisson(
            num_clients, num_rounds, sampling_probability, max_participations, client_rng
        )
    elif scheme == "uniform":
        real = _uniform(num_clients, real_slots, max_participations, client_rng)
    elif scheme == "shuffled":
        real = _shuffled(num_clients, real_slots, max_participations, client_rng)
    else:
        expected_canaries = num_seen_canaries * canary_repeats / num_rounds
        batch_size = max(1, int(round(clients_per_round - expected_canaries)))
        real = _batch_then_shuffle(
            num_clients, num_rounds, batch_size, max_participations, client_rng
        )

    cohorts = [
        np.sort(np.concatenate([real[t], np.asarray(by_round[t], dtype=np.int64)]))
        for t in range(num_rounds)
    ]
    return Schedule(num_clients=num_clients, num_seen_canaries=num_seen_canaries, cohorts=cohorts)


def _capped_cohorts(n: int, sizes, cap: int | None, draw_any, draw_eligible) -> list[np.ndarray]:
    """One cohort per entry of ``sizes``: ``draw_any(size)`` among all ``n`` clients, or with a
    participation ``cap``, ``draw_eligible(eligible, size)`` among the clients still under it."""
    counts = np.zeros(n, dtype=np.int32) if cap is not None else None
    out = []
    for size in sizes:
        if counts is None:
            chosen = draw_any(size)
        else:
            chosen = draw_eligible(np.flatnonzero(counts < cap), size)
            counts[chosen] += 1
        out.append(np.asarray(chosen, dtype=np.int64))
    return out


def _poisson(
    n: int, num_rounds: int, q: float, cap: int | None, rng: np.random.Generator
) -> list[np.ndarray]:
    def draw_any(_) -> np.ndarray:
        k = rng.binomial(n, q)
        return rng.choice(n, size=k, replace=False) if k else np.empty(0, np.int64)

    return _capped_cohorts(
        n,
        range(num_rounds),
        cap,
        draw_any,
        lambda eligible, _: eligible[rng.random(eligible.size) < q],
    )


def _uniform(
    n: int, slots: np.ndarray, cap: int | None, rng: np.random.Generator
) -> list[np.ndarray]:
    return _capped_cohorts(
        n,
        slots,
        cap,
        lambda size: rng.choice(n, size=min(int(size), n), replace=False),
        lambda eligible, size: rng.choice(
            eligible, size=min(int(size), eligible.size), replace=False
        ),
    )


def _shuffled(
    n: int, slots: np.ndarray, cap: int | None, rng: np.random.Generator
) -> list[np.ndarray]:
    # Each client once per epoch; an epoch's last cohort may be short (no client spills over
    # into the next epoch), so complete epochs give exactly one participation per client.
    out: list[np.ndarray] = []
    epoch: np.ndarray = np.empty(0, dtype=np.int64)
    position = 0
    epochs_started = 0
    for size in slots:
        if position >= epoch.size:
            if n == 0 or (cap is not None and epochs_started >= cap):
                epoch, position = np.empty(0, dtype=np.int64), 0
            else:
                epoch, position = rng.permutation(n).astype(np.int64), 0
                epochs_started += 1
        chosen = epoch[position : position + int(size)]
        position += int(size)
        out.append(chosen)
    return out


def _batch_then_shuffle(
    n: int, num_rounds: int, batch_size: int, cap: int | None, rng: np.random.Generator
) -> list[np.ndarray]:
    batches = [
        np.arange(s, min(s + batch_size, n), dtype=np.int64) for s in range(0, n, batch_size)
    ]
    out: list[np.ndarray] = []
    epochs = 0
    while len(out) < num_rounds:
        if not batches or (cap is not None and epochs >= cap):
            out.append(np.empty(0, dtype=np.int64))
            continue
        for index in rng.permutation(len(batches)):
            out.append(batches[index])
        epochs += 1
    return out[:num_rounds]


@dataclass(frozen=True)
class CanarySchedule:
    """Which canaries are "in" each round of an audit: the one rule that the built-in ServerApp,
    :class:`flaudit.server.wrapper.CanaryAuditStrategy` and the service (external audits) share.

    Seen canaries are inserted in ``canary_repeats`` rounds each (:func:`canary_schedule`, at most
    ``max_per_round`` per round: they take cohort slots); unseen canaries get rounds drawn by the
    same rule from their own stream (:func:`unseen_canary_rounds`, uncapped), never inserted. Secret (it
    follows from the seen mask): kept out of ``repr``.

    Build it with :meth:`from_mask`.
    """

    by_round: list[np.ndarray] = field(repr=False)  # seen canary indices inserted, per round
    participants_by_round: list[np.ndarray] = field(repr=False)

    @classmethod
    def from_mask(
        cls,
        seen: np.ndarray,
        *,
        num_rounds: int,
        canary_repeats: int = 1,
        seed: int = 0,
        max_per_round: int | None = None,
    ) -> CanarySchedule:
        """From the seen mask of all ``k`` canaries (:func:`flaudit.auditor.canaries.seen_mask`).

        ``max_per_round``: the cohort size ``m`` (``clients_per_round``, Flower's
        ``num_sampled_clients``); ``None`` puts no cap (then canaries may outnumber the cohort).
        """
        seen = np.asarray(seen, dtype=bool)
        seen_idx, unseen_idx = np.flatnonzero(seen), np.flatnonzero(~seen)
        positions = canary_schedule(
            int(seen_idx.size),
            num_rounds=num_rounds,
            canary_repeats=canary_repeats,
            seed=seed,
            max_per_round=max_per_round,
        )
        by_round = [np.sort(seen_idx[p]) for p in positions]
        # unseen canaries take no slot (never inserted), so their rounds are not capped: an
        # unseen canary's cosine is null in every round, whichever rounds are drawn for it
        unseen_rounds = unseen_canary_rounds(
            int(unseen_idx.size), num_rounds=num_rounds, repeats=canary_repeats, seed=seed
        )
        participants = canary_participants(
            seen_by_round=by_round, unseen_indices=unseen_idx, unseen_rounds=unseen_rounds
        )
        return cls(by_round=by_round, participants_by_round=participants)

    @property
    def num_rounds(self) -> int:
        return len(self.by_round)

    def seen(self, t: int) -> np.ndarray:
        """Indices of the seen canaries inserted in round ``t`` (1-based), ascending."""
        if not 1 <= t <= self.num_rounds:
            raise ValueError(f"round must be in 1..{self.num_rounds}, got {t}")
        return self.by_round[t - 1]

    def participants(self, t: int) -> np.ndarray:
        """Canary indices "in" round ``t`` for the known-rounds statistic (seen and unseen)."""
        if not 1 <= t <= self.num_rounds:
            raise ValueError(f"round must be in 1..{self.num_rounds}, got {t}")
        return self.participants_by_round[t - 1]


def canary_plan(
    canary_seed: int,
    *,
    num_canaries: int,
    num_rounds: int,
    canary_repeats: int = 1,
    data_seed: int = 0,
    max_per_round: int | None = None,
) -> CanarySchedule:
    """The one builder of an audit's canary schedule, used by every caller: the built-in
    ServerApp (:mod:`flaudit.server.app`), the strategy wrapper's local canaries
    (:class:`flaudit.server.wrapper.LocalCanaries`) and the service for external audits
    (through :func:`audit_canary_plan`).

    The seen set follows from the secret seed (:func:`.canaries.seen_mask`), each seen canary
    joins ``canary_repeats`` rounds drawn from ``data_seed``, at most ``max_per_round`` per round
    (``None``: uncapped). Callers differ only in that cap: a strategy wrapper's FedAvg divides by
    its reply count, so canaries take cohort slots (cap ``m``); the built-in DP-FedAvg divides by
    the calibration size ``m`` whatever the replies, so extra canaries do not dilute the
    mechanism and it passes ``None``.
    """
    return CanarySchedule.from_mask(
        seen_mask(int(canary_seed), int(num_canaries)),
        num_rounds=int(num_rounds),
        canary_repeats=int(canary_repeats),
        seed=int(data_seed),
        max_per_round=max_per_round,
    )


def audit_canary_repeats(spec: AuditSpec) -> int:
    """Rounds each canary of an audit joins: ``spec.canary_repeats``, times the factor of an
    injected ``extra_participation`` bug (built-in engines only: the clients and the canaries
    join that many times more often, and the claim does not know; an external audit cannot have
    a bug, :class:`.spec.AuditSpec` refuses it)."""
    bug = spec.inject_bug
    if bug is not None and bug.kind is DPBug.extra_participation:
        return int(spec.canary_repeats * bug.factor)
    return int(spec.canary_repeats)


def audit_canary_plan(canary_seed: int, spec: AuditSpec) -> CanarySchedule:
    """The canary schedule of the audit ``spec`` with master seed ``canary_seed``: the one place
    that turns a spec into :func:`canary_plan`'s arguments, for the built-in ServerApp (seed in
    memory), the service (deployment audits' canary sums and participants, external audits'
    canaries) and nobody else.

    Built-in engines (``simulation``, ``deployment``) insert canaries uncapped
    (``max_per_round=None``: the built-in DP-FedAvg divides by the calibration size ``m``
    whatever the replies) with :func:`audit_canary_repeats`; engine ``external`` caps them at
    ``clients_per_round`` (they take cohort slots of the user's FedAvg).
    """
    external = spec.engine == Engine.external
    return canary_plan(
        canary_seed,
        num_canaries=spec.num_canaries,
        num_rounds=spec.num_rounds,
        canary_repeats=audit_canary_repeats(spec),
        data_seed=spec.data_seed,
        max_per_round=spec.clients_per_round if external else None,
    )
