"""Epsilon estimates from Gaussians fitted to canary cosines (Andrew et al. Alg. 2 and 3)."""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

from ..results import EpsilonResult, Estimator, ThreatModel, VarianceTreatment
from ._validation import check_delta, check_dim, check_gaussian_variance, check_scores
from .null import EXACT_NULL_BELOW_DIM, null_logpdf, null_logsf, null_probit
from .two_gaussian import two_gaussian_epsilon

__all__ = [
    "final_model_epsilon",
    "final_model_estimates",
    "all_iterates_estimate",
    "exact_null_epsilon",
    "max_null_probit",
]

FINAL_MODEL = ThreatModel.final_model
ALL_ITERATES = ThreatModel.all_iterates


def _fit(values: np.ndarray) -> tuple[float, float]:
    """Sample mean and (biased, 1/k) standard deviation as in the paper."""
    return float(np.mean(values)), float(np.std(values))


def exact_null_epsilon(
    d: int, mu: float, sigma: float, delta: float, *, grid: int = 20001
) -> float:
    """Epsilon between the exact null cosine density (dimension ``d``) and ``N(mu, sigma^2)``.

    Cosines live in ``[-1, 1]``, so the Gaussian alternative is truncated to ``[-1, 1]``.
    Numerical: both hockey-stick divergences are integrated on a grid over ``[-1, 1]`` (midpoint rule)
    (refined around ``mu``), then the root in epsilon is bracketed and found with Brent's method
    on ``log delta(eps)``. A literal reading of "exact null vs a Gaussian alternative"; the
    final-model estimate uses the probit map instead (see :func:`final_model_epsilon`), because a
    Gaussian alternative's tails near +-1 dominate this number at small ``d``.
    """
    d = check_dim(d)
    delta = check_delta(delta)
    if sigma <= 0:
        return math.inf
    fine_lo, fine_hi = max(-1.0, mu - 12 * sigma), min(1.0, mu + 12 * sigma)
    edges = np.unique(
        np.concatenate(
            [
                np.linspace(-1.0, 1.0, grid),
                np.linspace(fine_lo, fine_hi, grid) if fine_hi > fine_lo else [],
            ]
        )
    )
    x = 0.5 * (edges[:-1] + edges[1:])  # midpoint rule: never evaluates the null at +-1
    w = np.diff(edges)
    log_p = null_logpdf(x, d)
    log_q = -0.5 * ((x - mu) / sigma) ** 2
    # renormalise both on the grid (truncates the Gaussian; discretisation error cancels)
    log_p = log_p - special.logsumexp(log_p, b=w)
    log_q = log_q - special.logsumexp(log_q, b=w)
    p, q = np.exp(log_p), np.exp(log_q)

    def log_delta(eps: float) -> float:
        e = math.exp(eps)
        h1 = float(np.sum(w * np.maximum(p - e * q, 0.0)))
        h2 = float(np.sum(w * np.maximum(q - e * p, 0.0)))
        return math.log(max(h1, h2, 1e-300))

    target = math.log(delta)
    if log_delta(0.0) <= target:
        return 0.0
    a, b = 0.0, 1.0
    while log_delta(b) > target:
        a, b = b, 2 * b
        if b > 512:  # e^eps overflows soon after; the supports are effectively disjoint
            return math.inf
    return float(optimize.brentq(lambda e: log_delta(e) - target, a, b, xtol=1e-10))


