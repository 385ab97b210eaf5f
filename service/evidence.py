"""The evidence bundle of an ended audit (``GET /audits/{id}/evidence``, docs/evidence.md): its
spec, claim, published statistics, recorded estimates, alarm and verdict, the canary-seed
commitment (and the seed itself when the spec says ``reveal_seed``), versions and times,
signed with the service's Ed25519 key over the canonical form
(:func:`flaudit.auditor.claims.evidence.canonical_json`). ``flaudit verify`` recomputes it with
:func:`flaudit.auditor.claims.evidence.recompute`.
"""

from __future__ import annotations

import sys
from importlib import metadata
from typing import Any

from ..auditor.canaries import resolve_canary_family, seen_mask
from ..auditor.claims.alerts import first_alarm
from ..auditor.claims.evidence import (
    BUNDLE_FORMAT,
    CANONICALIZATION,
    COMMITMENT_SCHEME,
    COSINE_ARRAYS,
    FINAL_BOOTSTRAP,
    canonical_json,
    cosine_summaries,
    digest,
    jsonable,
    known_rounds_json,
)
from ..auditor.spec import AuditSpec, Engine
from ..auditor.statistics import scale_dof
from .evidence_store import get_alarm_statistics, get_commitment, sign
from .record import is_record_audit
from .record_views import record_evidence_body
from .store import ENDED_STATUSES, Audit, Store
from .views import audit_verdict_view, gaps_view, iso_utc

__all__ = ["VERSIONED_PACKAGES", "build_bundle", "commitment_view", "versions"]

VERSIONED_PACKAGES = ("flaudit", "numpy", "scipy", "flwr", "dp-accounting", "cryptography")

_ROUND_FIELDS = (
    "round",
    "clip_norm",
    "cohort_size",
    "num_canaries_inserted",
    "num_failures",
    "clipped_fraction",
    "noise_stddev",
    "weight_factor",
    "noise_clip_norm",
)


def versions() -> dict[str, str | None]:
    """Versions of the code that computed the numbers (None: not installed)."""
    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for name in VERSIONED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def commitment_view(store: Store, audit: Audit, *, reveal: bool = False) -> dict[str, Any]:
    """The audit's seed commitment; with ``reveal`` (an ended audit whose spec reveals its seed)
    also the salt and the seed (as a decimal string)."""
    row = get_commitment(store, audit.id)
    out: dict[str, Any] = {
        "scheme": COMMITMENT_SCHEME,
        "commitment": None,
        "committed_at": None,
        "salt": None,
        "seed": None,
    }
    if row is None:
        return out
    out.update(commitment=row.commitment, committed_at=iso_utc(row.created_at))
    if reveal:
        out.update(salt=row.salt, seed=str(store.canary_seed(audit.id)))
    return out


def _claim(spec: AuditSpec, verdict: dict) -> dict | None:
    claim = verdict.get("claim")
    if claim is None:
        return None
    if spec.engine == Engine.external:
        read = (
            "declared by the app's own Flower strategy (PUT /audits/{id}/claim: the DP "
            "wrapper's noise multiplier, clipping, sampling and rounds), merged into the spec"
        )
    else:
        read = "from the audit spec (flaudit's own DP-FedAvg ran with these settings)"
    return {**claim, "read_from": read}


