"""Analytic (upper-bound) epsilon from ``dp-accounting``: what the DP guarantee promises, to put
beside the empirical estimates.

``dp_accounting`` is imported inside the functions: it takes seconds to import and every
``import auditor`` (the server, the ClientApp, ``flaudit gaussian``) would otherwise pay for it."""

from __future__ import annotations

import math

from ..results import EpsilonResult, Estimator
from ._validation import check_delta, check_nonnegative

#: Integer orders only: fractional orders near 1 make the RDP accountant log convergence warnings.
_RDP_ORDERS = [float(a) for a in range(2, 65)] + [80.0, 96.0, 128.0, 192.0, 256.0, 512.0, 1024.0]

__all__ = ["analytic_epsilon", "gaussian_sigma_for_epsilon", "gaussian_epsilon_for_sigma"]


def gaussian_sigma_for_epsilon(epsilon: float, delta: float) -> float:
    """Noise std of the sensitivity-1 Gaussian mechanism that is exactly (epsilon, delta)-DP
    (Balle & Wang 2018 calibration, via ``dp_accounting.get_sigma_gaussian``)."""
    import dp_accounting

    epsilon = check_nonnegative(epsilon, "epsilon")
    delta = check_delta(delta)
    return float(dp_accounting.get_sigma_gaussian(epsilon, delta))


def gaussian_epsilon_for_sigma(sigma: float, delta: float) -> float:
    """Exact epsilon of the sensitivity-1 Gaussian mechanism with noise std ``sigma``."""
    import dp_accounting

    sigma = check_nonnegative(sigma, "sigma")
    delta = check_delta(delta)
    if sigma == 0:
        return math.inf
    return float(dp_accounting.get_epsilon_gaussian(sigma, delta))


def _check_count(value, name: str) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        and not (isinstance(value, float) and value.is_integer())
    ):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if int(value) < 1:
        raise ValueError(f"{name} must be >= 1, got {value!r}")
    return int(value)


def _pld(discretization: float):
    from dp_accounting.pld import pld_privacy_accountant

    return pld_privacy_accountant.PLDAccountant(value_discretization_interval=discretization)


def _composed_epsilon(accountant, event, count: int, delta: float) -> float:
    """``accountant``'s epsilon at ``delta`` after ``count`` compositions of ``event``."""
    accountant.compose(event, count)
    return float(accountant.get_epsilon(delta))


def analytic_epsilon(
    noise_multiplier: float,
    sampling_probability: float,
    num_rounds: int,
    delta: float,
    *,
    participations: int | None = None,
    accountants: tuple[str, ...] = ("rdp", "pld"),
    pld_discretization: float = 1e-3,
) -> list[EpsilonResult]:
    """Analytic epsilon of DP-FedAvg from ``dp-accounting``.

    Parameters
    ----------
    noise_multiplier : float
        z: noise std over clip norm. ``0`` gives ``inf``.
    sampling_probability : float
        Poisson participation probability q in (0, 1].
    num_rounds : int
        Rounds T.
    delta : float
        Target delta.
    participations : int, optional
        Rounds the client actually joined. When given, also report the bound for an adversary
        who knows those rounds: the Gaussian mechanism with noise multiplier z composed
        ``participations`` times (the reference Andrew et al. compare against).
    accountants : tuple of {"rdp", "pld"}
        Which accountants to run for the Poisson-subsampled bound.
    pld_discretization : float
        ``value_discretization_interval`` of the PLD accountant.

    Returns
    -------
    list of EpsilonResult
        One per accountant (threat model ``poisson_subsampled``) plus ``known_rounds``.
    """
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    z = check_nonnegative(noise_multiplier, "noise_multiplier")
    q = check_nonnegative(sampling_probability, "sampling_probability")
    if not (0 < q <= 1):
        raise ValueError(f"sampling_probability must be in (0, 1], got {sampling_probability!r}")
    t = _check_count(num_rounds, "num_rounds")
    delta = check_delta(delta)
    if participations is not None:
        participations = _check_count(participations, "participations")
    for name in accountants:
        if name not in ("rdp", "pld"):
            raise ValueError(f"accountants must name 'rdp' or 'pld', got {name!r}")

    out: list[EpsilonResult] = []
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), t
    )
    common = dict(estimator=Estimator.analytic, delta=delta)
    for name in accountants:
        if z == 0:
            eps = math.inf
        elif name == "rdp":
            eps = _composed_epsilon(
                rdp_privacy_accountant.RdpAccountant(orders=_RDP_ORDERS), event, 1, delta
            )
        else:
            eps = _composed_epsilon(_pld(pld_discretization), event, 1, delta)
        out.append(
            EpsilonResult(
                epsilon=eps,
                threat_model="poisson_subsampled",
                method=f"dp-accounting {name.upper()} accountant: Poisson-subsampled Gaussian "
                f"(z={z:g}, q={q:g}) composed over {t} rounds",
                details={
                    "accountant": name,
                    "noise_multiplier": z,
                    "sampling_probability": q,
                    "num_rounds": t,
                },
                **common,
            )
        )
    if participations is not None:
        if z == 0:
            eps = math.inf
        else:
            eps = _composed_epsilon(
                _pld(pld_discretization), dp_accounting.GaussianDpEvent(z), participations, delta
            )
        out.append(
            EpsilonResult(
                epsilon=eps,
                threat_model="known_rounds",
                method=f"dp-accounting PLD accountant: Gaussian mechanism (z={z:g}) composed over "
                f"the client's {participations} participation(s); the adversary knows the rounds",
                details={
                    "accountant": "pld",
                    "noise_multiplier": z,
                    "participations": participations,
                },
                **common,
            )
        )
    return out


def audit_analytic_epsilon(spec) -> list[EpsilonResult]:
    """The analytic epsilons reported for an audit (:class:`flaudit.auditor.spec.AuditSpec`): one place
    for the service, ``flaudit run`` and the fidelity benchmarks.

    dp-accounting for the round's accounted noise multiplier (``spec.accounted_noise_multiplier``:
    the configured ``z``, combined with the clipped-count query under adaptive clipping),
    ``q = spec.sampling_probability`` and ``T = spec.num_rounds``: the Poisson-subsampled bound
    (RDP and PLD), which is the claim under Poisson participation, and the bound for an adversary
    who knows the canary's ``spec.canary_repeats`` rounds, which holds for any schedule.
    """
    return analytic_epsilon(
        spec.accounted_noise_multiplier,
        spec.sampling_probability,
        spec.num_rounds,
        spec.delta,
        participations=spec.canary_repeats,
    )
