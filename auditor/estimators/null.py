"""The null distribution of a canary cosine (Andrew et al. Thm 3.1).

For a canary ``c`` uniform on the unit sphere of R^d and any independent nonzero vector ``v``,
``tau = <c, v>/||v||`` has density proportional to ``(1 - tau^2)^((d-3)/2)`` on ``[-1, 1]``;
equivalently ``(1 + tau)/2 ~ Beta((d-1)/2, (d-1)/2)``. Its mean is 0 and its variance exactly
``1/d``; for large ``d`` it is close to ``N(0, 1/d)``.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from flaudit.auditor.estimators._validation import check_dim

__all__ = ["null_probit", "null_logsf", "null_sf", "null_cdf", "null_pdf", "null_logpdf", "EXACT_NULL_BELOW_DIM"]

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
