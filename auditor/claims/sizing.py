"""Sizing an audit to its federation (issue #28, "the audit sizes itself"). Pure: numbers in,
numbers out.

**The cap.** Seen canaries take cohort slots (:func:`flaudit.auditor.schedules.canary_rounds`):
each of ``s`` seen canaries is inserted once per period of ``floor(T / r)`` rounds, at most
``n = clients_per_round`` per round, so the shortest period holds ``n * floor(T / r)`` of them.
Which canaries are seen is a fair coin per canary and secret, so the only ``k`` whose seen
canaries *always* fit is

    k <= n * floor(T / r)                                                  (:func:`max_canaries`)

(e.g. 2 sampled clients per round, 5 rounds, r = 1: at most 10). Above it the schedule fits only
when the secret draw seats few enough canaries, so the service refuses such a ``k`` outright
rather than by a coin flip. ``max_canary_fraction = f < 1`` adds ``k/2 <= f (N + k/2)``, i.e.
``k <= 2 f N / (1 - f)`` for ``N`` real clients.

**The choice** (``num_canaries = "auto"``, :func:`choose_canaries`). The design's test
(:mod:`.design`) catches noise x ``s`` in ``power`` of runs iff ``(1/s - 1) sqrt(N_seen) / z >=
z_{1-a} + z_power`` with ``N_seen = r * seen_low(k)``; the claim is *testable* when it catches
noise x 0.5. For each ``r`` in 1, 2, 4, 8 (``r <= T``) take the smallest testable ``k`` (at
least :data:`MIN_AUTO_CANARIES`, at most the cap); of those, the one that displaces the fewest
real clients (``r k / 2`` expected slots). When no ``r`` is testable within the cap, take the
cap with the ``r`` that detects the smallest bug, and say how many rounds (or sampled clients
per round) would make it testable (:func:`capped_advice`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from scipy import special

from ..noise_calibration import canary_noise_multiplier, clip_growth_bound
from .alarm import ALARM_ALPHA, look_level
from .tiers import AlarmTest

__all__ = [
    "AUTO",
    "CLEAR_BUG_NOISE_SCALE",
    "MIN_AUTO_CANARIES",
    "CanarySizing",
    "auto_sizing",
    "canaries_needed",
    "check_num_canaries",
    "capped_advice",
    "choose_canaries",
    "clients_needed",
    "detectable_noise_scale",
    "max_canaries",
    "rounds_needed",
    "seen_low",
]

#: The value of ``num_canaries`` that asks the audit to size itself.
AUTO = "auto"
#: An audit is "testable" when it catches noise x 0.5 (half the claimed noise) in 95% of runs.
CLEAR_BUG_NOISE_SCALE = 0.5
#: ``"auto"`` never picks fewer canaries than this (when the cap allows): the estimates beside
#: the claim test (fitted Gaussians, ε_lo) need some canaries on each side.
MIN_AUTO_CANARIES = 32
#: The spec's largest ``num_canaries``.
MAX_NUM_CANARIES = 1_000_000
#: ``canary_repeats`` the spec allows.
REPEATS = (1, 2, 4, 8)
#: The one-sided 95% normal quantile behind :func:`seen_low`.
_SEEN_Z = 1.645
#: How far :func:`rounds_needed` / :func:`clients_needed` look (x the current value).
_SEARCH_FACTOR = 1000


def check_num_canaries(value: Any, name: str = "num_canaries") -> int | str:
    """``value`` as a number of canaries (an integer from 2 to 1000000) or ``"auto"``.

    Raises
    ------
    ValueError
        Naming ``name``.
    """
    if value == AUTO:
        return AUTO
    if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= MAX_NUM_CANARIES:
        raise ValueError(
            f'{name} must be an integer from 2 to {MAX_NUM_CANARIES} or "{AUTO}", got {value!r}'
        )
    return int(value)


def seen_low(k: int) -> int:
    """Lower 5% quantile of Bin(k, 1/2) (normal approximation, at least 0): the seen canaries
    the design counts on."""
    return max(0, int(math.floor(k / 2 - _SEEN_Z * math.sqrt(k) / 2)))


def max_canaries(
    *,
    clients_per_round: int,
    num_rounds: int,
    canary_repeats: int = 1,
    num_clients: int | None = None,
    max_canary_fraction: float = 1.0,
) -> int:
    """The largest ``k`` whose seen canaries always fit the federation (module docstring): 0
    when ``canary_repeats > num_rounds``."""
    n, t, r = int(clients_per_round), int(num_rounds), int(canary_repeats)
    cap = min(n * (t // r), MAX_NUM_CANARIES)
    f = float(max_canary_fraction)
    if num_clients is not None and f < 1:
        cap = min(cap, int(math.floor(2 * f * int(num_clients) / (1 - f) + 1e-9)))
    return max(cap, 0)


def _z_sum(num_rounds: int, alpha: float, power: float) -> float:
    level = look_level(
        AlarmTest.known_rounds_normal_scores, num_rounds + 1, num_rounds + 1, alpha=alpha
    )
    return float(special.ndtri(1 - level) + special.ndtri(power))


def detectable_noise_scale(
    *,
    noise_multiplier: float,
    num_canaries: int,
    canary_repeats: int,
    num_rounds: int,
    alpha: float = ALARM_ALPHA,
    power: float = 0.95,
    growth: float = 1.0,
) -> float | None:
    """Largest ``s`` such that noise x ``s`` is caught in ``power`` of runs (None: too few
    canaries are seen, or no noise is claimed). ``growth``: the canaries may meet up to that
    many times the noise their norm needs (:func:`~flaudit.auditor.noise_calibration.
    clip_growth_bound`), so the factor is divided by it."""
    z = float(noise_multiplier)
    n_seen = seen_low(int(num_canaries)) * int(canary_repeats)
    if z <= 0 or n_seen <= 0:
        return None
    return 1.0 / (1.0 + _z_sum(num_rounds, alpha, power) * z / math.sqrt(n_seen)) / growth


def canaries_needed(
    *,
    noise_multiplier: float,
    canary_repeats: int,
    num_rounds: int,
    alpha: float = ALARM_ALPHA,
    power: float = 0.95,
    scale: float = CLEAR_BUG_NOISE_SCALE,
) -> int:
    """The smallest ``k`` that catches noise x ``scale`` in ``power`` of runs (no cap).
    ``scale >= 1`` (a growth bound times the factor wanted) is never caught: more than any
    cap."""
    z, r = float(noise_multiplier), int(canary_repeats)
    if z <= 0:
        raise ValueError("noise_multiplier must be > 0 (without noise there is no claim)")
    if scale >= 1:
        return MAX_NUM_CANARIES + 1
    need = math.ceil((_z_sum(num_rounds, alpha, power) * z / (1.0 / scale - 1.0)) ** 2 - 1e-9)
    per_canary = math.ceil(need / r)  # seen canaries needed
    # seen_low(k) >= p  <=>  k/2 - c*sqrt(k) >= p (p an integer): solve for sqrt(k), then
    # step over the float rounding (seen_low is nondecreasing: a few steps at most).
    c = _SEEN_Z / 2
    k = max(2, math.ceil((c + math.sqrt(c * c + 2 * per_canary)) ** 2))
    if k > 2**48:  # beyond float's unit steps (and far beyond any cap): the closed form
        return k
    while seen_low(k) < per_canary:
        k += 1
    while k > 2 and seen_low(k - 1) >= per_canary:
        k -= 1
    return k


def _testable_within(
    noise_multiplier: float,
    *,
    clients_per_round: int,
    num_rounds: int,
    num_clients: int | None = None,
    max_canary_fraction: float = 1.0,
    alpha: float = ALARM_ALPHA,
    power: float = 0.95,
    growth: float = 1.0,
) -> tuple[int, int] | None:
    """``(k, r)`` of the fewest displaced slots that is testable within the cap, or None."""
    best = None
    for r in REPEATS:
        if r > num_rounds:
            break
        cap = max_canaries(
            clients_per_round=clients_per_round,
            num_rounds=num_rounds,
            canary_repeats=r,
            num_clients=num_clients,
            max_canary_fraction=max_canary_fraction,
        )
        k = canaries_needed(
            noise_multiplier=noise_multiplier,
            canary_repeats=r,
            num_rounds=num_rounds,
            alpha=alpha,
            power=power,
            scale=CLEAR_BUG_NOISE_SCALE * growth,
        )
        if k <= cap and (best is None or k * r < best[0] * best[1]):
            best = (k, r)
    return best


@dataclass(frozen=True)
class CanarySizing:
    """The canaries ``"auto"`` chose for one federation and claim.

    Attributes
    ----------
    num_canaries, canary_repeats : int
        The choice (``num_canaries`` 0 when the federation has no slot for a canary).
    max_canaries : int
        The cap at that ``canary_repeats`` (:func:`max_canaries`).
    testable : bool
        Whether the choice catches noise x 0.5 in ``power`` of runs.
    detectable_noise_scale : float or None
        What the choice catches (:func:`detectable_noise_scale`).
    capped : bool
        The cap, not the claim, set ``num_canaries`` (the claim needed more).
    """

    num_canaries: int
    canary_repeats: int
    max_canaries: int
    testable: bool
    detectable_noise_scale: float | None
    capped: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_canaries(
    *,
    noise_multiplier: float,
    num_rounds: int,
    clients_per_round: int,
    num_clients: int | None = None,
    max_canary_fraction: float = 1.0,
    alpha: float = ALARM_ALPHA,
    power: float = 0.95,
    growth: float = 1.0,
) -> CanarySizing:
    """The canaries and repeats of ``num_canaries = "auto"`` (module docstring).

    ``noise_multiplier``: the one the canaries meet (0: no claim; then the cap, at most
    :data:`MIN_AUTO_CANARIES`, with ``canary_repeats = 1``); ``growth``: the adaptive clip
    norm's bound (:func:`~flaudit.auditor.noise_calibration.clip_growth_bound`).
    """
    fed = {
        "clients_per_round": int(clients_per_round),
        "num_rounds": int(num_rounds),
        "num_clients": num_clients,
        "max_canary_fraction": float(max_canary_fraction),
    }

    def sized(k: int, r: int, *, capped: bool) -> CanarySizing:
        cap = max_canaries(canary_repeats=r, **fed)
        s = detectable_noise_scale(
            noise_multiplier=noise_multiplier,
            num_canaries=k,
            canary_repeats=r,
            num_rounds=num_rounds,
            alpha=alpha,
            power=power,
            growth=growth,
        )
        return CanarySizing(k, r, cap, s is not None and s >= CLEAR_BUG_NOISE_SCALE, s, capped)

    if float(noise_multiplier) <= 0:
        return sized(min(max_canaries(canary_repeats=1, **fed), MIN_AUTO_CANARIES), 1, capped=False)
    best = _testable_within(noise_multiplier, alpha=alpha, power=power, growth=growth, **fed)
    if best is not None:
        k, r = best
        return sized(
            min(max(k, MIN_AUTO_CANARIES), max_canaries(canary_repeats=r, **fed)), r, capped=False
        )
    options = [
        sized(max_canaries(canary_repeats=r, **fed), r, capped=True)
        for r in REPEATS
        if r <= num_rounds
    ]
    return max(options, key=lambda o: (o.detectable_noise_scale or 0.0, -o.canary_repeats))


def _search(feasible, start: int) -> int | None:
    """The smallest integer ``>= start`` where ``feasible`` (monotone) holds, or None when not
    even ``_SEARCH_FACTOR * start`` is."""
    hi = max(start, 1)
    limit = _SEARCH_FACTOR * hi
    while not feasible(hi):
        if hi >= limit:
            return None
        hi = min(2 * hi, limit)
    lo = start
    while lo < hi:
        mid = (lo + hi) // 2
        if feasible(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def _fewest_testable(vary: str, noise_multiplier: float, **federation: Any) -> int | None:
    """The smallest ``federation[vary]`` (``"num_rounds"`` or ``"clients_per_round"``, at
    least its current value) at which ``"auto"`` finds a testable audit; None if none would."""

    def ok(value: int) -> bool:
        return _testable_within(noise_multiplier, **{**federation, vary: value}) is not None

    return _search(ok, int(federation[vary]))


def rounds_needed(
    *, noise_multiplier: float, num_rounds: int, clients_per_round: int, **options: Any
) -> int | None:
    """The fewest rounds (at least ``num_rounds``) with which ``"auto"`` finds a testable
    audit at ``clients_per_round``; None if the population cap forbids it whatever the
    rounds. ``options``: :func:`choose_canaries`'s ``num_clients``, ``max_canary_fraction``,
    ``alpha``, ``power`` and ``growth`` (same defaults)."""
    return _fewest_testable(
        "num_rounds",
        noise_multiplier,
        num_rounds=num_rounds,
        clients_per_round=clients_per_round,
        **options,
    )


def clients_needed(
    *, noise_multiplier: float, num_rounds: int, clients_per_round: int, **options: Any
) -> int | None:
    """The fewest sampled clients per round (at least ``clients_per_round``) with which
    ``"auto"`` finds a testable audit in ``num_rounds`` rounds; None if none would.
    ``options`` as for :func:`rounds_needed`."""
    return _fewest_testable(
        "clients_per_round",
        noise_multiplier,
        num_rounds=num_rounds,
        clients_per_round=clients_per_round,
        **options,
    )


def _federation(spec) -> dict[str, Any] | None:
    """The federation fields of a spec-like object; None when it names no cohort size."""
    n = getattr(spec, "clients_per_round", None)
    if n is None:
        return None
    return {
        "num_rounds": int(spec.num_rounds),
        "clients_per_round": int(n),
        "num_clients": getattr(spec, "num_clients", None),
        "max_canary_fraction": float(getattr(spec, "max_canary_fraction", 1.0) or 1.0),
    }


def auto_sizing(spec, *, alpha: float = ALARM_ALPHA, power: float = 0.95) -> CanarySizing:
    """:func:`choose_canaries` for a spec (an :class:`flaudit.auditor.spec.AuditSpec` or
    anything with ``accounted_noise_multiplier``, ``num_rounds``, ``clients_per_round``,
    ``num_clients`` and ``max_canary_fraction``)."""
    return choose_canaries(
        noise_multiplier=canary_noise_multiplier(spec),
        alpha=alpha,
        power=power,
        growth=clip_growth_bound(spec),
        **_federation(spec),
    )


def spec_cap(spec) -> int | None:
    """:func:`max_canaries` of a spec-like object at its ``canary_repeats`` (None: no cohort
    size known, no cap)."""
    fed = _federation(spec)
    if fed is None:
        return None
    return max_canaries(canary_repeats=int(spec.canary_repeats), **fed)


def capped_advice(
    spec, needed: int, *, alpha: float = ALARM_ALPHA, power: float = 0.95
) -> str | None:
    """What would make ``spec`` testable when the ``needed`` canaries exceed its federation's
    cap: the rounds (or sampled clients per round) with which ``"auto"`` finds a testable
    audit. None when ``needed`` fits the cap (more canaries is the advice) or no cap is known.
    """
    cap = spec_cap(spec)
    if cap is None or needed <= cap:
        return None
    fed = _federation(spec)
    z, g = canary_noise_multiplier(spec), clip_growth_bound(spec)
    n, t, r = fed["clients_per_round"], fed["num_rounds"], int(spec.canary_repeats)
    head = (
        f"The federation allows at most {cap} canaries ({n} sampled clients per round × "
        f"{t // r} rounds per canary period; seen canaries take cohort slots), fewer than "
        f"the {needed} this claim needs"
    )
    if fed["max_canary_fraction"] < 1 and fed["num_clients"] is not None and cap < n * (t // r):
        return (
            f"{head}: allow seen canaries a larger share of the population (now "
            f"{fed['max_canary_fraction']:g}; --max-canary-fraction) or add clients to make "
            "this audit testable."
        )
    options = []
    rounds = rounds_needed(noise_multiplier=z, alpha=alpha, power=power, growth=g, **fed)
    if rounds is not None:
        options.append((f"train {rounds} rounds", {**fed, "num_rounds": rounds}))
    clients = clients_needed(noise_multiplier=z, alpha=alpha, power=power, growth=g, **fed)
    if clients is not None:
        options.append(
            (f"sample {clients} clients per round", {**fed, "clients_per_round": clients})
        )
    if not options:
        return f"{head}; no number of rounds or sampled clients makes it testable."
    words = []
    for text, there in options:  # with the canaries "auto" would choose there
        sized = choose_canaries(noise_multiplier=z, alpha=alpha, power=power, growth=g, **there)
        repeats = (
            f", each seen canary in {sized.canary_repeats} rounds"
            if sized.canary_repeats > 1
            else ""
        )
        words.append(f"{text} ({sized.num_canaries} canaries{repeats})")
    return f"{head}: {' or '.join(words)} to make this audit testable."
