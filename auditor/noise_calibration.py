"""The noise a round got against the clip norm its updates had (issue #38), in words.

A DP wrapper that clips round ``t``'s updates to ``C_clip`` must add noise ``z * C_clip / n``.
Flower's adaptive-clipping wrappers move the clip norm by its geometric update first and add
``z * C_noise / n`` with ``C_noise = C_{t+1}``: the round's effective noise multiplier is
``z * C_noise / C_clip``. The ServerApp reports both norms per round; the smallest ratio
``C_noise / C_clip`` below 1 is a finding of the audit (verdict, alert, evidence), whatever the
canaries' tests say: it is read off the mechanism, not estimated.

Also the sentence that splits an adaptive-clipping claim into the configured ``z``, the
clipped-count noise ``sigma_b`` and the update noise ``z_delta`` the canaries meet.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = [
    "SHORT_NOISE_TOLERANCE",
    "shortfall_text",
    "canary_noise_multiplier",
    "clip_growth_bound",
    "noise_calibration",
    "noise_calibration_alerts",
    "noise_clip_factor",
    "noise_split_sentence",
    "signal_factor",
    "with_noise_calibration",
]

#: A factor above ``1 - SHORT_NOISE_TOLERANCE`` is float round-off, not a finding.
SHORT_NOISE_TOLERANCE = 1e-9


def canary_noise_multiplier(spec) -> float:
    """The noise multiplier the canaries meet: the update noise ``spec.noise_multiplier``. Under
    adaptive clipping that is ``z_delta``, not ``accounted_noise_multiplier`` (``z_total``, which
    adds the clipped-count query no canary sees: a design or a claim test on it is the wrong
    mechanism for the canaries, issue #38). Spec-likes without ``noise_multiplier``: the
    accounted one."""
    z = getattr(spec, "noise_multiplier", None)
    return float(spec.accounted_noise_multiplier if z is None else z)


def clip_growth_bound(spec) -> float:
    """How much more noise than ``z * C_t / n`` a canary of norm ``C_t`` can meet in a round,
    on average, under adaptive clipping as Flower runs it (1 without adaptive clipping).

    Flower's adaptive wrappers noise round ``t`` for the clip norm after its geometric update,
    ``C_{t+1} = C_t exp(-eta (b - gamma))`` with ``b`` the noisy clipped fraction
    ``(clipped + N(0, sigma_b^2)) / n``: the canaries (never clipped) meet noise ``C_{t+1} /
    C_t`` times what their norm needs. The largest expected factor, every update unclipped, is
    ``E[exp(eta (gamma - N(0, sigma_b^2) / n))] = exp(eta gamma + eta^2 sigma_b^2 / (2 n^2))``
    (``eta``: ``learning_rate``, ``gamma``: ``target_quantile``). A run whose noise is ``s``
    times the claim's then looks like ``s * growth`` to the canaries, so the design divides its
    factor by this bound and sizes the canaries for it (issue #38)."""
    adaptive = _get(spec, "adaptive_clipping")
    if adaptive is None or not float(_get(spec, "noise_multiplier") or 0.0):
        return 1.0
    eta = float(_get(adaptive, "learning_rate") or 0.0)
    gamma = float(_get(adaptive, "target_quantile") or 0.0)
    n = _get(spec, "clients_per_round")
    sigma_b = _get(adaptive, "clipped_count_stddev")
    if sigma_b is None and n:
        sigma_b = int(n) / 20  # Flower's (and the spec's) default
    spread = (eta * float(sigma_b) / int(n)) ** 2 / 2 if n and sigma_b else 0.0
    return float(math.exp(eta * gamma + spread))


def noise_clip_factor(clip_norm: float | None, noise_clip_norm: float | None) -> float | None:
    """``noise_clip_norm / clip_norm`` (None when the noise's norm was not reported)."""
    if noise_clip_norm is None or not clip_norm:
        return None
    return float(noise_clip_norm) / float(clip_norm)


def signal_factor(weight_factor: float | None = None, noise_factor: float | None = None) -> float:
    """A round's signal under the claim in units of the unweighted claim's, for the mechanism
    actually run: ``max(1, W_t) / min(1, f_t)`` with ``W_t`` the round's ``weight_factor`` (the
    heaviest influence a reply carried, in units of ``C/n``) and ``f_t`` its
    ``noise_clip_norm / clip_norm`` (:func:`noise_clip_factor`). A round noised for a smaller norm
    than it clipped to (``f_t < 1``) has noise ``z f_t C/n``, so correct code for that
    mechanism gives a canary ``W_t / (z f_t)`` per participation; a round noised for more
    (``f_t > 1``) is tested at the claim, never above it (its extra noise is not credited, so a
    run that meets its claim is never refuted for missing the extra). None: 1. The claim tests
    run each round at its own factor (:meth:`flaudit.auditor.claims.known_rounds.KnownRoundsStatistic.rounds_at`;
    docs/estimators.md, "Per-round weights" and "The mechanism actually run")."""
    w = 1.0 if weight_factor is None else float(weight_factor)
    f = 1.0 if noise_factor is None else float(noise_factor)
    if not (math.isfinite(w) and math.isfinite(f) and f > 0):
        raise ValueError(
            f"signal_factor: need finite W and f > 0, got {weight_factor!r}, {noise_factor!r}"
        )
    return max(1.0, w) / min(1.0, f)


def _get(spec: Any, name: str) -> Any:
    return spec.get(name) if isinstance(spec, Mapping) else getattr(spec, name, None)


def noise_split_sentence(spec: Any) -> str | None:
    """ "noise multiplier 1 as configured; with clipped-count noise sigma_b = 1 the updates get
    1.155 (...), which is what the canaries meet" for an adaptive-clipping claim whose
    configured ``z`` is known; None otherwise."""
    z = _get(spec, "configured_noise_multiplier")
    adaptive = _get(spec, "adaptive_clipping")
    sigma_b = _get(adaptive, "clipped_count_stddev") if adaptive is not None else None
    if z is None or not sigma_b:
        return None
    return (
        f"noise multiplier {z:.4g} as configured; with clipped-count noise sigma_b = "
        f"{sigma_b:.4g} the updates get {float(_get(spec, 'noise_multiplier')):.4g} "
        "(Andrew et al. 2021: z_delta = (z^-2 - (2 sigma_b)^-2)^-1/2), which is what the "
        "canaries meet"
    )


def shortfall_text(factor: float) -> str:
    """A noise factor below 1 in three decimals, rounded down: 0.9999 reads "0.999", never "1"
    (a finding must not read as no finding)."""
    return f"{math.floor(float(factor) * 1000) / 1000:.3f}"


def noise_calibration(spec: Any, min_factor: float | None) -> dict | None:
    """The finding for a run whose smallest ``C_noise / C_clip`` is ``min_factor`` (None:
    every round noised for its own clip norm, or not reported)."""
    if min_factor is None or not math.isfinite(min_factor):
        return None
    if min_factor >= 1 - SHORT_NOISE_TOLERANCE:
        return None
    z = float(_get(spec, "noise_multiplier") or 0.0)
    if z == 0:
        return None
    effective = z * min_factor
    return {
        "min_factor": float(min_factor),
        "noise_multiplier": z,
        "effective_noise_multiplier": effective,
        "sentence": (
            f"Some round was noised for a smaller clip norm than its updates were clipped to: "
            f"its noise is {shortfall_text(min_factor)}× what that clip norm needs (effective noise "
            f"multiplier {effective:.4g}, claimed {z:.4g}); the claim does not hold for that "
            "round, whatever the canaries say (Flower's adaptive-clipping wrappers add the noise "
            "for the clip norm after its update; each round's noise_clip_norm is in "
            "GET /audits/{id}/rounds)."
        ),
    }


def with_noise_calibration(verdict: dict, spec: Any, min_factor: float | None) -> dict:
    """``verdict`` (a ``Verdict.to_dict()``) with ``noise_calibration`` and ``noise_split``
    added, the same on the page, in the API and in the evidence bundle."""
    out = dict(verdict)
    out["noise_calibration"] = finding = noise_calibration(spec, min_factor)
    out["noise_split"] = split = noise_split_sentence(spec)
    extra = [
        text for text in (finding and finding["sentence"], split and f"Noise: {split}.") if text
    ]
    if extra and out.get("summary"):  # the page and the CLI show the summary verbatim
        out["summary"] = " ".join([out["summary"], *extra])
    return out


def noise_calibration_alerts(verdict: Mapping[str, Any]) -> list[dict]:
    """A warning alert for the verdict's ``noise_calibration`` finding (none without it)."""
    finding = verdict.get("noise_calibration")
    if not finding:
        return []
    return [{"level": "warning", "message": f"noise calibration: {finding['sentence']}"}]
