"""Epsilon between two Gaussians (Andrew et al. 2023, §3.2).

``epsilon(P || Q; delta)`` for ``P = N(mu0, sigma0^2)`` and ``Q = N(mu1, sigma1^2)`` is the smallest
``epsilon >= 0`` with ``max(H_eps(P || Q), H_eps(Q || P)) <= delta`` where
``H_eps(P || Q) = P[L > eps] - e^eps Q[L > eps]`` and ``L = log p/q``. ``L`` is a quadratic in ``x``
so ``{L > eps}`` is an interval, the complement of one, a half line, everything or nothing. All
probabilities are computed as log-probabilities (``scipy.special.log_ndtr``) so that tails down to
``1e-300`` stay exact, and the root in ``eps`` is found by bracketing plus Brent's method on
``log H``.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

from ._validation import check_delta, check_finite, check_nonnegative

__all__ = ["two_gaussian_epsilon", "hockey_stick_divergence", "gaussian_mechanism_delta"]

_LOG_FLOOR = -1.0e4  # log(delta) floor standing in for log(0) inside the root finder
_EPS_MAX = 1.0e6  # above this epsilon we report inf
_SCALE_MIN = 1.0e-100  # standardised scale ratios beyond this are treated as singular


def _logsubexp(a: float, b: float) -> float:
    """log(exp(a) - exp(b)) for a >= b (returns -inf when equal)."""
    if b == -math.inf:
        return a
    if b >= a:
        return -math.inf
    return a + math.log1p(-math.exp(b - a)) if b - a > -745 else a


def _log_cdf(x: float) -> float:
    return float(special.log_ndtr(x))


def _log_interval(lo: float, hi: float) -> float:
    """log P[lo < Z < hi] for Z ~ N(0, 1), accurate in both tails."""
    if hi <= lo:
        return -math.inf
    if lo >= 0:  # right tail: sf(lo) - sf(hi)
        return _logsubexp(_log_cdf(-lo), _log_cdf(-hi))
    if hi <= 0:
        return _logsubexp(_log_cdf(hi), _log_cdf(lo))
    # straddles zero: 1 - Phi(lo) - sf(hi)
    outside = math.exp(_log_cdf(lo)) + math.exp(_log_cdf(-hi))
    return math.log1p(-outside) if outside < 1 else -math.inf


def _log_prob(region: list[tuple[float, float]], mu: float, sigma: float) -> float:
    """log P[X in union of disjoint intervals] for X ~ N(mu, sigma^2)."""
    out = -math.inf
    for lo, hi in region:
        out = np.logaddexp(out, _log_interval((lo - mu) / sigma, (hi - mu) / sigma))
    return float(out)


def _region(a: float, b: float, c: float) -> list[tuple[float, float]]:
    """The set {x : a x^2 + b x + c > 0} as a list of disjoint open intervals."""
    inf = math.inf
    scale = max(abs(a), abs(b), abs(c))
    if scale == 0:
        return []
    if abs(a) <= 1e-14 * scale:  # linear (equal variances, up to rounding)
        if b == 0:
            return [(-inf, inf)] if c > 0 else []
        root = -c / b
        return [(root, inf)] if b > 0 else [(-inf, root)]
    disc = b * b - 4 * a * c
    if disc <= 0:
        return [(-inf, inf)] if a > 0 else []
    sq = math.sqrt(disc)
    # numerically stable roots
    q = -0.5 * (b + math.copysign(sq, b))
    r1, r2 = q / a, (c / q if q != 0 else -q / a)
    lo, hi = min(r1, r2), max(r1, r2)
    return [(-inf, lo), (hi, inf)] if a > 0 else [(lo, hi)]


def _log_hockey_stick(mu_p: float, s_p: float, mu_q: float, s_q: float, eps: float) -> float:
    """log H_eps(P || Q) for P = N(mu_p, s_p^2), Q = N(mu_q, s_q^2) (both s > 0)."""
    # L(x) = log p(x) - log q(x) = a x^2 + b x + c
    a = 0.5 * (1.0 / s_q**2 - 1.0 / s_p**2)
    b = mu_p / s_p**2 - mu_q / s_q**2
    c = 0.5 * ((mu_q / s_q) ** 2 - (mu_p / s_p) ** 2) + math.log(s_q) - math.log(s_p)
    region = _region(a, b, c - eps)
    if not region:
        return -math.inf
    log_p = _log_prob(region, mu_p, s_p)
    log_q = _log_prob(region, mu_q, s_q)
    diff = eps + log_q - log_p
    if diff >= 0:
        return -math.inf
    return log_p + (math.log1p(-math.exp(diff)) if diff > -745 else 0.0)


def gaussian_mechanism_delta(sensitivity_over_sigma: float, eps: float) -> float:
    """delta(eps) of the Gaussian mechanism with ``mu = sensitivity / sigma`` (Balle & Wang 2018).

    ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``, computed in log space.
    """
    mu = float(sensitivity_over_sigma)
    if mu == 0:
        return 0.0
    return math.exp(log_gaussian_mechanism_delta(mu, eps))


def log_gaussian_mechanism_delta(mu: float, eps: float) -> float:
    """``log delta(eps)`` of the ``mu``-Gaussian mechanism, accurate where delta underflows."""
    log_a = _log_cdf(-eps / mu + mu / 2)
    log_b = eps + _log_cdf(-eps / mu - mu / 2)
    return _logsubexp(log_a, log_b)


def hockey_stick_divergence(
    mu0: float, sigma0: float, mu1: float, sigma1: float, epsilon: float
) -> float:
    """``max(H_eps(P || Q), H_eps(Q || P))`` for ``P = N(mu0, sigma0^2)``, ``Q = N(mu1, sigma1^2)``.

    Both standard deviations must be positive.
    """
    mu0, mu1 = check_finite(mu0, "mu0"), check_finite(mu1, "mu1")
    sigma0, sigma1 = check_nonnegative(sigma0, "sigma0"), check_nonnegative(sigma1, "sigma1")
    if sigma0 == 0 or sigma1 == 0:
        raise ValueError("sigma0 and sigma1 must be > 0 for the hockey-stick divergence")
    return math.exp(_log_delta_of_eps(0.0, 1.0, (mu1 - mu0) / sigma0, sigma1 / sigma0, epsilon))


def _log_delta_of_eps(mu_p: float, s_p: float, mu_q: float, s_q: float, eps: float) -> float:
    if s_p == s_q:
        gap = abs(mu_q - mu_p) / s_p
        return -math.inf if gap == 0 else log_gaussian_mechanism_delta(gap, eps)
    return max(
        _log_hockey_stick(mu_p, s_p, mu_q, s_q, eps),
        _log_hockey_stick(mu_q, s_q, mu_p, s_p, eps),
    )


def two_gaussian_epsilon(
    mu0: float, sigma0: float, mu1: float, sigma1: float, delta: float
) -> float:
    """Smallest epsilon such that ``N(mu0, sigma0^2)`` and ``N(mu1, sigma1^2)`` are
    (epsilon, delta)-indistinguishable in both directions.

    Parameters
    ----------
    mu0, sigma0 : float
        Mean and standard deviation of the first Gaussian (e.g. the null).
    mu1, sigma1 : float
        Mean and standard deviation of the second Gaussian (e.g. fitted to the seen canaries).
    delta : float
        Target delta in (0, 1).

    Returns
    -------
    float
        ``epsilon >= 0``; ``0.0`` when the distributions are identical (or already within
        ``delta`` at epsilon 0); ``math.inf`` when they are mutually singular (a zero standard
        deviation with a different mean or a different standard deviation) or when no finite
        epsilon below 1e6 suffices.

    Raises
    ------
    ValueError
        If a mean is NaN/Inf, a standard deviation is negative or not finite, or ``delta`` is
        outside (0, 1).
    """
    mu0, mu1 = check_finite(mu0, "mu0"), check_finite(mu1, "mu1")
    sigma0, sigma1 = check_nonnegative(sigma0, "sigma0"), check_nonnegative(sigma1, "sigma1")
    delta = check_delta(delta)
    if sigma0 == 0 or sigma1 == 0:
        if sigma0 == sigma1 and mu0 == mu1:
            return 0.0
        return math.inf  # a point mass against anything else is distinguishable with certainty
    # epsilon is invariant under the same affine map of both: standardise the first
    mu_q, s_q = (mu1 - mu0) / sigma0, sigma1 / sigma0
    if mu_q == 0 and s_q == 1:
        return 0.0
    if not (math.isfinite(mu_q) and math.isfinite(s_q)) or s_q == 0:
        return math.inf
    if not (_SCALE_MIN < s_q < 1 / _SCALE_MIN) or abs(mu_q) > 1 / _SCALE_MIN:
        # one law is a point mass at the other's scale (or they are disjoint): squaring these
        # ratios would overflow, and no finite epsilon reaches any delta < 1
        return math.inf
    log_delta = math.log(delta)

    def objective(eps: float) -> float:
        return max(_log_delta_of_eps(0.0, 1.0, mu_q, s_q, eps), _LOG_FLOOR) - log_delta

    if objective(0.0) <= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    while objective(hi) > 0:
        lo, hi = hi, hi * 2
        if hi > _EPS_MAX:
            return math.inf
    return float(optimize.brentq(objective, lo, hi, xtol=1e-12, rtol=1e-10, maxiter=200))
