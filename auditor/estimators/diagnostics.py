"""Checks of the estimators' assumptions, each a :class:`~flaudit.auditor.results.Diagnostic` with a
plain-language hint."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy import special

from ..results import Diagnostic
from ._validation import check_dim, check_scores
from .null import null_cdf

__all__ = ["anderson_darling", "unseen_vs_null", "bootstrap_interval"]


#: Asymptotic critical values for a normal with estimated mean and variance (Stephens 1974);
#: at sample size n they are divided by (1 + 4/n - 25/n^2), as scipy.stats.anderson does.
_AD_CRITICAL = {0.15: 0.576, 0.10: 0.656, 0.05: 0.787, 0.025: 0.918, 0.01: 1.092}


def _ad_statistic(values: np.ndarray) -> float:
    """Anderson–Darling statistic A^2 against N(mean, std^2) fitted to ``values``."""
    x = np.sort(values)
    n = x.size
    z = (x - x.mean()) / x.std(ddof=1)
    log_cdf = special.log_ndtr(z)
    log_sf = special.log_ndtr(-z)
    i = np.arange(1, n + 1)
    a2 = -n - np.mean((2 * i - 1) * (log_cdf + log_sf[::-1]))
    return float(a2)


def anderson_darling(values, *, name: str, level: float = 0.05) -> Diagnostic:
    """Anderson–Darling statistic of ``values`` against a normal with fitted mean and variance
    (Andrew et al. App. B). ``ok`` when below the critical value at ``level`` (1%, 2.5%, 5%, 10%
    or 15%)."""
    values = check_scores(values, "values")
    if level not in _AD_CRITICAL:
        raise ValueError(f"level must be one of {sorted(_AD_CRITICAL)}, got {level!r}")
    if values.size < 8 or np.ptp(values) == 0:
        return Diagnostic(
            name=f"anderson_darling_{name}",
            value=0.0,
            ok=False,
            hint=f"too few or constant {name} cosines ({values.size}) to check the Gaussian fit",
            details={"num": int(values.size), "checked": False},
        )
    stat = _ad_statistic(values)
    n = values.size
    crit = _AD_CRITICAL[level] / (1 + 4 / n - 25 / n**2)
    ok = stat < crit
    hint = (
        f"the {name} cosines look Gaussian (A^2 = {stat:.2f} < {crit:.2f})"
        if ok
        else f"the Gaussian fit of the {name} cosines looks poor (A^2 = {stat:.2f} >= {crit:.2f} "
        f"at {level:.0%}): trust epsilon_lo more than epsilon_est"
    )
    return Diagnostic(
        name=f"anderson_darling_{name}",
        value=stat,
        ok=ok,
        hint=hint,
        details={"critical_value": crit, "level": level, "num": int(values.size), "checked": True},
    )


def unseen_vs_null(unseen, d: int, *, level: float = 0.01) -> Diagnostic:
    """Kolmogorov–Smirnov test of the unseen canaries' final-model cosines against the exact
    null cosine distribution in dimension ``d``. A rejection means the null the final-model
    estimate assumes is wrong (e.g. canaries correlated with the model, a bug in insertion)."""
    unseen = check_scores(unseen, "unseen")
    d = check_dim(d)
    if unseen.size < 5:
        return Diagnostic(
            name="unseen_vs_null",
            value=0.0,
            ok=True,
            hint=f"too few unseen canaries ({unseen.size}) to check them against the null",
            details={"num": int(unseen.size), "checked": False},
        )
    from scipy import stats  # slow to import; only this check needs it

    res = stats.kstest(unseen, lambda t: null_cdf(t, d))
    p = float(res.pvalue)
    ok = p >= level
    mean_z = float(np.mean(unseen) * math.sqrt(d * unseen.size))
    hint = (
        "unseen canaries match the null N(0, 1/d)"
        if ok
        else f"unseen canaries do not follow the null (KS p = {p:.2g}; mean at {mean_z:.1f} "
        "standard errors): the final-model estimate's null is wrong, check canary insertion"
    )
    return Diagnostic(
        name="unseen_vs_null",
        value=float(res.statistic),
        ok=ok,
        hint=hint,
        details={
            "p_value": p,
            "level": level,
            "num": int(unseen.size),
            "checked": True,
            "mean_z": mean_z,
        },
    )


def bootstrap_interval(
    estimate: Callable[[np.ndarray, np.ndarray], float],
    seen: np.ndarray,
    unseen: np.ndarray | None,
    *,
    name: str,
    point: float,
    num_resamples: int = 200,
    confidence: float = 0.9,
    seed: int = 0,
) -> Diagnostic:
    """Percentile bootstrap interval of ``estimate(seen, unseen)`` over canaries (resampled with
    replacement within each group). ``ok`` when the interval is finite and its width is below
    the point estimate's size + 1 (a rough "stable enough to read" check)."""
    rng = np.random.default_rng(seed)
    values = np.empty(num_resamples)
    for b in range(num_resamples):
        s = seen[rng.integers(0, seen.size, seen.size)]
        u = None if unseen is None else unseen[rng.integers(0, unseen.size, unseen.size)]
        values[b] = estimate(s, u)
    # no interpolation: values may be inf
    lo = float(np.quantile(values, (1 - confidence) / 2, method="lower"))
    hi = float(np.quantile(values, (1 + confidence) / 2, method="higher"))
    width = hi - lo if math.isfinite(hi) else math.inf
    ok = math.isfinite(width) and width <= max(1.0, abs(point) if math.isfinite(point) else 0) + 1
    hint = f"{name}: bootstrap {confidence:.0%} interval [{lo:.2f}, {hi:.2f}] over canaries" + (
        ""
        if ok
        else ": wide, the estimate depends strongly on which canaries were drawn (add canaries)"
    )
    return Diagnostic(
        name=f"bootstrap_{name}",
        value=width,
        ok=ok,
        hint=hint,
        details={
            "lower": lo,
            "upper": hi,
            "confidence": confidence,
            "num_resamples": num_resamples,
            "point": point,
        },
    )


