"""Interference between canaries (Keinan et al. 2025; Andrew et al. 2023 §5.3).

With ``k`` canaries in one release of dimension ``d`` the other canaries act as extra noise: for
the Gaussian mechanism ``rho = sum_j c_j + N(0, sigma^2 I_d)`` the seen cosines are close to
``N(1 / sqrt(k + sigma^2 d), 1/d)``, i.e. the audit measures the Gaussian mechanism with the
*effective* noise ``sigma_eff = sqrt(sigma^2 + k/d)`` instead of ``sigma``. The estimate is
biased low by ``eps(sigma_eff) / eps(sigma) - 1``; it matters when ``k/d`` is not small against
``sigma^2`` (low noise, many canaries, small models). ``benchmarks/fidelity/interference.py``
measures the bias and ``docs/fidelity.md`` records the numbers behind the thresholds here.

All of this is about the ``gaussian`` (iid) canary family. The ``orthogonal`` family
(:mod:`flaudit.auditor.canaries`) has no canary-canary interference: its canaries are exactly
orthonormal and its statistic is standardized by the empirical null scale (the part of the
update orthogonal to every seen canary, :mod:`flaudit.auditor.statistics`), so the effective noise is
the configured one at any ``k <= d``.
"""

from __future__ import annotations

import math

from ..canaries import CanaryFamily

__all__ = [
    "effective_noise_multiplier",
    "interference_warning",
    "INTERFERENCE_RATIO_THRESHOLD",
    "INTERFERENCE_NOISE_TOLERANCE",
]

#: Canaries per dimension above which the estimate can be biased low whatever the noise
#: (at analytic epsilon ~30 the bias is already ~10% at k/d = 1%, see docs/fidelity.md).
INTERFERENCE_RATIO_THRESHOLD = 0.01

#: With a known noise multiplier: warn when the effective noise exceeds the configured one by
#: more than this fraction (then the estimate is biased low by roughly 5-10%).
INTERFERENCE_NOISE_TOLERANCE = 0.025


def _check_counts(num_canaries, dim) -> tuple[int, int]:
    """``(num_canaries, dim)``, checked: integers, at least 0 and 2."""
    for value, name, minimum in ((num_canaries, "num_canaries", 0), (dim, "dim", 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return num_canaries, dim


def effective_noise_multiplier(
    num_canaries: int,
    dim: int,
    *,
    noise_multiplier: float,
    family: CanaryFamily | str = CanaryFamily.gaussian,
) -> float:
    """``sqrt(z^2 + k/d)``: the noise multiplier the canary audit effectively measures when
    ``num_canaries`` iid (``gaussian``) canaries share one release of dimension ``dim``; ``z``
    itself for the ``orthogonal`` family (no interference).

    Raises
    ------
    ValueError
        Naming the bad argument.
    """
    k, d = _check_counts(num_canaries, dim)
    z = float(noise_multiplier)
    if not (z >= 0 and math.isfinite(z)):
        raise ValueError(f"noise_multiplier must be a finite number >= 0, got {noise_multiplier!r}")
    if _check_family(family) is CanaryFamily.orthogonal:
        return z
    return math.hypot(z, math.sqrt(k / d))


def _check_family(family: CanaryFamily | str) -> CanaryFamily:
    try:
        return CanaryFamily(family)
    except ValueError:
        raise ValueError(
            f"family must be 'orthogonal' or 'gaussian', got {family!r}"
        ) from None  # hypot: no underflow of z * z for tiny z


def interference_warning(
    num_canaries: int,
    dim: int,
    *,
    noise_multiplier: float | None = None,
    family: CanaryFamily | str = CanaryFamily.gaussian,
    ratio_threshold: float = INTERFERENCE_RATIO_THRESHOLD,
    noise_tolerance: float = INTERFERENCE_NOISE_TOLERANCE,
) -> str | None:
    """A warning when ``num_canaries / dim`` is in the zone where canaries bias the estimate.

    Parameters
    ----------
    num_canaries : int
        Canaries that can share one release (conservative: the spec's total ``k``; for the final
        model every seen canary ends up in ``theta_T - theta_0``).
    dim : int
        Model dimension ``d``.
    noise_multiplier : float, optional
        ``z``. When given, the warning uses the predicted effective noise
        (:func:`effective_noise_multiplier`): it warns when ``sqrt(z^2 + k/d) / z - 1`` exceeds
        ``noise_tolerance`` (always when ``z = 0`` and ``k/d >= ratio_threshold / 10``). When
        omitted, it warns when ``k/d >= ratio_threshold``.
    family : CanaryFamily or str
        The audit's canary family. ``orthogonal``: no warning for any ``k <= d`` (exactly
        orthonormal canaries do not interfere); ``k > d`` cannot be orthogonal and is refused
        before an audit starts. Default ``gaussian``, the conservative reading.
    ratio_threshold : float
        ``k/d`` threshold without a noise multiplier (default 1%).
    noise_tolerance : float
        Tolerated relative inflation of the effective noise (default 2.5%).

    Returns
    -------
    str or None
        A sentence a user can act on, or None when ``k/d`` is safely small.

    Raises
    ------
    ValueError
        Naming the bad argument.
    """
    k, d = _check_counts(num_canaries, dim)
    if not (ratio_threshold > 0 and math.isfinite(ratio_threshold)):
        raise ValueError(f"ratio_threshold must be a finite number > 0, got {ratio_threshold!r}")
    if not (noise_tolerance > 0 and math.isfinite(noise_tolerance)):
        raise ValueError(f"noise_tolerance must be a finite number > 0, got {noise_tolerance!r}")
    if _check_family(family) is CanaryFamily.orthogonal:
        return None
    ratio = k / d
    advice = (
        f'use the orthogonal canary family (canary_family = "orthogonal", no interference '
        f"for any k <= d), or at most {max(1, int(ratio_threshold * d))} canaries for this "
        "model size, or read the estimate as a lower value than the truth"
    )
    if noise_multiplier is None:
        if ratio < ratio_threshold:
            return None
        return (
            f"{k} canaries for a model of dimension {d} (k/d = {ratio:.2%}): canaries interfere "
            f"with each other above k/d = {ratio_threshold:.1%} and bias epsilon estimates low "
            f"at low noise; {advice}"
        )
    z_eff = effective_noise_multiplier(k, d, noise_multiplier=noise_multiplier)
    z = float(noise_multiplier)
    if z == 0:
        if ratio < ratio_threshold / 10:
            return None
        return (
            f"{k} canaries for a model of dimension {d} (k/d = {ratio:.2%}) with no noise: the "
            f"canaries are the only noise the audit sees (effective noise multiplier "
            f"{z_eff:.3g}), so epsilon estimates are finite and far too low"
        )
    inflation = z_eff / z - 1
    if inflation <= noise_tolerance:
        return None
    return (
        f"{k} canaries for a model of dimension {d} (k/d = {ratio:.2%}) at noise multiplier "
        f"{z:g}: the other canaries act as extra noise (effective noise multiplier {z_eff:.3g}, "
        f"+{inflation:.1%}), so epsilon estimates are biased low; use the orthogonal canary "
        f"family (no interference for any k <= d), or at most "
        f"{max(1, int(d * z * z * ((1 + noise_tolerance) ** 2 - 1)))} canaries, or read the "
        "estimate as a lower value than the truth"
    )
