"""Fast simulated audits (numpy, no Flower): DP-FedAvg with canaries, with DP bugs on demand,
and the Gaussian mechanism with seen and unseen canaries. It lives in ``server/`` because it runs
the server's own schedule and aggregation code; the math package ``auditor/`` imports no server
code.

Used by ``benchmarks/fidelity`` and ``tests/fidelity`` to check that the audit's numbers mean
what they say (see ``docs/fidelity.md``).

:func:`simulate_dpfedavg_audit` runs the SAME participation schedule
(:func:`flaudit.auditor.schedules.participation_schedule`) and the SAME aggregation math
(:func:`flaudit.server.dpfedavg.aggregate_round`, :class:`flaudit.server.dpfedavg.ServerOptimizer`) as the Flower
ServerApp, with real clients replaced by a simple model: client ``i`` in round ``t`` sends
``S * (a * u + b * g_it / sqrt(d))`` with a fixed unit direction ``u`` shared by every client and
``g_it ~ N(0, I_d)`` (``a = client_signal``, ``b = client_noise``), which is then clipped to ``S``.
Every round's model delta goes to a :class:`flaudit.auditor.statistics.CosineTracker`, exactly as the
service ingests it. Switches in :class:`DPBug` inject implementation errors.

Nothing here prints or returns a canary seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from ..auditor.bugs import DPBug
from ..auditor.canaries import (
    CanaryFamily,
    canary_vectors,
    resolve_canary_family,
    seen_mask,
)
from ..auditor.claims.curves import audit_claims
from ..auditor.claims.gaussian import gaussian_mechanism_cosines
from ..auditor.claims.known_rounds import KnownRoundsStatistic
from ..auditor.claims.normal_scores import RoundSums
from ..auditor.claims.summary import AuditLook, summarize
from ..auditor.estimators.analytic import analytic_epsilon
from ..auditor.estimators.null import cosine_equivalent
from ..auditor.schedules import canary_rounds, participation_schedule
from ..auditor.statistics import CosineTracker
from .dpfedavg import AdaptiveClipNorm, ServerOptimizer, aggregate_round

__all__ = [
    "DPBug",
    "FedAvgSimulation",
    "FedAvgAuditResult",
    "simulate_dpfedavg_audit",
    "claimed_sampling_probability",
    "sample_null_cosines",
    "gaussian_mechanism_scores",
    "claimed_epsilons",
    "simulation_claims",
    "audit_epsilons",
    "VALID_LOWER_BOUNDS",
]


@dataclass(frozen=True)
class FedAvgSimulation:
    """Configuration of one simulated DP-FedAvg audit.

    Attributes
    ----------
    dim : int
        Model dimension ``d``.
    num_clients : int
        Real clients ``N``.
    clients_per_round : int
        Expected cohort ``m`` (noise calibration and the divisor of the noisy sum).
    num_rounds : int
        ``T``.
    num_canaries : int
        ``k`` (each seen with probability 1/2).
    canary_repeats : int
        Rounds each seen canary is presented in (what the accountant is told).
    participation : str
        Schedule of the real clients (``poisson``, ``uniform``, ``shuffled``).
    noise_multiplier : float
        ``z``.
    clip_norm : float
        ``S``.
    learning_rate, momentum : float
        Server optimizer.
    client_signal, client_noise : float
        Real client update ``S * (a u + b g / sqrt(d))`` before clipping.
    delta : float
        Target delta.
    bug : DPBug
        Injected error.
    bug_factor : float
        Size of the error (cohort factor, participation factor, canary norm factor; for
        ``noise_scale`` the factor on the noise std, e.g. 0.5).
    sampling_probability : float, optional
        Poisson ``q`` of the real clients (and of the claim); default the service's
        ``m / (N + k/2)``. Fix it to compare runs with different ``k`` at the same cohort.
    adaptive_clipping : bool
        Track the clip norm by quantile (:class:`flaudit.server.dpfedavg.AdaptiveClipNorm`, starting at
        ``clip_norm``, target quantile 0.5, rate 0.2) with a noised count of std
        ``clipped_count_stddev`` (default ``m / 20``, as the service).
    clipped_count_stddev : float, optional
        See ``adaptive_clipping``.
    canary_family : CanaryFamily, optional
        Canary family (as the spec's ``canary_family``); ``None``: orthogonal where ``k <= d``.
    """

    dim: int = 10_000
    num_clients: int = 1000
    clients_per_round: int = 50
    num_rounds: int = 10
    num_canaries: int = 500
    canary_repeats: int = 1
    participation: str = "poisson"
    noise_multiplier: float = 1.0
    clip_norm: float = 1.0
    learning_rate: float = 1.0
    momentum: float = 0.0
    client_signal: float = 0.5
    client_noise: float = 1.0
    delta: float = 1e-5
    bug: DPBug = DPBug.none
    bug_factor: float = 4.0
    sampling_probability: float | None = None
    adaptive_clipping: bool = False
    clipped_count_stddev: float | None = None
    canary_family: CanaryFamily | None = None

    def __post_init__(self) -> None:
        for name in (
            "dim",
            "num_clients",
            "clients_per_round",
            "num_rounds",
            "num_canaries",
            "canary_repeats",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.dim < 2:
            raise ValueError(f"dim must be >= 2, got {self.dim}")
        if self.num_canaries < 4:
            raise ValueError(f"num_canaries must be >= 4, got {self.num_canaries}")
        if not (self.noise_multiplier >= 0 and math.isfinite(self.noise_multiplier)):
            raise ValueError(
                f"noise_multiplier must be a finite number >= 0, got {self.noise_multiplier}"
            )
        if not (self.clip_norm > 0 and math.isfinite(self.clip_norm)):
            raise ValueError(f"clip_norm must be a finite number > 0, got {self.clip_norm}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")
        if self.client_signal < 0 or self.client_noise < 0:
            raise ValueError("client_signal and client_noise must be >= 0")
        if DPBug(self.bug) is DPBug.noise_scale:
            if not (0 < self.bug_factor and math.isfinite(self.bug_factor)):
                raise ValueError(f"bug_factor must be > 0 for noise_scale, got {self.bug_factor}")
        elif not self.bug_factor >= 1:
            raise ValueError(f"bug_factor must be >= 1, got {self.bug_factor}")
        if self.sampling_probability is not None and not 0 < self.sampling_probability <= 1:
            raise ValueError(
                f"sampling_probability must be in (0, 1], got {self.sampling_probability}"
            )
        object.__setattr__(self, "bug", DPBug(self.bug))
        if self.canary_family is not None:
            object.__setattr__(self, "canary_family", CanaryFamily(self.canary_family))

    def with_(self, **changes) -> FedAvgSimulation:
        """A copy with some fields changed."""
        return replace(self, **changes)

    def count_stddev(self) -> float:
        """Noise std of the clipped count under adaptive clipping (default ``m / 20``)."""
        if self.clipped_count_stddev is not None:
            return float(self.clipped_count_stddev)
        return self.clients_per_round / 20

    @property
    def accounted_noise_multiplier(self) -> float:
        """``z``, or ``z_total = (z^-2 + sigma_b^-2)^-1/2`` under adaptive clipping (as
        :attr:`flaudit.auditor.spec.AuditSpec.accounted_noise_multiplier`)."""
        z = self.noise_multiplier
        if not self.adaptive_clipping or z == 0:
            return z
        return (z**-2 + self.count_stddev() ** -2) ** -0.5


def claimed_sampling_probability(config: FedAvgSimulation) -> float:
    """``q`` as the service computes it (``AuditSpec.sampling_probability``): ``m / (N + k/2)``,
    unless the configuration fixes ``sampling_probability``."""
    if config.sampling_probability is not None:
        return float(config.sampling_probability)
    return min(1.0, config.clients_per_round / (config.num_clients + config.num_canaries / 2))


@dataclass(frozen=True)
class FedAvgAuditResult:
    """Canary statistics of one simulated run.

    Attributes
    ----------
    final_cosines : numpy.ndarray
        ``cos(c_j, theta_T - theta_0)`` per canary.
    max_cosines : numpy.ndarray
        ``max_t cos(c_j, Delta_t)`` per canary.
    seen : numpy.ndarray
        Seen mask.
    known_rounds_scores : numpy.ndarray
        (k,) known-rounds scores at the end (:class:`flaudit.auditor.claims.known_rounds.KnownRoundsStatistic`
        on the released aggregates ``rho_bar_t``; NaN for a canary never counted).
    known_rounds_history, known_rounds_counts_history, max_cosines_history : numpy.ndarray
        (T, k): the known-rounds scores, their participation counts and the running max cosines
        after each round, for alarms evaluated at every look.
    known_rounds_rounds : RoundSums
        The per-round sums of the exact claim test at the end
        (:attr:`flaudit.auditor.claims.known_rounds.KnownRoundsStatistic.rounds`).
    known_rounds_round_of : numpy.ndarray
        The round each entry of ``known_rounds_rounds`` comes from (:meth:`rounds_at`).
    scale_dof : int
        Degrees of freedom of the noise scale the statistics share.
    canary_participations : int
        Rounds each seen canary actually joined.
    claimed_participations : int
        Rounds the accountant was told (``canary_repeats``).
    mean_cohort_size : float
        Real clients + canaries per round, on average.
    num_rounds : int, optional
        Rounds the max-over-rounds cosines cover.
    """

    final_cosines: np.ndarray = field(repr=False)
    max_cosines: np.ndarray = field(repr=False)
    seen: np.ndarray = field(repr=False)
    canary_participations: int
    claimed_participations: int
    mean_cohort_size: float
    dim: int
    known_rounds_scores: np.ndarray = field(default=None, repr=False)
    known_rounds_history: np.ndarray = field(default=None, repr=False)
    known_rounds_counts_history: np.ndarray = field(default=None, repr=False)
    max_cosines_history: np.ndarray = field(default=None, repr=False)
    num_rounds: int | None = None
    known_rounds_rounds: object = field(default=None, repr=False)
    known_rounds_round_of: np.ndarray = field(default=None, repr=False)
    scale_dof: int | None = None

    def rounds_at(self, t: int):
        """The exact claim test's per-round sums after round ``t`` (the look after round t)."""

        keep = self.known_rounds_round_of <= t
        rounds = self.known_rounds_rounds
        return RoundSums(rounds.sums[keep], rounds.counts[keep], rounds.dof)


def _client_updates(
    config: FedAvgSimulation, count: int, direction: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    d, s = config.dim, config.clip_norm
    noise = rng.standard_normal((count, d), dtype=np.float32)
    noise *= np.float32(config.client_noise * s / math.sqrt(d))
    noise += np.float32(config.client_signal * s) * direction.astype(np.float32)
    return noise


def simulate_dpfedavg_audit(config: FedAvgSimulation, *, seed: int) -> FedAvgAuditResult:
    """Run one simulated DP-FedAvg training with canaries and return the canary statistics.

    Parameters
    ----------
    config : FedAvgSimulation
        The run (including the injected bug, if any).
    seed : int
        Master seed of this run: keys the canaries (as the service's secret seed does), the
        schedule, the clients and the noise. Never printed.

    Returns
    -------
    FedAvgAuditResult
    """
    if not isinstance(config, FedAvgSimulation):
        raise ValueError(f"config must be a FedAvgSimulation, got {type(config).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError("seed must be a non-negative integer")
    seed = int(seed)
    bug, d, s_clip, m = config.bug, config.dim, config.clip_norm, config.clients_per_round
    k = config.num_canaries
    mask = seen_mask(seed, k)
    seen_idx = np.flatnonzero(mask)
    root = np.random.SeedSequence(entropy=seed, spawn_key=(0xF1DE,))
    sched_seed, client_ss, noise_ss = root.spawn(3)
    client_rng = np.random.default_rng(client_ss)
    noise_rng = np.random.default_rng(noise_ss)

    repeats = config.canary_repeats
    cohort = m
    participation = config.participation
    q = claimed_sampling_probability(config)
    if bug is DPBug.extra_participation:
        repeats = int(round(config.canary_repeats * config.bug_factor))
        q = min(1.0, q * config.bug_factor)
    elif bug is DPBug.cohort_larger:
        cohort = int(round(m * config.bug_factor))
        q = min(1.0, q * config.bug_factor)
    elif bug is DPBug.batch_then_shuffle:
        participation = "batch_then_shuffle"
    repeats = min(repeats, config.num_rounds)
    schedule = participation_schedule(
        num_clients=config.num_clients,
        num_seen_canaries=int(seen_idx.size),
        num_rounds=config.num_rounds,
        participation=participation,
        clients_per_round=cohort,
        sampling_probability=q if participation == "poisson" else None,
        canary_repeats=repeats,
        seed=int(sched_seed.generate_state(1)[0]),
    )
    family = resolve_canary_family(config.canary_family, num_canaries=k, dim=d)
    # the same canaries the tracker regenerates
    seen_vectors = canary_vectors(seed, seen_idx, d, family=family)
    tracker = CosineTracker(seed, k, d, family=family, cache_bytes=k * d * 4)
    # unseen canaries get rounds by the same rule as the claimed schedule (never inserted)
    unseen_idx = np.flatnonzero(~mask)
    unseen_rounds = canary_rounds(
        unseen_idx.size,
        num_rounds=config.num_rounds,
        repeats=min(config.canary_repeats, config.num_rounds),
        rng=np.random.default_rng(sched_seed.spawn(1)[0]),
    )
    known = KnownRoundsStatistic(k, dim=d, scale_dof=tracker.scale_dof)
    round_of: list[int] = []
    known_history = np.empty((config.num_rounds, k))
    counts_history = np.zeros((config.num_rounds, k), dtype=np.int64)
    max_history = np.empty((config.num_rounds, k))
    clipper = (
        AdaptiveClipNorm(initial_clip_norm=s_clip, count_stddev=config.count_stddev())
        if config.adaptive_clipping
        else None
    )
    direction = client_rng.standard_normal(d)
    direction /= np.linalg.norm(direction)
    optimizer = ServerOptimizer(learning_rate=config.learning_rate, momentum=config.momentum)
    theta0 = np.zeros(d, dtype=np.float32)
    theta = theta0
    cohort_sizes = []
    for t in range(1, config.num_rounds + 1):
        if clipper is not None:
            s_clip = clipper.clip_norm
        clients = schedule.real_clients(t)
        inserted = schedule.canaries(t)
        canaries = seen_vectors[inserted]
        updates = list(_client_updates(config, clients.size, direction, client_rng))
        cohort_sizes.append(clients.size + canaries.shape[0])
        if bug is DPBug.no_clipping:
            noise_only = aggregate_round(
                client_updates=[],
                canary_directions=[],
                clip_norm=s_clip,
                noise_multiplier=config.noise_multiplier,
                expected_cohort_size=m,
                dim=d,
                rng=noise_rng,
            )
            raw = np.zeros(d)
            for u in updates:
                raw += u
            raw += (config.bug_factor * s_clip) * canaries.astype(np.float64).sum(axis=0)
            update = noise_only.update + raw / m
        else:
            agg = aggregate_round(
                client_updates=updates,
                canary_directions=canaries,
                clip_norm=s_clip,
                noise_multiplier=(
                    0.0
                    if bug is DPBug.no_noise
                    else config.noise_multiplier * config.bug_factor
                    if bug is DPBug.noise_scale
                    else config.noise_multiplier
                ),
                expected_cohort_size=m,
                dim=d,
                rng=noise_rng,
            )
            update = agg.update
            if bug is DPBug.noise_divided_twice:
                signal = agg.clipped_sum / m
                update = signal + (agg.update - signal) / m
            if clipper is not None:
                clipper.update(
                    num_unclipped=len(updates) - agg.num_clipped,
                    expected_count=max(m - seen_idx.size * repeats / config.num_rounds, 1.0),
                    rng=noise_rng,
                )
        # the released aggregate rho_bar_t (before the server optimizer) feeds the known rounds
        participants = np.zeros(k, dtype=bool)
        participants[seen_idx[inserted]] = True
        participants[unseen_idx[np.any(unseen_rounds == t - 1, axis=1)]] = True
        entries = len(known.rounds.sums)
        known.update(tracker.all_cosines(update.astype(np.float32)), participants, ~mask)
        round_of += [t] * (len(known.rounds.sums) - entries)
        known_history[t - 1] = known.scores
        counts_history[t - 1] = known.num_participations
        theta, delta_t = optimizer.step(theta, update)
        tracker.update(delta_t)
        max_history[t - 1] = tracker.max_cosines
    tracker.finalize(theta, theta0)
    counts = schedule.participation_counts()[schedule.num_clients :]
    return FedAvgAuditResult(
        final_cosines=tracker.final_cosines,
        max_cosines=tracker.max_cosines,
        seen=mask,
        canary_participations=int(counts.max()) if counts.size else 0,
        claimed_participations=config.canary_repeats,
        mean_cohort_size=float(np.mean(cohort_sizes)),
        dim=d,
        known_rounds_scores=known.scores,
        known_rounds_history=known_history,
        known_rounds_counts_history=counts_history,
        max_cosines_history=max_history,
        num_rounds=config.num_rounds,
        known_rounds_rounds=known.rounds,
        known_rounds_round_of=np.array(round_of, dtype=np.int64),
        scale_dof=tracker.scale_dof,
    )


def simulation_claims(config: FedAvgSimulation) -> list:
    """The trade-off claims the service would test for this configuration
    (:func:`flaudit.auditor.claims.audit_claims` on the honest settings: a bug is never known
    to the claim): known-rounds Gaussian DP ``sqrt(canary_repeats) / z_total`` and, under
    Poisson participation, the Poisson-subsampled curve with ``q`` as the service computes it."""
    from types import SimpleNamespace

    return audit_claims(
        SimpleNamespace(
            accounted_noise_multiplier=config.accounted_noise_multiplier,
            noise_multiplier=config.noise_multiplier,
            canary_repeats=config.canary_repeats,
            participation=config.participation,
            sampling_probability=claimed_sampling_probability(config),
            num_rounds=config.num_rounds,
        )
    )


# -- Gaussian mechanism with seen and unseen canaries ---------------------------------------


def sample_null_cosines(d: int, size: int, *, rng: np.random.Generator) -> np.ndarray:
    """Exact null cosines: ``cos(c, v)`` for ``c`` uniform on the sphere of R^d, any fixed ``v``.

    ``(1 + tau) / 2 ~ Beta((d - 1)/2, (d - 1)/2)`` (Andrew et al. Thm 3.1).
    """
    if d < 2:
        raise ValueError(f"d must be >= 2, got {d}")
    a = (d - 1) / 2.0
    return 2.0 * rng.beta(a, a, size=size) - 1.0


def gaussian_mechanism_scores(
    sigma: float, d: int, k: int, *, seed: int, family: CanaryFamily | str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """One Gaussian-mechanism audit with a random seen/unseen split.

    Each of ``k`` canaries is seen with probability 1/2; the seen ones are all added to the
    release ``rho = sum_seen c_j + N(0, sigma^2 I_d)`` (sensitivity 1, so the true epsilon is the
    Gaussian mechanism's at ``sigma``).

    ``gaussian`` family: seen cosines come from :func:`flaudit.auditor.claims.gaussian.gaussian_mechanism_cosines`
    (exact projected simulation); an unseen canary is independent of ``rho``, so its cosine
    follows the exact null (:func:`sample_null_cosines`). ``orthogonal`` family (the default
    where ``k <= d``): in the canaries' coordinates ``rho`` is ``1 + sigma u_j`` (seen),
    ``sigma u_j`` (unseen) and ``sigma u_i`` on the ``d - k`` unused columns; the statistic is
    the tracker's null-standardized cosine (:func:`flaudit.auditor.statistics.null_standardized_cosines`:
    studentized by the unused columns' scale, mapped to the cosine of equal probability),
    simulated exactly in ``O(k)``.

    Returns
    -------
    scores, seen : numpy.ndarray
        Cosine per canary and the seen mask.
    """
    if k < 4:
        raise ValueError(f"k must be >= 4, got {k}")
    family = resolve_canary_family(family, num_canaries=int(k), dim=int(d))
    rng = np.random.default_rng(np.random.SeedSequence(entropy=int(seed), spawn_key=(0x6A55,)))
    seen = rng.random(k) < 0.5
    while seen.sum() < 2 or (~seen).sum() < 2:
        seen = rng.random(k) < 0.5
    n_seen = int(seen.sum())
    scores = np.empty(k)
    if family is CanaryFamily.orthogonal:
        y = sigma * rng.standard_normal(k) + seen
        if d == k or sigma == 0:  # no energy where no canary is: plain cosines
            return np.clip(y / np.linalg.norm(y), -1.0, 1.0), seen
        null_energy = sigma**2 * float(rng.chisquare(d - k)) / (d - k)
        return cosine_equivalent(y / math.sqrt(null_energy), d - k, d), seen
    scores[seen] = gaussian_mechanism_cosines(
        sigma, d, n_seen, seed=int(rng.integers(2**62)), family=family
    )
    scores[~seen] = sample_null_cosines(d, k - n_seen, rng=rng)
    return scores, seen


# -- what the service would report for a simulated run ---------------------------------------


def claimed_epsilons(config: FedAvgSimulation) -> dict[str, float]:
    """The analytic epsilons the service shows for this configuration (``analytic_results``):
    dp-accounting for the configured ``z``, ``q = m / (N + k/2)``, ``T`` (Poisson-subsampled, RDP
    and PLD) and the known-rounds bound (Gaussian mechanism composed ``canary_repeats`` times),
    the reference Andrew et al. compare against. Keys: ``poisson_rdp``, ``poisson_pld``,
    ``known_rounds``."""

    results = analytic_epsilon(
        config.noise_multiplier,
        claimed_sampling_probability(config),
        config.num_rounds,
        config.delta,
        participations=config.canary_repeats,
    )
    out = {}
    for r in results:
        key = (
            r.threat_model
            if r.threat_model == "known_rounds"
            else f"poisson_{r.details['accountant']}"
        )
        out[key] = r.epsilon
    return out


def audit_epsilons(
    result: FedAvgAuditResult, *, delta: float, one_run: bool = True
) -> dict[str, float]:
    """Every estimate :func:`flaudit.auditor.claims.summarize` gives for a simulated run, flattened
    to ``{"<threat model>/<estimator>/<variance or correction>": epsilon}``."""

    summary = summarize(
        AuditLook(
            seen=result.seen,
            dim=result.dim,
            delta=delta,
            max_cosines=result.max_cosines,
            final_cosines=result.final_cosines,
            one_run=one_run,
            num_rounds=result.num_rounds,
        )
    )
    out = {}
    for e in summary.estimates:
        label = e.variance.value if e.estimator.value == "two_gaussian" else e.correction.value
        out[f"{e.threat_model}/{e.estimator.value}/{label}"] = e.epsilon
    return out


#: The bounds valid at their stated confidence (corrected threshold choice, or the one-run bound).
VALID_LOWER_BOUNDS = (
    "final_model/lower_bound/bonferroni",
    "all_iterates/lower_bound/bonferroni",
    "final_model/one_run/bonferroni",
    "all_iterates/one_run/bonferroni",
)
