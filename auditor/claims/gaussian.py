"""One-shot audit of the Gaussian mechanism with random canaries (Andrew et al. 2023, Alg. 1).

``k`` canaries ``c_j`` uniform on the unit sphere of R^d are all added to the sum and the release
is ``rho = sum_j c_j + N(0, sigma^2 I_d)``. The statistic of canary ``j`` is
``g_j = <c_j, rho> / ||rho||`` (the null-standardized cosine for the orthogonal family,
:func:`flaudit.auditor.statistics.null_standardized_cosines`); a Gaussian fitted to the ``g_j`` is
compared with the null ``N(0, 1/d)`` by the two-Gaussian epsilon.

Orthogonal family (the default where ``k <= d``): in the canaries' own coordinates the release
is ``y_j = 1 + sigma u_j`` on the ``k`` canary columns and ``sigma u_i`` on the ``d - k`` others,
so ``g_j`` is ``y_j / s`` with ``(d - k) s^2 / sigma^2 ~ chi2(d - k)``, mapped to the cosine of
equal probability, simulated exactly in ``O(k)`` (``projected``) or through the transform
(``canaries``).

Gaussian (iid) family, two ways to simulate the release:

``projected`` (default; exact in distribution, O(k^2) memory and time)
    Write the canaries' Gaussian matrix ``X`` (k x d) as ``L Q`` (Bartlett decomposition): ``L``
    lower triangular with ``L_ii = sqrt(chi2(d - i + 1))`` and standard normal entries below the
    diagonal, ``Q`` a Haar-random k x d matrix with orthonormal rows, independent of ``L``. In
    the coordinates of ``Q``'s rows canary ``j`` is ``l_j = L_j/||L_j||``, the noise is
    ``sigma u`` with ``u ~ N(0, I_k)``, and the noise orthogonal to the canaries only adds
    ``sigma^2 chi2(d - k)`` to ``||rho||^2``. Every ``g_j`` then follows exactly the same joint
    law as with d-dimensional vectors, without touching d floats. Needs ``k < d``.
``canaries``
    Materialises each canary from the counter-based stream of :mod:`flaudit.auditor.canaries` in
    chunks (memory ``O(chunk * d)``), two passes: sum, then cosines. Slow (``2 k d`` normal
    draws); used to cross-check ``projected``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..canaries import (
    CanaryFamily,
    OrthogonalCanaries,
    canary_sum,
    iter_canary_chunks,
    resolve_canary_family,
)
from ..estimators._validation import (
    check_delta,
    check_dim,
    check_gaussian_variance,
    check_nonnegative,
)
from ..estimators.analytic import gaussian_epsilon_for_sigma
from ..estimators.fitted import final_model_epsilon
from ..estimators.lower_bound import Bonferroni, epsilon_lower_bound
from ..estimators.null import cosine_equivalent
from ..results import EpsilonResult, ThreatModel, VarianceTreatment
from ..statistics import null_standardized_cosines

__all__ = ["GaussianAuditResult", "gaussian_mechanism_audit", "gaussian_mechanism_cosines"]

THREAT_MODEL = ThreatModel.gaussian_mechanism


@dataclass(frozen=True)
class GaussianAuditResult:
    """Outcome of one simulated Gaussian-mechanism audit.

    ``epsilon`` is the estimate for the requested variance treatment; both treatments, the
    analytic epsilon and two lower bounds are beside it: ``epsilon_lo_valid`` (Bonferroni over
    the thresholds tried: a valid bound at the stated confidence) and ``epsilon_lo`` (the
    paper's uncorrected maximum over thresholds, kept to reproduce its Table 2; not valid).
    """

    epsilon: float
    variance: VarianceTreatment
    epsilon_null_variance: float
    epsilon_fitted_variance: float
    epsilon_lo: float
    analytic_epsilon: float
    epsilon_lo_valid: float
    mu_hat: float
    sigma_hat: float
    sigma: float
    d: int
    k: int
    delta: float
    estimates: list[EpsilonResult] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        out = {
            key: getattr(self, key)
            for key in (
                "epsilon",
                "epsilon_null_variance",
                "epsilon_fitted_variance",
                "epsilon_lo",
                "epsilon_lo_valid",
                "analytic_epsilon",
                "mu_hat",
                "sigma_hat",
                "sigma",
                "d",
                "k",
                "delta",
            )
        }
        out = {k: ("inf" if isinstance(v, float) and math.isinf(v) else v) for k, v in out.items()}
        out["variance"] = self.variance.value
        out["estimates"] = [e.to_dict() for e in self.estimates]
        return out


def _projected_cosines(sigma: float, d: int, k: int, rng: np.random.Generator) -> np.ndarray:
    # Bartlett factor of the k x d Gaussian matrix: rows are the canaries in Q's basis
    lower = np.tril(rng.standard_normal((k, k)), -1)
    lower[np.diag_indices(k)] = np.sqrt(rng.chisquare(d - np.arange(k)))
    units = lower / np.linalg.norm(lower, axis=1, keepdims=True)
    rho = units.sum(axis=0) + sigma * rng.standard_normal(k)
    norm_sq = (
        float(rho @ rho) + sigma**2 * float(rng.chisquare(d - k)) if d > k else float(rho @ rho)
    )
    return (units @ rho) / math.sqrt(norm_sq)


def _projected_orthogonal(sigma: float, d: int, k: int, rng: np.random.Generator) -> np.ndarray:
    y = 1.0 + sigma * rng.standard_normal(k)
    if d == k or sigma == 0:  # no energy outside the canaries: plain cosines
        return np.clip(y / np.linalg.norm(y), -1.0, 1.0)
    null_energy = sigma**2 * float(rng.chisquare(d - k)) / (d - k)
    return cosine_equivalent(y / math.sqrt(null_energy), d - k, d)


def _materialised_cosines(
    sigma: float,
    d: int,
    k: int,
    seed: int,
    rng: np.random.Generator,
    chunk_size: int,
    family: CanaryFamily,
) -> np.ndarray:
    if family is CanaryFamily.orthogonal:  # the sum of all k canaries is one transform
        rho = canary_sum(seed, np.arange(k), d, family=family) + sigma * rng.standard_normal(d)
        canaries = OrthogonalCanaries(seed, d)
        positions = canaries.positions(np.arange(k))
        return null_standardized_cosines(canaries.transpose_apply(rho), positions)
    rho = np.zeros(d, dtype=np.float64)
    for _, block in iter_canary_chunks(seed, k, d, chunk_size, family=family):
        rho += block.sum(axis=0, dtype=np.float64)
    rho += sigma * rng.standard_normal(d)
    out = np.empty(k)
    norm = float(np.linalg.norm(rho))
    rho32 = rho.astype(np.float32)
    for start, block in iter_canary_chunks(seed, k, d, chunk_size, family=family):
        out[start : start + block.shape[0]] = (block @ rho32).astype(np.float64) / norm
    return out


def gaussian_mechanism_cosines(
    sigma: float,
    d: int,
    k: int,
    *,
    seed: int,
    method: str = "projected",
    chunk_size: int = 64,
    family: CanaryFamily | str | None = None,
) -> np.ndarray:
    """The ``k`` canary cosines ``<c_j, rho>/||rho||`` of one simulated release (see module doc).

    ``family=None`` applies the default rule (orthogonal where ``k <= d``).
    """
    sigma = check_nonnegative(sigma, "sigma")
    d = check_dim(d)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 2:
        raise ValueError(f"k must be an integer >= 2, got {k!r}")
    if method not in ("projected", "canaries"):
        raise ValueError(f"method must be 'projected' or 'canaries', got {method!r}")
    family = resolve_canary_family(family, num_canaries=int(k), dim=d)
    rng = np.random.default_rng(np.random.SeedSequence(entropy=int(seed), spawn_key=(7,)))
    if method == "projected" and family is CanaryFamily.orthogonal:
        return _projected_orthogonal(sigma, d, int(k), rng)
    if method == "projected" and k >= d:
        method = "canaries"  # the projection needs k < d
    if method == "projected":
        return _projected_cosines(sigma, d, int(k), rng)
    return _materialised_cosines(sigma, d, int(k), int(seed), rng, chunk_size, family)


def gaussian_mechanism_audit(
    sigma: float,
    d: int,
    k: int,
    delta: float,
    *,
    seed: int,
    variance: VarianceTreatment | str = VarianceTreatment.null,
    method: str = "projected",
    confidence: float = 0.95,
    family: CanaryFamily | str | None = None,
) -> GaussianAuditResult:
    """Audit the sensitivity-1 Gaussian mechanism with ``k`` random canaries (Andrew et al. Alg. 1).

    Parameters
    ----------
    sigma : float
        Noise standard deviation of the mechanism (sensitivity 1). ``0`` is allowed (then
        the estimate is typically ``inf``).
    d : int
        Dimension (>= 2).
    k : int
        Number of canaries (>= 2), all inserted.
    delta : float
        Target delta.
    seed : int
        Seed of this simulation (canaries and noise). Not printed anywhere.
    variance : {"null", "fitted"}
        Which variance treatment ``.epsilon`` reports (both are in the result).
    method : {"projected", "canaries"}
        Exact low-dimensional simulation (fast) or materialised canaries (slow).
    confidence : float
        Confidence of ``epsilon_lo``.
    family : CanaryFamily or str, optional
        Canary family; ``None``: orthogonal where ``k <= d``, else gaussian.

    Returns
    -------
    GaussianAuditResult
    """
    sigma = check_nonnegative(sigma, "sigma")
    d = check_dim(d)
    delta = check_delta(delta)
    variance = check_gaussian_variance(variance)
    g = gaussian_mechanism_cosines(sigma, d, k, seed=seed, method=method, family=family)
    est_null = final_model_epsilon(g, d, delta, variance=VarianceTreatment.null)
    est_fitted = final_model_epsilon(g, d, delta, variance=VarianceTreatment.fitted)
    lo = epsilon_lower_bound(g, d=d, delta=delta, confidence=confidence, threat_model=THREAT_MODEL)
    lo_valid = epsilon_lower_bound(
        g,
        d=d,
        delta=delta,
        confidence=confidence,
        correction=Bonferroni(),
        threat_model=THREAT_MODEL,
    )
    relabel = [
        EpsilonResult(**{**e.__dict__, "threat_model": THREAT_MODEL})
        for e in (est_null, est_fitted)
    ]
    chosen = est_null if variance is VarianceTreatment.null else est_fitted
    return GaussianAuditResult(
        epsilon=chosen.epsilon,
        variance=variance,
        epsilon_null_variance=est_null.epsilon,
        epsilon_fitted_variance=est_fitted.epsilon,
        epsilon_lo=lo.epsilon,
        epsilon_lo_valid=lo_valid.epsilon,
        analytic_epsilon=gaussian_epsilon_for_sigma(sigma, delta),
        mu_hat=float(est_null.details["mu_hat"]),
        sigma_hat=float(est_null.details["sigma_hat"]),
        sigma=sigma,
        d=d,
        k=int(k),
        delta=delta,
        estimates=[*relabel, lo_valid, lo],
    )
