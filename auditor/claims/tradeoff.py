"""The f-DP picture of an audit: trade-off curves of tests that tell seen canaries from the null.

A test that calls a canary "seen" when its score exceeds ``t`` has a false-positive rate
``alpha = P_null(Z > t)`` and a false-negative rate ``beta = P_seen(Z <= t)``. A mechanism is
``mu``-GDP when every such test has ``beta >= G_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu)``
(Dong, Roth & Su 2019): the claimed curve. The canaries give the empirical curve
``beta_hat(alpha)``; a simultaneous lower confidence band under it says how far below the
empirical curve the true one may lie; the ``mu_lo`` curve is ``G_{mu_lo}`` for the audit's valid
lower bound ``mu_lo``. A claim is refuted where the truth must lie below the claimed curve.

The band treats the seen canaries' scores as independent draws. Under DP-FedAvg's Gaussian noise
with orthogonal canaries they are independent given the release's noise scale, which they share
(docs/estimators.md, "One release, one scale"): close to independent when the scale rests on many
more coordinates than there are canaries, not otherwise. It is a picture of the evidence, not the
test the verdict rests on (:mod:`flaudit.auditor.claims.normal_scores` is exact).

Pure math: arrays in, lists of numbers out (JSON-ready). The scores are normal scores
``Z = Phi^-1(F_null(score))``, exactly N(0, 1) for a canary the model never saw.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

__all__ = ["tradeoff_picture", "gdp_tradeoff", "empirical_tradeoff", "dkw_margin", "BAND_ASSUMES"]

#: What the band assumes, said with it (the picture's ``band_assumes``; the page shows it).
BAND_ASSUMES = (
    "The band assumes independent scores (Dvoretzky–Kiefer–Wolfowitz). The final model's scores "
    "share its noise scale, so the band is a picture of the evidence, not a test; the verdict "
    "rests on the exact normal-score test, which accounts for the shared scale."
)


def gdp_tradeoff(alpha, mu: float) -> np.ndarray:
    """``G_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu)``: the trade-off curve of ``mu``-GDP,
    computed as ``Phi(-Phi^-1(alpha) - mu)`` (accurate for small alpha); 0 for ``mu = inf``."""
    a = np.clip(np.asarray(alpha, dtype=np.float64), 0.0, 1.0)
    if math.isinf(mu):
        return np.zeros_like(a)
    with np.errstate(divide="ignore"):
        return special.ndtr(-special.ndtri(a) - float(mu))


def dkw_margin(n: int, failure: float) -> float:
    """One-sided Dvoretzky-Kiefer-Wolfowitz margin (Massart's constant, valid for
    ``failure <= 1/2``): with probability at least ``1 - failure`` the empirical CDF of ``n``
    i.i.d. scores exceeds the true one by at most ``sqrt(log(1 / failure) / (2 n))`` at every
    point at once."""
    if not 0.0 < failure <= 0.5:
        raise ValueError(f"failure must be in (0, 1/2], got {failure}")
    if n <= 0:
        return 1.0
    return min(1.0, math.sqrt(math.log(1.0 / failure) / (2.0 * n)))


def _thresholds(alpha: np.ndarray, unseen_z: np.ndarray | None) -> np.ndarray:
    """The threshold of FPR ``alpha``: exact under the N(0, 1) null, else the smallest threshold
    whose empirical FPR on the unseen scores is at most ``alpha``."""
    if unseen_z is None:
        return special.ndtri(1.0 - alpha)
    u = np.sort(unseen_z)
    n = u.size
    above_allowed = np.floor(alpha * n + 1e-9).astype(int)  # unseen scores allowed above t
    index = n - above_allowed - 1
    return np.where(index >= 0, u[np.clip(index, 0, n - 1)], -np.inf)


def empirical_tradeoff(alpha, seen_z, unseen_z=None) -> np.ndarray:
    """``beta_hat(alpha)``: the fraction of seen scores at or below the threshold of FPR ``alpha``
    (non-increasing in ``alpha``)."""
    a = np.clip(np.asarray(alpha, dtype=np.float64), 0.0, 1.0)
    seen = np.sort(np.asarray(seen_z, dtype=np.float64))
    unseen = None if unseen_z is None else np.asarray(unseen_z, dtype=np.float64)
    t = _thresholds(a, unseen)
    return np.searchsorted(seen, t, side="right") / seen.size


def tradeoff_picture(
    seen_z,
    *,
    unseen_z=None,
    claim_mu: float | None,
    mu_lo: float | None,
    confidence: float = 0.95,
    num_points: int = 101,
) -> dict:
    """The curves of the f-DP picture on a grid of false-positive rates.

    Parameters
    ----------
    seen_z : array or None
        Normal scores of the seen canaries; ``None`` (or empty) while the seen/unseen split is
        secret: then only the claim and the ``mu_lo`` curves are drawn.
    unseen_z : array, optional
        Normal scores of the unseen canaries, the empirical null. ``None``: the exact N(0, 1)
        null (final-model scores).
    claim_mu : float or None
        The claimed GDP parameter (``None``: no DP claim, no claimed curve).
    mu_lo : float or None
        The audit's valid lower bound on ``mu`` (``None``: none yet).
    confidence : float
        Simultaneous confidence of the band (DKW on the seen scores; with ``unseen_z`` the
        failure probability is split evenly between the seen and the unseen scores).
    num_points : int
        Grid size over ``alpha`` in [0, 1].

    Returns
    -------
    dict
        ``alpha`` (grid), ``claim`` (``G_claim_mu`` or None), ``empirical`` (``beta_hat`` or None),
        ``band`` (lower confidence band of ``beta``: the true curve lies above it at every
        ``alpha`` at once with probability ``confidence`` for independent scores, or None),
        ``band_assumes`` (:data:`BAND_ASSUMES`, for the page), ``mu_lo`` (``G_mu_lo`` or
        None), ``score`` (what the scores are), ``null`` ("exact" or "unseen canaries"),
        ``num_seen``, ``num_unseen``, ``confidence``, ``claim_mu``, ``mu_lo_value``.

    Raises
    ------
    ValueError
        If ``confidence`` is not in (0, 1) or ``num_points`` < 2.
    """
    if not 0.5 <= confidence < 1.0:
        raise ValueError(f"confidence must be in [0.5, 1), got {confidence}")
    if num_points < 2:
        raise ValueError(f"num_points must be at least 2, got {num_points}")
    alpha = np.linspace(0.0, 1.0, int(num_points))
    seen = None if seen_z is None else np.asarray(seen_z, dtype=np.float64).ravel()
    if seen is not None:
        seen = seen[~np.isnan(seen)]
        if seen.size == 0:
            seen = None
    unseen = None if unseen_z is None else np.asarray(unseen_z, dtype=np.float64).ravel()
    if unseen is not None:
        unseen = unseen[~np.isnan(unseen)]
        if unseen.size == 0:
            unseen = None

    empirical = band = None
    if seen is not None:
        failure = 1.0 - confidence
        beta = empirical_tradeoff(alpha, seen, unseen)
        if unseen is None:
            shifted = beta
            margin_seen = dkw_margin(seen.size, failure)
        else:
            margin_seen = dkw_margin(seen.size, failure / 2)
            margin_unseen = dkw_margin(unseen.size, failure / 2)
            # the true FPR of the empirical threshold at alpha + margin is at least alpha, so the
            # true curve at alpha is at least the seen CDF there (see the module docstring)
            shifted = empirical_tradeoff(np.minimum(1.0, alpha + margin_unseen), seen, unseen)
        empirical = beta.tolist()
        band = np.maximum(0.0, shifted - margin_seen).tolist()

    def curve(mu):
        if mu is None or not math.isfinite(mu):
            return None
        return gdp_tradeoff(alpha, mu).tolist()

    return {
        "alpha": alpha.tolist(),
        "claim": curve(claim_mu),
        "empirical": empirical,
        "band": band,
        "band_assumes": BAND_ASSUMES,
        "mu_lo": curve(mu_lo),
        "score": "normal score Φ⁻¹(F_null(cosine)) of each canary",
        "null": "exact" if unseen is None else "unseen canaries",
        "num_seen": 0 if seen is None else int(seen.size),
        "num_unseen": 0 if unseen is None else int(unseen.size),
        "confidence": float(confidence),
        "claim_mu": None if claim_mu is None or not math.isfinite(claim_mu) else float(claim_mu),
        "mu_lo_value": None if mu_lo is None or not math.isfinite(mu_lo) else float(mu_lo),
    }