def final_model_epsilon(
    seen, d: int, delta: float, *, variance: VarianceTreatment | str = VarianceTreatment.null
) -> EpsilonResult:
    """Final-model epsilon estimate (Andrew et al. Alg. 2).

    Parameters
    ----------
    seen : array_like
        Cosines ``cos(c_j, theta_T - theta_0)`` of the seen canaries (at least 2).
    d : int
        Model dimension; the null is ``N(0, 1/d)``. When ``d < 1000`` the null is the exact
        density: cosines are mapped through ``Phi^-1(F_null)`` (the null becomes exactly
        N(0, 1)) and the alternative is fitted in that scale (unit variance for ``null``).
    delta : float
        Target delta.
    variance : VarianceTreatment or {"null", "fitted"}
        ``null``: the alternative is ``N(mu_hat, 1/d)`` (Thm 3.3's limit; the default, matches
        the paper's Table 2). ``fitted``: ``N(mu_hat, sigma_hat^2)``.

    Returns
    -------
    EpsilonResult
        ``details`` holds ``mu_hat``, ``sigma_hat``, ``num_seen``, ``null`` ("gaussian" or
        "exact") and the alternative's scale (``sigma_alt``, or ``*_probit`` for the exact null).
    """
    seen = check_scores(seen, "seen")
    d = check_dim(d)
    delta = check_delta(delta)
    variance = check_gaussian_variance(variance)
    if seen.size < 2:
        raise ValueError("seen must hold at least 2 cosines to fit a Gaussian")
    mu, sigma_hat = _fit(seen)
    null_sd = 1.0 / math.sqrt(d)
    exact = d < EXACT_NULL_BELOW_DIM
    details = {
        "mu_hat": mu,
        "sigma_hat": sigma_hat,
        "null_sigma": null_sd,
        "num_seen": int(seen.size),
        "null": "exact" if exact else "gaussian",
    }
    alt = "N(mu_hat, 1/d)" if variance is VarianceTreatment.null else "N(mu_hat, sigma_hat^2)"
    if exact:
        # Exact null: map cosines through Phi^-1(F_null), under which the null is exactly
        # N(0, 1) (epsilon is invariant under the bijection); fit the alternative there.
        y = null_probit(seen, d)
        mu_y, sd_y = _fit(y)
        sd_alt = 1.0 if variance is VarianceTreatment.null else sd_y
        eps = two_gaussian_epsilon(0.0, 1.0, mu_y, sd_alt, delta)
        details.update(mu_probit=mu_y, sigma_probit=sd_y, sigma_alt_probit=sd_alt)
        method = (
            f"two-Gaussian epsilon after the probit map Phi^-1(F_null) of the exact null "
            f"(1-t^2)^((d-3)/2), which becomes N(0, 1); alternative {alt} in that scale "
            f"fitted to {seen.size} seen final-model cosines (Andrew et al. Alg. 2, d < 1000)"
        )
    else:
        sigma_alt = null_sd if variance is VarianceTreatment.null else sigma_hat
        eps = two_gaussian_epsilon(0.0, null_sd, mu, sigma_alt, delta)
        details["sigma_alt"] = sigma_alt
        method = (
            f"two-Gaussian epsilon between null N(0, 1/d) and {alt} fitted to "
            f"{seen.size} seen final-model cosines (Andrew et al. Alg. 2)"
        )
    return EpsilonResult(
        epsilon=eps,
        estimator=Estimator.two_gaussian,
        threat_model=FINAL_MODEL,
        delta=delta,
        variance=variance,
        method=method,
        details=details,
    )


def final_model_estimates(seen, d: int, delta: float) -> list[EpsilonResult]:
    """Both variance treatments of :func:`final_model_epsilon` (null first: the default)."""
    return [
        final_model_epsilon(seen, d, delta, variance=VarianceTreatment.null),
        final_model_epsilon(seen, d, delta, variance=VarianceTreatment.fitted),
    ]


