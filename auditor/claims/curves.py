"""Privacy claims as trade-off curves: Gaussian DP (``mu``-GDP), an (epsilon, delta) curve
(Poisson-subsampled DP-FedAvg from ``dp-accounting``) and "no DP", and :func:`audit_claims`, the one
function that reads an audit's claims off its spec.

A mechanism satisfies the trade-off curve ``f`` when every test separating neighbours has
``FNR >= f(FPR)`` (Dong, Roth & Su 2019). DP-FedAvg gives a canary seen in ``r`` known rounds with
noise multiplier ``z`` exactly ``mu = sqrt(r) / z`` (the update noise ``z_delta`` under adaptive
clipping: the canaries never meet the clipped-count noise).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..estimators._validation import check_delta, check_nonnegative
from ..estimators.gdp import gdp_epsilon
from ..noise_calibration import canary_noise_multiplier, signal_factor
from ..results import ThreatModel, jsonable
from .tradeoff import gdp_tradeoff

__all__ = [
    "GaussianDPClaim",
    "EpsilonDeltaCurveClaim",
    "NoDPClaim",
    "TradeOffClaim",
    "audit_claims",
    "poisson_subsampled_claim",
    "KNOWN_ROUNDS",
    "POISSON_SUBSAMPLED",
]

KNOWN_ROUNDS = ThreatModel.known_rounds
POISSON_SUBSAMPLED = ThreatModel.poisson_subsampled

# -- claims as trade-off curves ----------------------------------------------------------------


@dataclass(frozen=True)
class GaussianDPClaim:
    """``mu``-Gaussian DP: the trade-off curve ``f(alpha) = Phi(Phi^-1(1 - alpha) - mu)``.

    Attributes
    ----------
    mu : float
        ``mu >= 0`` (``inf`` is a claim of nothing).
    threat_model : str
        Which adversary the claim is about (``known_rounds`` for DP-FedAvg's ``sqrt(r)/z``).
    description : str
        One line a user can read.
    """

    mu: float
    threat_model: str = KNOWN_ROUNDS
    description: str = ""
    is_claim = True

    def __post_init__(self) -> None:
        mu = float(self.mu)
        if math.isnan(mu) or mu < 0:
            raise ValueError(f"mu must be >= 0, got {self.mu!r}")
        object.__setattr__(self, "mu", mu)

    def tradeoff(self, alpha) -> np.ndarray:
        """``f(alpha)``: the smallest FNR any test with FPR ``alpha`` may have."""
        return gdp_tradeoff(alpha, self.mu)

    def epsilon(self, delta: float) -> float:
        """The (epsilon, delta) reading of the claim (Dong-Roth-Su conversion)."""
        return gdp_epsilon(self.mu, delta)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "gaussian_dp",
            "mu": jsonable(self.mu),
            "threat_model": self.threat_model,
            "description": self.description,
        }


@dataclass(frozen=True)
class EpsilonDeltaCurveClaim:
    """A trade-off curve from a privacy profile ``delta(epsilon)`` on a grid of epsilons:

        f(alpha) = max_i max(0, 1 - delta_i - e^eps_i alpha, e^-eps_i (1 - delta_i - alpha)).

    Every ``(eps_i, delta_i)`` the mechanism satisfies implies ``FNR >= `` each term, so ``f`` is
    a valid lower envelope of the mechanism's exact curve (tight as the grid gets finer). Used
    for the Poisson-subsampled claim from dp-accounting's privacy loss distribution
    (:func:`poisson_subsampled_claim`).
    """

    epsilons: tuple[float, ...]
    deltas: tuple[float, ...]
    threat_model: str = POISSON_SUBSAMPLED
    description: str = ""
    is_claim = True

    def __post_init__(self) -> None:
        eps = np.asarray(self.epsilons, dtype=np.float64)
        dl = np.asarray(self.deltas, dtype=np.float64)
        if eps.ndim != 1 or eps.shape != dl.shape or eps.size == 0:
            raise ValueError("epsilons and deltas must be non-empty 1-d sequences of equal length")
        if np.any(~np.isfinite(eps)) or np.any(eps < 0) or np.any((dl < 0) | (dl > 1)):
            raise ValueError("epsilons must be finite >= 0 and deltas in [0, 1]")
        object.__setattr__(self, "epsilons", tuple(float(e) for e in eps))
        object.__setattr__(self, "deltas", tuple(float(x) for x in dl))

    def tradeoff(self, alpha) -> np.ndarray:
        a = np.clip(np.asarray(alpha, dtype=np.float64), 0.0, 1.0)
        eps = np.asarray(self.epsilons)[:, None]
        dl = np.asarray(self.deltas)[:, None]
        flat = a.reshape(1, -1)
        one = 1.0 - dl - np.exp(eps) * flat
        two = np.exp(-eps) * (1.0 - dl - flat)
        return np.maximum(np.max(np.maximum(one, two), axis=0), 0.0).reshape(a.shape)

    def epsilon(self, delta: float) -> float:
        """Smallest grid epsilon whose delta is ``<= delta`` (inf when none)."""
        delta = check_delta(delta)
        ok = [e for e, d in zip(self.epsilons, self.deltas) if d <= delta]
        return min(ok) if ok else math.inf

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "epsilon_delta_curve",
            "threat_model": self.threat_model,
            "description": self.description,
            "num_points": len(self.epsilons),
        }


@dataclass(frozen=True)
class NoDPClaim:
    """The audit claims no differential privacy (noise multiplier 0): ``f = 0``, nothing to
    refute, and every report says "no DP claim" instead of staying silent."""

    threat_model: str = KNOWN_ROUNDS
    description: str = "no DP claim: the noise multiplier is 0"
    is_claim = False
    mu = math.inf

    def tradeoff(self, alpha) -> np.ndarray:
        return np.zeros_like(np.asarray(alpha, dtype=np.float64))

    def epsilon(self, delta: float) -> float:
        check_delta(delta)
        return math.inf

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "no_dp_claim",
            "threat_model": self.threat_model,
            "description": self.description,
        }


TradeOffClaim = GaussianDPClaim | EpsilonDeltaCurveClaim | NoDPClaim


def poisson_subsampled_claim(
    noise_multiplier: float,
    sampling_probability: float,
    num_rounds: int,
    *,
    value_discretization_interval: float = 1e-3,
    num_epsilons: int = 200,
) -> EpsilonDeltaCurveClaim | NoDPClaim:
    """The trade-off curve DP-FedAvg claims under Poisson participation: the Poisson-subsampled
    Gaussian (``z``, ``q``) composed ``num_rounds`` times, from dp-accounting's privacy loss
    distribution (pessimistic discretisation, so every ``delta(eps)`` is an upper bound and the
    curve a valid lower envelope). ``noise_multiplier = 0`` gives :class:`NoDPClaim`."""

    z = check_nonnegative(noise_multiplier, "noise_multiplier")
    q = check_nonnegative(sampling_probability, "sampling_probability")
    if not 0 < q <= 1:
        raise ValueError(f"sampling_probability must be in (0, 1], got {sampling_probability!r}")
    if (
        isinstance(num_rounds, bool)
        or not isinstance(num_rounds, (int, np.integer))
        or num_rounds < 1
    ):
        raise ValueError(f"num_rounds must be an integer >= 1, got {num_rounds!r}")
    if z == 0:
        return NoDPClaim(threat_model=POISSON_SUBSAMPLED)
    return _poisson_curve(
        z, q, int(num_rounds), float(value_discretization_interval), int(num_epsilons)
    )


@functools.lru_cache(maxsize=32)
def _poisson_curve(
    z: float, q: float, num_rounds: int, value_discretization_interval: float, num_epsilons: int
) -> EpsilonDeltaCurveClaim:
    """The PLD computation behind :func:`poisson_subsampled_claim`, cached (claims are
    immutable; the service asks for the same audit's claims after every round)."""
    from dp_accounting.pld import privacy_loss_distribution

    pld = privacy_loss_distribution.from_gaussian_mechanism(
        z, sampling_prob=q, value_discretization_interval=value_discretization_interval
    ).self_compose(num_rounds)
    eps_max = max(float(pld.get_epsilon_for_delta(1e-12)), 1e-3)
    epsilons = np.linspace(0.0, eps_max, num_epsilons)
    deltas = np.minimum(np.asarray(pld.get_delta_for_epsilon(epsilons), dtype=np.float64), 1.0)
    return EpsilonDeltaCurveClaim(
        tuple(epsilons),
        tuple(deltas),
        threat_model=POISSON_SUBSAMPLED,
        description=f"dp-accounting PLD: Poisson-subsampled Gaussian (z={z:g}, q={q:g}) composed "
        f"over {num_rounds} rounds, as a trade-off curve from delta(eps) on {num_epsilons} "
        "epsilons",
    )


def audit_claims(
    spec, *, weight_factor: float | None = None, noise_clip_factor: float | None = None
) -> list[TradeOffClaim]:
    """The DP claims of an audit (:class:`flaudit.auditor.spec.AuditSpec`) as trade-off curves: one place
    for the service, ``flaudit run`` and the fidelity suite.

    * ``known_rounds``: ``mu = sqrt(r) / z`` GDP with ``r = spec.canary_repeats`` and ``z`` the
      update noise the canaries meet (``canary_noise_multiplier``: ``z_delta`` under adaptive
      clipping) -- exact for an adversary who knows the canary's rounds and sees every
      released aggregate, for any schedule.
    * ``poisson_subsampled`` (only when ``spec.participation`` is Poisson): the
      Poisson-subsampled curve (:func:`poisson_subsampled_claim`) with
      ``q = spec.sampling_probability`` and ``T = spec.num_rounds``.

    ``weight_factor`` (a weighted FedAvg: the heaviest influence a canary carried, in units of
    the ``C/n`` the noise is calibrated for; None or at most 1: uniform): the claims *at that
    influence*, what correct noise gives a canary that heavy -- ``W * mu`` for the known-rounds
    claim, noise multiplier ``z / W`` for the Poisson-subsampled one (docs/estimators.md,
    "Weighted FedAvg: two answers"). Noise multiplier 0 gives :class:`NoDPClaim` in place of each.

    ``noise_clip_factor`` (the smallest round ``noise_clip_norm / clip_norm``; None or at least 1:
    every round noised for its clip norm): the claims of the mechanism actually run, whose
    noise is ``z f`` for the clip norm -- at influence ``W / f``
    (:func:`flaudit.auditor.noise_calibration.signal_factor`; docs/estimators.md, "The
    mechanism actually run").
    """
    z = canary_noise_multiplier(spec)  # the update noise z_delta under adaptive clipping
    r = int(spec.canary_repeats)
    w = 1.0 if weight_factor is None else float(weight_factor)
    if not math.isfinite(w):
        raise ValueError(f"weight_factor must be finite, got {weight_factor!r}")
    w = max(1.0, w)
    short = signal_factor(1.0, noise_clip_factor)  # 1 / f, at least 1
    claims: list[TradeOffClaim] = []
    if z == 0:
        claims.append(NoDPClaim(threat_model=KNOWN_ROUNDS))
    elif short > 1.0:
        claims.append(
            GaussianDPClaim(
                w * short * math.sqrt(r) / z,
                threat_model=KNOWN_ROUNDS,
                description=f"Gaussian DP mu = {w * short:.4g} * sqrt({r}) / {z:g}: a canary in "
                f"{r} known round(s) with noise multiplier {z:g} at {w:.4g}x the influence C/n, "
                f"noised for {1 / short:.4g}x its clip norm (the mechanism actually run)",
            )
        )
        w *= short
    elif w > 1.0:
        claims.append(
            GaussianDPClaim(
                w * math.sqrt(r) / z,
                threat_model=KNOWN_ROUNDS,
                description=f"Gaussian DP mu = {w:.4g} * sqrt({r}) / {z:g}: a canary in {r} known "
                f"round(s) with noise multiplier {z:g}, at {w:.4g}x the influence C/n (the heaviest "
                "weight of a weighted FedAvg)",
            )
        )
    else:
        claims.append(
            GaussianDPClaim(
                math.sqrt(r) / z,
                threat_model=KNOWN_ROUNDS,
                description=f"Gaussian DP mu = sqrt({r}) / {z:g}: a canary in {r} known round(s) "
                f"with noise multiplier {z:g}",
            )
        )
    participation = getattr(spec.participation, "value", spec.participation)
    if participation == "poisson":
        claims.append(poisson_subsampled_claim(z / w, spec.sampling_probability, spec.num_rounds))
    return claims
