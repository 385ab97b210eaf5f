"""The ``"tradeoff"`` member of ``GET /audits/{id}``: the f-DP picture of an audit
(:func:`flaudit.auditor.claims.tradeoff.tradeoff_picture`) from its stored statistics.

The empirical curve and its band need the seen canaries' scores, so they appear only once the
audit has ended (which canaries are seen stays secret while it runs); the claimed curve and the
``mu_lo`` curve (the final-model threshold-test bound, from the same scores) are drawn live.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..auditor.claims import final_model_normal_scores
from ..auditor.claims.curves import GaussianDPClaim, audit_claims
from ..auditor.claims.tradeoff import tradeoff_picture
from ..auditor.spec import AuditSpec
from .store import ENDED_STATUSES, Audit, Store
from .views import audit_view, cosine_columns

__all__ = ["tradeoff_view", "audit_view_with_tradeoff"]


def _claim_mu(audit: Audit, verdict: dict | None) -> float | None:
    claim = (verdict or {}).get("claim") or {}
    if isinstance(claim.get("mu"), (int, float)):
        return float(claim["mu"])
    try:
        claims = audit_claims(AuditSpec.model_validate(audit.spec))
    except (ValueError, TypeError):
        return None
    known = [c for c in claims if isinstance(c, GaussianDPClaim)]
    return known[0].mu if known else None


def _mu_lo(audit: Audit) -> tuple[float | None, dict | None]:
    """The valid lower bound on mu from the same scores as the picture: the final-model
    normal-score bound (exact for DP-FedAvg with Gaussian noise), so that its curve and the
    empirical band tell one story. The audit's largest valid bound (the verdict's, maybe of
    another threat model) is on the page's "measured" tile."""
    for e in audit.estimates or []:
        mu = (e.get("details") or {}).get("mu")
        if (
            e.get("estimator") == "normal_scores"
            and e.get("threat_model") == "final_model"
            and isinstance(mu, (int, float))
            and math.isfinite(mu)
        ):
            return float(mu), e
    return None, None


def tradeoff_view(
    store: Store, audit: Audit, *, verdict: dict | None = None, cache=None
) -> dict[str, Any]:
    """The f-DP picture of ``audit`` (see the module docstring)."""
    claim_mu = _claim_mu(audit, verdict)
    mu_lo, bound = _mu_lo(audit)
    seen_z = None
    if audit.status in ENDED_STATUSES and audit.dim:
        columns = cosine_columns(store, audit, cache=cache)
        final = columns.arrays.get("final_cosines")
        if final is not None and columns.seen is not None:
            scores = np.asarray(final, dtype=np.float64)[np.asarray(columns.seen, dtype=bool)]
            seen_z = final_model_normal_scores(scores[np.isfinite(scores)], int(audit.dim))
    picture = tradeoff_picture(seen_z, claim_mu=claim_mu, mu_lo=mu_lo, num_points=101)
    picture["threat_model"] = "final_model"
    picture["mu_lo_from"] = (
        None
        if bound is None
        else {
            k: bound.get(k)
            for k in ("estimator", "name", "threat_model", "correction", "confidence")
            if k in bound
        }
    )
    return picture


def audit_view_with_tradeoff(store: Store, audit: Audit, *, cache=None) -> dict[str, Any]:
    """``GET /audits/{id}``'s body: :func:`~flaudit.service.views.audit_view` plus
    ``"tradeoff"`` (one builder for the route and the read cache's refresh)."""
    view = audit_view(audit, round_times=store.round_times(audit.id))
    view["tradeoff"] = tradeoff_view(store, audit, verdict=view.get("verdict"), cache=cache)
    return view