def max_null_probit(max_cosines, d: int, num_rounds: int) -> np.ndarray:
    """Map max-over-rounds cosines through ``Phi^-1(F_null(tau)^T)``.

    ``F_null^T`` is the CDF of the maximum of ``T`` independent null cosines in dimension
    ``d`` (an unseen canary's per-round cosine follows the null exactly; rounds are independent
    when the updates are noise-dominated), so the map turns an unseen canary's maximum into
    ``N(0, 1)``. Its right tail is that of ``T`` unit-variance Gaussians, not the narrow bulk
    (sd ~0.4-0.5/sqrt(d) at T = 50-200) a Gaussian fitted to the maxima has. Both tails are
    computed in log space (``-inf``/``inf`` never appear for cosines in ``(-1, 1)``).
    """
    d = check_dim(d)
    if (
        isinstance(num_rounds, bool)
        or not isinstance(num_rounds, (int, np.integer))
        or num_rounds < 1
    ):
        raise ValueError(f"num_rounds must be an integer >= 1, got {num_rounds!r}")
    t = np.clip(np.asarray(max_cosines, dtype=np.float64), -1 + 1e-15, 1 - 1e-15)
    log_sf = null_logsf(t, d)
    # the null is symmetric: log P[cos <= t] = log P[cos > -t], accurate in the left tail too
    with np.errstate(divide="ignore"):
        log_cdf = np.where(t > 0, np.log1p(-np.exp(np.minimum(log_sf, 0.0))), null_logsf(-t, d))
    log_max_cdf = num_rounds * log_cdf  # log P[max <= tau]
    with np.errstate(divide="ignore", invalid="ignore"):
        # log P[max > tau]: log(1 - F^T), or T * sf to first order where F^T rounds to 1
        log_max_sf = np.where(
            log_max_cdf < -1e-12, np.log(-np.expm1(log_max_cdf)), math.log(num_rounds) + log_sf
        )
    lower = special.ndtri_exp(np.minimum(log_max_cdf, 0.0))
    upper = -special.ndtri_exp(np.minimum(log_max_sf, 0.0))
    return np.where(log_max_cdf < math.log(0.5), lower, upper)


def all_iterates_estimate(
    seen, unseen, delta: float, *, num_rounds: int | None = None, d: int | None = None
) -> EpsilonResult:
    """All-iterates epsilon estimate (Andrew et al. Alg. 3).

    Gaussians are fitted to the max-over-rounds cosines of the unseen canaries (the empirical
    null) and of the seen canaries; the result is the two-Gaussian epsilon between them.

    With ``num_rounds`` and ``d`` the maxima are first mapped through
    :func:`max_null_probit` (the CDF of the maximum of ``T`` null cosines), and the Gaussians
    are fitted in that scale. Without the map (the paper's literal recipe) the fitted null is
    far narrower in its right tail than a maximum of ``T`` cosines really is, and the estimate
    overshoots the analytic epsilon 2.5-3.6x at T = 50-200 (docs/fidelity.md, Tables 3/4).

    Parameters
    ----------
    seen, unseen : array_like
        Max-over-rounds cosines of the seen and unseen canaries (at least 2 each).
    delta : float
        Target delta.
    num_rounds : int, optional
        Rounds the maxima were taken over (``T``); with ``d``, enables the map.
    d : int, optional
        Model dimension.
    """
    seen = check_scores(seen, "seen")
    unseen = check_scores(unseen, "unseen")
    delta = check_delta(delta)
    if seen.size < 2:
        raise ValueError("seen must hold at least 2 cosines to fit a Gaussian")
    if unseen.size < 2:
        raise ValueError("unseen must hold at least 2 cosines to fit a Gaussian")
    mapped = num_rounds is not None and d is not None
    if mapped:
        seen, unseen = max_null_probit(seen, d, num_rounds), max_null_probit(unseen, d, num_rounds)
    mu1, s1 = _fit(seen)
    mu0, s0 = _fit(unseen)
    eps = two_gaussian_epsilon(mu0, s0, mu1, s1, delta)
    scale = (
        f" after the map Phi^-1(F_null^T) of the maximum of T = {num_rounds} null cosines (d = {d})"
        if mapped
        else " (no map: overshoots, see docs/fidelity.md)"
    )
    return EpsilonResult(
        epsilon=eps,
        estimator=Estimator.two_gaussian,
        threat_model=ALL_ITERATES,
        delta=delta,
        variance=VarianceTreatment.fitted,
        method=f"two-Gaussian epsilon between Gaussians fitted to the max-over-rounds cosines of "
        f"{unseen.size} unseen and {seen.size} seen canaries{scale} (Andrew et al. Alg. 3)",
        details={
            "scale": f"max-of-{num_rounds} null probit" if mapped else "cosine",
            "mu_unseen": mu0,
            "sigma_unseen": s0,
            "mu_seen": mu1,
            "sigma_seen": s1,
            "num_seen": int(seen.size),
            "num_unseen": int(unseen.size),
        },
    )
