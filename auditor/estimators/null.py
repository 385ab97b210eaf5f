"""The null distribution of a canary cosine (Andrew et al. Thm 3.1).

For a canary ``c`` uniform on the unit sphere of R^d and any independent nonzero vector ``v``,
``tau = <c, v>/||v||`` has density proportional to ``(1 - tau^2)^((d-3)/2)`` on ``[-1, 1]``;
equivalently ``(1 + tau)/2 ~ Beta((d-1)/2, (d-1)/2)``. Its mean is 0 and its variance exactly
``1/d``; for large ``d`` it is close to ``N(0, 1/d)``.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from ._validation import check_dim

__all__ = [
    "null_probit",
    "null_logsf",
    "null_sf",
    "null_cdf",
    "null_pdf",
    "null_logpdf",
    "EXACT_NULL_BELOW_DIM",
    "cosine_equivalent",
    "studentized_from_cosine",
]

#: Below this dimension the estimators use the exact null instead of N(0, 1/d).
EXACT_NULL_BELOW_DIM = 1000


def _half_shape(d: int) -> float:
    return (check_dim(d) - 1) / 2.0


def null_sf(tau, d: int) -> np.ndarray:
    """P[cos > tau] under the exact null in dimension ``d``."""
    a = _half_shape(d)
    x = np.clip((np.asarray(tau, dtype=np.float64) + 1.0) / 2.0, 0.0, 1.0)
    return special.betaincc(a, a, x)


def null_logsf(tau, d: int) -> np.ndarray:
    """log P[cos > tau] under the exact null (accurate far in the tail).

    Uses the regularised incomplete beta function directly (fast). Where that underflows
    (far right tail) it uses the leading term of integrating the density by parts,
    ``P[cos > t] ~ C_d (1 - t^2)^((d-1)/2) / ((d - 1) t)``, whose relative error is
    ``O(1/(d t^2))`` there. ``-inf`` at ``t >= 1``."""
    d = check_dim(d)
    a = (d - 1) / 2.0
    t = np.asarray(tau, dtype=np.float64)
    x = (t + 1.0) / 2.0
    sf = special.betaincc(a, a, np.clip(x, 0.0, 1.0))
    with np.errstate(divide="ignore"):
        out = np.log(sf)
    tiny = (sf < 1e-280) & (t > 0) & (t < 1)
    if np.any(tiny):
        tt = np.where(tiny, t, 0.5)
        log_c = special.gammaln(d / 2.0) - special.gammaln((d - 1) / 2.0) - 0.5 * np.log(np.pi)
        approx = log_c + a * np.log1p(-tt * tt) - np.log((d - 1) * tt)
        out = np.where(tiny, approx, out)
    return out


def null_cdf(tau, d: int) -> np.ndarray:
    """P[cos <= tau] under the exact null in dimension ``d``."""
    a = _half_shape(d)
    x = np.clip((np.asarray(tau, dtype=np.float64) + 1.0) / 2.0, 0.0, 1.0)
    return special.betainc(a, a, x)


def null_logpdf(tau, d: int) -> np.ndarray:
    """log density of the exact null at ``tau`` (``-inf`` outside ``(-1, 1)``)."""
    a = _half_shape(d)
    tau = np.asarray(tau, dtype=np.float64)
    inside = np.abs(tau) < 1
    t = np.where(inside, tau, 0.0)
    # density of tau: (1 - t^2)^(a - 1) / (2^(2a - 1) B(a, a)), from (1 + t)/2 ~ Beta(a, a)
    log_density = (a - 1) * np.log1p(-t * t) - (2 * a - 1) * np.log(2.0) - special.betaln(a, a)
    return np.where(inside, log_density, -np.inf)


def null_pdf(tau, d: int) -> np.ndarray:
    """Density of the exact null at ``tau``."""
    return np.exp(null_logpdf(tau, d))


def null_probit(tau, d: int) -> np.ndarray:
    """Map cosines to ``Phi^-1(F_null(tau))``: exactly N(0, 1) when ``tau`` follows the null.

    A monotone bijection, so the hockey-stick divergence (hence epsilon) between any two
    distributions of ``tau`` equals that between their images. Computed from log tails
    (``scipy.special.ndtri_exp``) so both tails stay accurate; ``tau`` is clipped to
    ``[-1 + 1e-15, 1 - 1e-15]`` so that +-1 map to large finite values.
    """
    t = np.clip(np.asarray(tau, dtype=np.float64), -1 + 1e-15, 1 - 1e-15)
    upper = -special.ndtri_exp(null_logsf(np.abs(t), d))  # >= 0, for |t|
    return np.where(t >= 0, upper, -upper)


def _check_dof(dof) -> float:
    dof = float(dof)
    if not dof > 0:  # also refuses NaN
        raise ValueError(f"dof must be > 0 (or inf), got {dof!r}")
    return dof


#: Below this two-sided tail probability the incomplete beta functions underflow; there both
#: maps work on log tails (:func:`_student_log_outer`, :func:`null_logsf`).
_TINY = 1e-290


def _student_log_outer(a, dof: float) -> np.ndarray:
    """``log P(|T| > a)`` for Student's t with ``dof`` degrees of freedom, far in the tail
    (``a`` large): the leading term of integrating the density by parts,
    ``P(T > a) ~ C dof / ((dof - 1) a) (1 + a^2/dof)^(-(dof - 1)/2)`` (relative error
    ``O(1/a^2 + 1/dof)``); ``dof = inf``: the normal tail, exact."""
    a = np.asarray(a, dtype=np.float64)
    if np.isinf(dof):
        return np.log(2.0) + special.log_ndtr(-a)
    log_c = special.gammaln((dof + 1) / 2) - special.gammaln(dof / 2) - 0.5 * np.log(dof * np.pi)
    return (
        np.log(2.0)
        + log_c
        + np.log(dof / (dof - 1.0))
        - np.log(a)
        - (dof - 1) / 2.0 * np.log1p(a * a / dof)
    )


def _solve_increasing_tail(log_target, lo, hi, log_tail, iterations: int = 200):
    """Bisection (in place, vectorised) for ``log_tail(x) = log_target`` with ``log_tail``
    decreasing on ``[lo, hi]``; returns the midpoint after ``iterations`` halvings (or fewer:
    stops when the bracket no longer shrinks in float64)."""
    lo, hi = np.array(lo, dtype=np.float64), np.array(hi, dtype=np.float64)
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if np.all((mid == lo) | (mid == hi)):
            break
        above = log_tail(mid) > log_target
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    return 0.5 * (lo + hi)


def cosine_equivalent(t, dof, d: int) -> np.ndarray:
    """Map studentized values to cosines with the same probability: ``F_d(x) = T_dof(t)``.

    A canary coordinate ``y_j`` of a release divided by ``s``, the root mean square of ``dof``
    coordinates that no canary touches, is Student-t with ``dof`` degrees of freedom when the
    canary is absent (the coordinates of a release in a random orthonormal basis: for any
    release independent of the basis, ``y_j / s`` is the ratio of one Gaussian to ``dof``
    others). Mapped through this monotone bijection it has exactly the law ``F_d`` of a random
    cosine in ``R^d`` (:func:`null_cdf`), so every estimator built on the cosine null applies
    unchanged. ``dof = inf``: ``t`` is standard normal under the null (the scale is known).

    Computed on squares (``t^2 / (dof + t^2) ~ Beta(1/2, dof/2)`` and ``x^2 ~ Beta(1/2,
    (d - 1)/2)``) from whichever side is small, so the centre and the tails stay accurate;
    where the tail probability underflows (beyond about 1e-290) the two log tails are matched
    instead (:func:`_student_log_outer`, :func:`null_logsf`).
    """
    b = _half_shape(d)
    dof = _check_dof(dof)
    t = np.asarray(t, dtype=np.float64)
    a = np.abs(t)
    a2 = a * a
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if np.isinf(dof):
            inner = special.erf(a / np.sqrt(2.0))  # P(|T| <= |t|)
            outer = special.erfc(a / np.sqrt(2.0))  # P(|T| > |t|)
        else:
            inner = special.betainc(0.5, dof / 2.0, a2 / (dof + a2))
            outer = special.betainc(dof / 2.0, 0.5, dof / (dof + a2))
        x2 = np.where(
            inner <= 0.5, special.betaincinv(0.5, b, inner), special.betainccinv(0.5, b, outer)
        )
        x = np.sqrt(x2)
        deep = (outer < _TINY) & np.isfinite(a)
        if np.any(deep):
            target = _student_log_outer(a[deep], dof) - np.log(2.0)
            x[deep] = _solve_increasing_tail(
                target, np.zeros(target.shape), np.ones(target.shape), lambda v: null_logsf(v, d)
            )
        x = np.where(np.isinf(a), 1.0, x)
    return np.clip(np.sign(t) * x, -1.0, 1.0)


def studentized_from_cosine(x, dof, d: int) -> np.ndarray:
    """The inverse of :func:`cosine_equivalent`: ``T_dof(t) = F_d(x)``. A cosine of exactly
    +-1 (a release along the canary: no noise at all) maps to +-inf."""
    b = _half_shape(d)
    dof = _check_dof(dof)
    x = np.clip(np.asarray(x, dtype=np.float64), -1.0, 1.0)
    ax = np.abs(x)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inner = special.betainc(0.5, b, ax * ax)  # P(|X| <= |x|)
        outer = special.betainc(b, 0.5, (1.0 - ax) * (1.0 + ax))  # P(|X| > |x|)
        if np.isinf(dof):
            a = np.where(
                inner <= 0.5, special.ndtri(0.5 + inner / 2.0), -special.ndtri(outer / 2.0)
            )
        else:
            w = special.betaincinv(0.5, dof / 2.0, inner)  # t^2 / (dof + t^2)
            v = special.betaincinv(dof / 2.0, 0.5, outer)  # dof / (dof + t^2)
            a = np.sqrt(np.where(inner <= 0.5, dof * w / (1.0 - w), dof * (1.0 - v) / v))
        deep = (outer < _TINY) & (ax < 1.0)
        if np.any(deep):
            target = null_logsf(ax[deep], d) + np.log(2.0)
            # the t tail at a is at least the normal tail at a, which is below target here
            # once a >= the normal score of the target: bracket [1, that]
            high = np.maximum(-special.ndtri_exp(target - np.log(2.0)), 2.0) * 1e3
            a[deep] = _solve_increasing_tail(
                target, np.ones(target.shape), high, lambda v: _student_log_outer(v, dof)
            )
        a = np.where(ax >= 1.0, np.inf, a)
    return np.sign(x) * a
