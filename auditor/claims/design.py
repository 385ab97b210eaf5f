"""Audit design: what an audit can detect, from its spec alone (issue #19 item 4).

Pure and fast (closed forms; called on every ``POST /audits`` and by the dashboard's form).
The known-rounds normal-score test (:mod:`flaudit.auditor.claims.normal_scores`) at its final
level ``a`` (:func:`flaudit.auditor.claims.alarm.look_level`) sums the normal scores of all
``N = r * k_seen`` seen participations; its statistic is ``N(N * lam, N)`` when each
participation carries ``lam`` (``1/z`` under the claim). A run whose noise is ``s`` times the
claimed noise carries ``lam / s``, so the test catches it with probability ``>= power`` once

    (1/s - 1) * lam * sqrt(N) >= z_{1-a} + z_{power},

i.e. for every ``s <= s* = 1 / (1 + (z_{1-a} + z_power) / (lam * sqrt(N)))``. ``k_seen`` is
taken at its lower 5% quantile (the seen/unseen split is a fair coin per canary), so the 95%
holds over the split too, to the normal approximation. The earlier looks and the other tests
only add power: the figure is conservative.

That takes each release's noise scale as known. Once the model's size ``d`` is known (``dim``),
the scale has ``nu = d - k`` degrees of freedom and each round's studentized sum is noncentral
t: with ``c = N / T`` seen participations a round, ``delta = sqrt(c) lam`` under the claim and
``D(x) = sqrt(1 + x^2 / (2 nu))`` its spread at noncentrality ``x`` (normal approximation of the
noncentral t, Abramowitz & Stegun 26.7.10), a round's exact normal score is about
``N((delta/s - delta) / D(delta), D(delta/s)^2 / D(delta)^2)`` at noise x ``s``, so the test
catches it with probability ``power`` when

    sqrt(T) (delta/s - delta) = z_{1-a} D(delta) + z_{power} D(delta/s),

which is the known-scale condition at ``nu = inf``; ``s*`` is its largest root (bisection), and
no root (a scale of too few degrees of freedom) means no noise scale is caught in ``power`` of
runs. Checked by Monte Carlo of the exact test (tests/auditor/test_claims_design.py).

Under adaptive clipping as Flower runs it, a round is noised for the clip norm after its update:
the canaries (norm ``C_t``) meet up to ``g`` times the noise their norm needs, on average
(:func:`flaudit.auditor.noise_calibration.clip_growth_bound`), so a run with noise x ``s`` looks
like noise x ``s g`` to them and the factor printed is ``s* / g`` (issue #38).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from typing import Any

from scipy import optimize, special

from ..estimators.gdp import gdp_epsilon
from ..noise_calibration import canary_noise_multiplier, clip_growth_bound
from .alarm import ALARM_ALPHA, look_level
from .fdp import design_guesses, fdp_mu_lo
from .sizing import AUTO, CLEAR_BUG_NOISE_SCALE, canaries_needed, capped_advice, seen_low
from .tiers import AlarmTest

__all__ = ["AuditDesign", "audit_design", "CLEAR_BUG_NOISE_SCALE"]

#: The design of an external audit with ``num_canaries = "auto"`` before its claim.
_PENDING = (
    'Sizes itself when your ServerApp declares its federation (num_canaries = "auto"): '
    "the canaries are chosen then, to catch half the claimed noise in 95% of runs where "
    "the federation allows it."
)


@dataclass(frozen=True)
class AuditDesign:
    """What an audit can detect (see the module docstring).

    Attributes
    ----------
    claim_mu, claim_epsilon : float or None
        The known-rounds claim (``sqrt(r)/z``) and its epsilon at ``delta``; None without a claim.
    delta : float
    detectable_noise_scale : float or None
        Largest ``s`` such that a run adding ``s`` times the claimed noise is caught in
        ``power`` of runs.
    detectable_mu, detectable_epsilon : float or None
        The Gaussian-DP parameter (and epsilon at ``delta``) of that run.
    max_refutable_mu : float or None
        Largest claim the assumption-free tier can refute even with every guess right (the
        normal-score tier has no such ceiling).
    testable : bool
        Whether the audit catches a clear bug (noise x 0.5) in ``power`` of runs.
    summary : str
        One sentence for the page, the CLI and the API.
    advice : str or None
        What would make the audit testable (or stronger).
    expected_seen_participations : int
        ``N`` used above.
    scale_dof : float or None
        ``nu = d - k`` the design accounted for (None: the scale taken as known, ``d`` unknown).
    """

    claim_mu: float | None
    claim_epsilon: float | None
    delta: float
    detectable_noise_scale: float | None
    detectable_mu: float | None
    detectable_epsilon: float | None
    max_refutable_mu: float | None
    testable: bool
    summary: str
    advice: str | None
    expected_seen_participations: int
    power: float
    alpha: float
    scale_dof: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@functools.lru_cache(maxsize=1024)
def _detectable_scale(
    lam: float, n_seen: int, num_rounds: int, z_level: float, z_power: float, dof: float
) -> float | None:
    """``s*`` (module docstring): the largest noise scale the known-rounds test catches in
    ``power`` of runs when each release's scale has ``dof`` degrees of freedom (``inf``: known;
    None: no scale is caught so often)."""
    if math.isinf(dof):
        return 1.0 / (1.0 + (z_level + z_power) / (lam * math.sqrt(n_seen)))
    delta = math.sqrt(n_seen / num_rounds) * lam

    def spread(x: float) -> float:
        return math.sqrt(1.0 + x * x / (2.0 * dof))

    def margin(s: float) -> float:  # > 0: noise x s is caught in more than power of runs
        return (
            math.sqrt(num_rounds) * (delta / s - delta)
            - z_level * spread(delta)
            - z_power * spread(delta / s)
        )

    # margin(1) < 0; scan down from 1 for the first scale that is caught, then bisect
    grid = [1.0 - 0.01 * i for i in range(1, 100)] + [10.0 ** (-e) for e in range(2, 13)]
    prev = 1.0
    for s in grid:
        if margin(s) > 0:
            return float(optimize.brentq(margin, s, prev, xtol=1e-12))
        prev = s
    return None


@functools.lru_cache(maxsize=256)
def _max_refutable_mu(guesses_per_end: int, k: int, level: float) -> float:
    """The f-DP tier's ``mu_lo`` with every guess right (the slow part of the design: a
    bisection over the guessing-game recursion; cached, the service asks on every POST)."""
    return fdp_mu_lo(2 * guesses_per_end, 2 * guesses_per_end, k, level)


def _round_down(value: float, digits: int = 2) -> float:
    """``value > 0`` rounded down to ``digits`` significant digits (a promise "catches noise x
    s or smaller" stays true for a smaller ``s``). A relative 1e-9 absorbs float error in the
    product (0.29 * 100 = 28.999...)."""
    p = digits - 1 - math.floor(math.log10(value))
    return math.floor(value * 10.0**p * (1 + 1e-9)) / 10.0**p


def _round_up(value: float, digits: int = 3) -> str:
    """``value`` rounded up to ``digits`` significant digits, as text ("μ ≥ x" stays true for a
    larger ``x``); ``inf`` as ∞."""
    if not math.isfinite(value):
        return "∞"
    if value <= 0:
        return "0"
    p = digits - 1 - math.floor(math.log10(value))
    return f"{math.ceil(value * 10.0**p * (1 - 1e-9)) / 10.0**p:.{digits}g}"


def audit_design(
    spec, *, alpha: float = ALARM_ALPHA, power: float = 0.95, dim: int | None = None
) -> AuditDesign:
    """The audit design of ``spec`` (an :class:`flaudit.auditor.spec.AuditSpec`, or anything with
    ``noise_multiplier`` (the update noise), ``canary_repeats``, ``num_canaries``, ``num_rounds`` and
    ``delta``); ``dim``, the model's size once known, accounts for the noise scale's
    ``d - k`` degrees of freedom (module docstring)."""

    z = canary_noise_multiplier(spec)  # the update noise: what the canaries meet
    # adaptive clipping as Flower runs it: a round noised for the next clip norm, up to this
    # many times what the canaries' norm needs; a bug x s looks like x s*growth to them
    growth = clip_growth_bound(spec)
    r = int(spec.canary_repeats)
    delta = float(spec.delta)
    if spec.num_canaries == AUTO:  # an external audit before its ServerApp declared the claim
        return AuditDesign(
            None, None, delta, None, None, None, None, True, _PENDING, None, 0, power, alpha
        )
    k = int(spec.num_canaries)
    n_seen = seen_low(k) * r
    if z == 0:
        return AuditDesign(
            None,
            None,
            delta,
            None,
            None,
            None,
            None,
            False,
            "No DP claim (noise multiplier 0): there is nothing to test.",
            None,
            n_seen,
            power,
            alpha,
        )
    lam = 1.0 / z
    mu = math.sqrt(r) * lam
    eps = float(gdp_epsilon(mu, delta))
    level = look_level(
        AlarmTest.known_rounds_normal_scores, spec.num_rounds + 1, spec.num_rounds + 1, alpha=alpha
    )
    z_level, z_power = float(special.ndtri(1 - level)), float(special.ndtri(power))
    dof = math.inf if dim is None or int(dim) <= k else float(int(dim) - k)
    s_claim = (
        _detectable_scale(lam, n_seen, max(1, int(spec.num_rounds)), z_level, z_power, dof)
        if n_seen > 0
        else None
    )
    if s_claim is not None:  # the factor is on the noise the canaries meet (module docstring)
        s_star = s_claim / growth
        det_mu = mu / s_star
        det_eps = float(gdp_epsilon(det_mu, delta))
    else:
        s_star = det_mu = det_eps = None
    g = design_guesses(k)
    fdp_level = look_level(
        AlarmTest.known_rounds_fdp_one_run, spec.num_rounds + 1, spec.num_rounds + 1, alpha=alpha
    )
    max_mu = _max_refutable_mu(g, k, fdp_level) if k >= 2 else 0.0
    testable = s_star is not None and s_star >= CLEAR_BUG_NOISE_SCALE
    canaries_clear = canaries_needed(
        noise_multiplier=z,
        canary_repeats=r,
        num_rounds=spec.num_rounds,
        alpha=alpha,
        power=power,
        scale=CLEAR_BUG_NOISE_SCALE * growth,
    )
    # one sentence that also reads as a clause after "this audit" (the verdict embeds it)
    if s_star is None and n_seen > 0:
        summary = (
            f"Cannot catch any bug in {power:.0%} of runs: the noise scale rests on "
            f"d − k = {dof:g} coordinates, too few for {k} canaries."
        )
    elif s_star is None:
        # about half the canaries are seen; in the unluckiest 5% of runs, none are
        summary = (
            f"Cannot catch any bug in {power:.0%} of runs: with {k} canaries, too few are seen."
        )
    else:  # printed toward what the audit keeps: the factor down, the mu and epsilon up
        shown = _round_down(s_star)
        shown_mu = mu / shown  # the run at noise x shown: caught, and more
        factor = f"{shown:.2f}" if shown >= 0.1 else f"{shown:.2g}"
        summary = (
            f"Catches {'only ' if s_star < CLEAR_BUG_NOISE_SCALE else ''}noise × "
            f"{factor} or smaller (μ ≥ {_round_up(shown_mu)}, ε ≥ "
            f"{_round_up(float(gdp_epsilon(shown_mu, delta)))} at δ = {delta:g}) in "
            f"{power:.0%} of runs"
            + (
                f", allowing for adaptive clipping's noise for the next clip norm (up to "
                f"{_round_up(growth)}× what the canaries' norm needs, on average)."
                if growth > 1
                else "."
            )
        )
    advice = None
    known_scale = (
        _detectable_scale(lam, n_seen, 1, z_level, z_power, math.inf) if n_seen > 0 else None
    )
    if not testable and known_scale is not None and known_scale / growth >= CLEAR_BUG_NOISE_SCALE:
        advice = (
            f"The noise scale rests on only d − k = {dof:g} coordinates: fewer canaries "
            "(k well below d/2) would make this audit testable."
        )
    elif not testable:  # more canaries where the federation has slots for them, else more rounds
        advice = capped_advice(spec, canaries_clear, alpha=alpha, power=power) or (
            f"Too few canaries to catch even half the claimed noise: use at least "
            f"{canaries_clear} canaries (or more canary repeats) to make this audit testable."
        )
    return AuditDesign(
        mu,
        eps,
        delta,
        s_star,
        det_mu,
        det_eps,
        max_mu,
        testable,
        summary,
        advice,
        n_seen,
        power,
        alpha,
        None if math.isinf(dof) else dof,
    )
