"""TODO(wiring stand-in, replaced when the "power" branch is merged): a placeholder
:class:`AuditDesign` with the contract's fields (CONTRACT.md), so the service, the CLI and the
page can be wired before power's ``audit_design`` lands. It computes no power: ``testable`` is a
rule of thumb (``k >= 100 mu``, close to the refutable limits measured in issue #19 for today's
alarm), the detectable fields are None, and its summary says it is a placeholder.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class AuditDesign:
    claim_mu: float | None
    claim_epsilon: float | None
    delta: float
    detectable_noise_scale: float | None
    detectable_mu: float | None
    detectable_epsilon: float | None
    max_refutable_mu: float | None
    testable: bool
    summary: str
    advice: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def audit_design(spec, *, alpha: float = 0.05, power: float = 0.95) -> AuditDesign:
    """Placeholder (see the module docstring)."""
    import math

    from ..estimators.gdp import gdp_epsilon

    z = float(spec.accounted_noise_multiplier)
    if z == 0:
        return AuditDesign(None, None, spec.delta, None, None, None, None, False,
                           "no DP claim to test (noise multiplier 0)", None)
    mu = math.sqrt(spec.canary_repeats) / z
    k = int(spec.num_canaries)
    limit = k / 100.0
    testable = mu <= limit
    advice = None if testable else (
        f"use at least {math.ceil(100 * mu)} canaries (k = {k} now) to make the claim testable")
    summary = (f"can refute claims up to about μ = {limit:.3g} with k = {k} canaries "
               "(placeholder design until the power stream's lands)")
    return AuditDesign(mu, gdp_epsilon(mu, spec.delta), spec.delta, None, None, None, limit,
                       testable, summary, advice)


def refuted_by_from_rejected(decision) -> dict | None:
    """TODO(wiring stand-in): power's ``AlarmDecision.refuted_by`` from today's ``rejected``
    list -- the error-level test with the smallest p-value, without a bound (``mu_lo`` None)."""
    rejected = [t for t in decision.rejected
                if (t.get("claim") or {}).get("threat_model") == "known_rounds"]
    if decision.status != "error" or not rejected:
        return None
    best = min(rejected, key=lambda t: float(t["p_value"]))
    return {
        "test": f"{best.get('threat_model')}_claim_test",
        "threat_model": best.get("threat_model"),
        "tier": None,
        "p_value": float(best["p_value"]),
        "level": float(decision.level_per_test),
        "claim_mu": (best.get("claim") or {}).get("mu"),
        "mu_lo": None,
        "epsilon_lo": None,
        "confidence": 0.95,
    }
