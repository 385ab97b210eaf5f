"""Gaussian DP (``mu``-GDP) estimators: the ``mu`` <-> (epsilon, delta) conversion and a valid lower
bound on ``mu`` from the canary scores.

:func:`gdp_lower_bound`
    ``mu_lo = max_a Phi^-1(1 - FPR_up(a)) - Phi^-1(FNR_up(a))`` with Clopper-Pearson upper
    bounds (exact null FPR for the final model), thresholds chosen as in
    :func:`..lower_bound.epsilon_lower_bound`. A valid refutation of every ``mu``-GDP claim
    with ``mu < mu_lo`` at the stated confidence (with a valid correction).

Claims as trade-off curves and the tests of a claim live in :mod:`..claims` (they use these).
"""

import math
from typing import Any

import numpy as np
from scipy import optimize, special

from ..results import EpsilonResult, Estimator
from ._validation import check_confidence, check_delta, check_nonnegative
from .lower_bound import (
    GDP_BONFERRONI,
    Bonferroni,
    CorrectionStrategy,
    NoCorrection,
    check_threshold_inputs,
    clopper_pearson_upper,
    search_thresholds,
    threshold_bounds,
    threshold_multiplicity,
)
from .two_gaussian import log_gaussian_mechanism_delta

__all__ = ["GaussianDPResult", "gdp_delta", "gdp_epsilon", "gdp_lower_bound"]

_MU_MAX = 1e3  # mu_lo is capped here (a test with FPR and FNR both ~ 0)


# -- Gaussian DP <-> (epsilon, delta) ----------------------------------------------------------


def gdp_delta(mu: float, epsilon: float) -> float:
    """``delta(epsilon)`` of a ``mu``-GDP mechanism: ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``
    (Dong, Roth & Su 2019, Cor. 2.13), computed in log space."""
    mu = float(mu)
    if math.isnan(mu) or mu < 0:
        raise ValueError(f"mu must be >= 0, got {mu!r}")
    epsilon = check_nonnegative(epsilon, "epsilon")
    if mu == 0:
        return 0.0
    if math.isinf(mu):
        return 1.0
    return math.exp(log_gaussian_mechanism_delta(mu, epsilon))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest ``epsilon >= 0`` with ``delta(epsilon) <= delta`` for a ``mu``-GDP mechanism
    (``0`` for ``mu = 0``, ``inf`` for ``mu = inf``)."""
    delta = check_delta(delta)
    mu = float(mu)
    if math.isnan(mu) or mu < 0:
        raise ValueError(f"mu must be >= 0, got {mu!r}")
    if mu == 0:
        return 0.0
    if math.isinf(mu):
        return math.inf
    log_delta = math.log(delta)

    def objective(eps: float) -> float:
        return max(log_gaussian_mechanism_delta(mu, eps), -1e4) - log_delta

    if objective(0.0) <= 0:
        return 0.0
    hi = max(1.0, mu * mu)
    while math.isfinite(hi) and objective(hi) > 0:
        hi *= 2
    if not math.isfinite(hi):  # epsilon ~ mu^2 / 2 beyond the float range (mu > ~1e154)
        return math.inf
    return float(optimize.brentq(objective, 0.0, hi, xtol=1e-12, rtol=1e-10))


# -- results -----------------------------------------------------------------------------------


class GaussianDPResult(EpsilonResult):
    """An :class:`EpsilonResult` whose ``.mu`` is the lower bound ``mu_lo`` (also in
    ``details["mu"]``) and whose ``.epsilon`` is the epsilon at ``delta`` of the
    ``mu_lo``-Gaussian mechanism."""

    @property
    def mu(self) -> float:
        return float(self.details["mu"])


# -- shared argument handling ------------------------------------------------------------------


def correction_label(correction: CorrectionStrategy) -> str:
    """How ``correction`` chose the threshold, in words for a result's method line."""
    if isinstance(correction, NoCorrection):
        return "max over all thresholds, uncorrected (reported, never alarming; not a valid bound)"
    if isinstance(correction, Bonferroni):
        where = (
            ""
            if correction.quantiles is None
            else " (" + ", ".join(f"{q:g}" for q in correction.quantiles) + ")"
        )
        return (
            f"Bonferroni over {correction.num_thresholds} quantile thresholds of the seen "
            f"scores{where}"
        )
    return f"threshold chosen on a {correction.frac} split, evaluated on the rest"


# -- mu_lo ---------------------------------------------------------------------------------------