def _statistics(store: Store, audit: Audit) -> dict[str, Any]:
    spec = audit.spec
    k = int(spec["num_canaries"])
    arrays = store.cosine_arrays(audit.id)
    secret = store.load_secret_state(audit.id)
    dof = None
    if audit.dim:
        family = resolve_canary_family(
            spec.get("canary_family"), num_canaries=k, dim=int(audit.dim)
        )
        dof = scale_dof(family, num_canaries=k, dim=int(audit.dim))
    known = None if secret is None else secret.known_rounds
    gaps, _ = gaps_view(audit)
    rounds = [
        {name: getattr(row, name) for name in _ROUND_FIELDS}
        | {"update_norm": row.delta_norm, "received_at": iso_utc(row.received_at)}
        for row in store.list_rounds(audit.id)
    ]
    statistics = jsonable(
        {
            "dim": audit.dim,
            "scale_dof": dof,
            "delta": float(spec["delta"]),
            "num_canaries": k,
            "rounds_stored": int(audit.rounds_stored or 0),
            "has_final": bool(audit.has_final),
            "bootstrap": FINAL_BOOTSTRAP,
            "seen": seen_mask(secret.seed, k) if secret is not None else None,
            **{name: arrays[name] for name in COSINE_ARRAYS},
            "known_rounds": known_rounds_json(known),
            "rounds": rounds,
            "gaps": gaps,
            "max_weight_factor": audit.max_weight_factor,
            "max_canary_weight_factor": audit.max_canary_weight_factor,
            "min_noise_clip_factor": audit.min_noise_clip_factor,
            "alarm_statistics": _alarm_statistics(store, audit.id),
        }
    )
    return {**statistics, "cosine_summaries": cosine_summaries(statistics)}


def _alarm_statistics(store: Store, audit_id: str) -> dict | None:
    """The statistics of the look where the alarm first fired during training (None: it did
    not, or it fired at the final look, whose statistics are the final ones)."""
    saved = get_alarm_statistics(store, audit_id)
    if saved is None:
        return None
    return {
        "round": saved["round"],
        "max_cosines": saved["max_cosines"],
        "known_rounds": known_rounds_json(saved["known_rounds"]),
    }


def build_bundle(store: Store, audit: Audit) -> dict[str, Any]:
    """The signed evidence bundle of ``audit`` (which must have ended).

    Raises
    ------
    ValueError
        If the audit has not ended.
    """
    if audit.status not in ENDED_STATUSES:
        raise ValueError(f"audit {audit.id!r} is {audit.status}: evidence exists once it has ended")
    if is_record_audit(audit):
        bundle = {
            "format": BUNDLE_FORMAT,
            "audit": _audit_fields(audit),
            **record_evidence_body(store, audit),
            "canary_seed": commitment_view(store, audit, reveal=False),
            "versions": versions(),
            "times": _times(audit),
        }
        return _signed(store, jsonable(bundle))
    spec = AuditSpec.model_validate(audit.spec)
    verdict = audit_verdict_view(audit)
    bundle: dict[str, Any] = {
        "format": BUNDLE_FORMAT,
        "audit": _audit_fields(audit),
        "spec": audit.spec,
        "claim": _claim(spec, verdict),
        "statistics": _statistics(store, audit),
        "alarm": first_alarm(audit.alerts),
        "verdict": verdict,
        "estimates": audit.estimates or [],
        "diagnostics": audit.diagnostics or [],
        "canary_seed": commitment_view(store, audit, reveal=spec.reveal_seed),
        "versions": versions(),
        "times": _times(audit),
    }
    return _signed(store, jsonable(bundle))


def _audit_fields(audit: Audit) -> dict[str, Any]:
    """The bundle's ``audit``: which audit, and how it ended."""
    return {"id": audit.id, "name": audit.name, "status": audit.status, "reason": audit.reason}


def _times(audit: Audit) -> dict[str, Any]:
    """The bundle's ``times`` (ISO 8601, UTC)."""
    return {
        "created_at": iso_utc(audit.created_at),
        "started_at": iso_utc(audit.started_at),
        "finished_at": iso_utc(audit.finished_at),
    }


def _signed(store: Store, bundle: dict[str, Any]) -> dict[str, Any]:
    """``bundle`` with its Ed25519 signature over its canonical JSON."""
    key_id, public_key, value = sign(store, canonical_json(bundle))
    bundle["signature"] = {
        "algorithm": "Ed25519",
        "key_id": key_id,
        "public_key": public_key,
        "canonicalization": CANONICALIZATION,
        "digest": digest(bundle),
        "value": value,
    }
    return bundle