def unseen_normal_scores_check(
    unseen_scores, *, level: float = 0.01, name: str = "unseen_known_rounds_vs_null"
) -> Diagnostic:
    """Kolmogorov-Smirnov test of the unseen canaries' normal scores against N(0, 1).

    The normal-score claim tests (:mod:`flaudit.auditor.claims.normal_scores`) calibrate every
    seen score against a null that is N(0, 1) by construction when canary directions are
    independent of the release; the unseen canaries are draws of that null in this very run.
    A rejection says the calibration does not hold here (correlated released aggregates with
    canary repeats, canaries correlated with the model, an insertion bug): read the
    normal-score tier's refutations with care and rely on the assumption-free tier.
    """
    z = np.asarray(unseen_scores, dtype=np.float64)
    z = z[np.isfinite(z)]
    if z.size < 5:
        return Diagnostic(
            name=name,
            value=0.0,
            ok=True,
            hint=f"too few unseen canaries scored ({z.size}) to check the null",
            details={"num": int(z.size), "checked": False},
        )
    from scipy import stats

    res = stats.kstest(z, "norm")
    p = float(res.pvalue)
    ok = p >= level
    hint = (
        "unseen canaries' normal scores match N(0, 1): the normal-score tests are calibrated"
        if ok
        else f"unseen canaries' normal scores do not follow N(0, 1) (KS p = {p:.2g}, mean "
        f"{float(z.mean()):.2f}, std {float(z.std()):.2f}): the normal-score tier's "
        "calibration is doubtful in this run; rely on the assumption-free tier"
    )
    return Diagnostic(
        name=name,
        value=float(res.statistic),
        ok=ok,
        hint=hint,
        details={
            "num": int(z.size),
            "checked": True,
            "p_value": p,
            "mean": float(z.mean()),
            "std": float(z.std()),
        },
    )