def _mu_bounds(seen, unseen, d, thresholds, alpha):
    """mu_lo at every threshold (level alpha for the pair of rates), with the rate bounds."""
    log_fpr, log_fnr = threshold_bounds(
        seen, unseen, d, thresholds, alpha, upper=clopper_pearson_upper
    )
    with np.errstate(invalid="ignore"):
        mu = -special.ndtri_exp(log_fpr) - special.ndtri_exp(log_fnr)
    mu = np.clip(np.nan_to_num(mu, nan=0.0, posinf=_MU_MAX, neginf=0.0), 0.0, _MU_MAX)
    return mu, np.exp(log_fpr), np.exp(log_fnr)


def gdp_lower_bound(
    seen,
    unseen=None,
    *,
    d: int | None = None,
    delta: float,
    confidence: float = 0.95,
    correction: CorrectionStrategy = GDP_BONFERRONI,
    threat_model: str | None = None,
) -> GaussianDPResult:
    """Valid lower confidence bound on the Gaussian-DP parameter ``mu`` from threshold tests.

    For the test "seen when the score exceeds ``a``", ``mu``-GDP forces
    ``FNR >= Phi(Phi^-1(1 - FPR) - mu)``, i.e. ``mu >= Phi^-1(1 - FPR) - Phi^-1(FNR)``; with
    upper confidence bounds on both rates this gives

        mu_lo = max_a Phi^-1(1 - FPR_up(a)) - Phi^-1(FNR_up(a)).

    Rate bounds are one-sided Clopper-Pearson (exactly conservative). FPR is exact from the
    null cosine law in dimension ``d`` when ``unseen`` is omitted (final model, all canaries
    independent of the release), else a Clopper-Pearson bound on the unseen canaries (each
    rate at ``alpha / 2``).

    Parameters
    ----------
    seen : array_like
        Scores of the seen canaries (cosines, or known-rounds scores).
    unseen : array_like, optional
        Scores of the unseen canaries, computed the same way.
    d : int, optional
        Model dimension; required (and used for the exact null) when ``unseen`` is omitted.
    delta : float
        delta at which ``.epsilon`` reads ``mu_lo``.
    confidence : float
        Confidence of the bound.
    correction : Bonferroni, Split or NoCorrection
        Threshold strategy, as for :func:`flaudit.auditor.estimators.epsilon_lower_bound`. Only
        ``Bonferroni`` and ``Split`` are valid; ``NoCorrection`` is reported, never alarming.
    threat_model : str, optional
        Label; default ``final_model`` with the exact null, else ``all_iterates``.

    Returns
    -------
    GaussianDPResult
        ``.mu`` = ``mu_lo``; ``.epsilon`` = epsilon at ``delta`` of the ``mu_lo``-Gaussian
        mechanism: a valid refutation of any ``mu``-GDP claim with ``mu < mu_lo``. ``details``:
        ``mu``, ``threshold``, ``fpr_upper``, ``fnr_upper``, ``num_thresholds``, ``num_seen``,
        ``num_unseen``, ``fpr`` and ``rate_bounds``.
    """
    seen, unseen, d, threat_model = check_threshold_inputs(
        seen, unseen, d, correction, threat_model
    )
    delta = check_delta(delta)
    confidence = check_confidence(confidence)
    alpha = 1.0 - confidence

    def evaluate(s_, u_, thresholds, multiplicity):
        return _mu_bounds(s_, u_, d, thresholds, alpha / multiplicity)[0]

    choice = search_thresholds(
        seen, unseen, correction=correction, evaluate=evaluate, empty_value=0.0
    )
    details: dict[str, Any] = {}
    fpr = fnr = 1.0
    if choice.note:
        details["note"] = choice.note
    else:
        _, fpr_a, fnr_a = _mu_bounds(
            choice.seen,
            choice.unseen,
            d,
            choice.thresholds[[choice.index]],
            alpha / threshold_multiplicity(correction),
        )
        fpr, fnr = float(fpr_a[0]), float(fnr_a[0])
    mu_lo = float(choice.value)
    details.update(
        mu=mu_lo,
        **choice.details(fpr, fnr),
        fpr="exact null" if unseen is None else "clopper-pearson",
        rate_bounds="clopper-pearson",
    )
    return GaussianDPResult(
        epsilon=gdp_epsilon(mu_lo, delta),
        estimator=Estimator.gdp_lower_bound,
        threat_model=threat_model,
        delta=delta,
        correction=correction.kind,
        confidence=confidence,
        method="Gaussian-DP lower bound mu_lo = max over thresholds of Phi^-1(1 - FPR_up) - "
        "Phi^-1(FNR_up) (Clopper-Pearson; "
        + ("exact null FPR" if unseen is None else "FPR on unseen canaries")
        + f"; {correction_label(correction)}); epsilon is that of the mu_lo-Gaussian mechanism "
        f"at delta. Valid when the scores are independent; one release's scores share its noise "
        f"scale, which can make it overstate (docs/estimators.md): mu_lo = {mu_lo:.4g}",
        details=details,
    )
