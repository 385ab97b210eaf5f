"""How a record-level audit fed by a Flower app is shown (issue #37): ``GET /audits/{id}``, the
audit list, and the evidence bundle's body (``service/record.py`` runs the audit). The seen/unseen
split appears only in the bundle of an ended audit; the seed never does."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from ..auditor.canaries import seen_mask
from ..auditor.claims.record_external import record_external_claim
from ..auditor.record_spec import RecordServiceSpec
from ..auditor.results import jsonable
from .record import canary_owner, client_claims
from .tables import RecordAudit, RecordClient, RecordRound, bytes_to_array
from .views import iso_utc, summary_row

__all__ = ["record_evidence_body", "record_summary", "record_view"]


def record_view(store, audit) -> dict[str, Any]:
    """``GET /audits/{id}`` of a record-level audit: level, status, the claim over the run and
    per round (each group's ``clients`` are the service's client indices, its ``client_keys``
    the same clients' Flower node ids), the design line, the looks, the alarm, the verdict with
    its cause in words; the seen/unseen split only once ended, the seed never."""
    with store.session() as s:
        record = s.get(RecordAudit, audit.id)
        rows = s.scalars(
            select(RecordClient)
            .where(RecordClient.audit_id == audit.id)
            .order_by(RecordClient.client_index)
        ).all()
        clients = [
            {"client": r.client_key, "index": r.client_index, **_public_state(r.state)}
            for r in rows
        ]
    spec = RecordServiceSpec.model_validate(audit.spec)
    looks = list(record.looks or []) if record else []
    claim = (record.claim if record else None) or record_external_claim(
        client_claims(clients), delta=spec.delta
    )
    claim = _with_client_keys(claim, {c["index"]: c["client"] for c in clients})
    alarm = next((look for look in looks if look["status"] == "error"), None)
    return jsonable(
        {
            "id": audit.id,
            "name": audit.name,
            "level": "record",
            "engine": "external",
            "status": audit.status,
            "reason": audit.reason,
            "spec": audit.spec,
            "created_at": iso_utc(audit.created_at),
            "finished_at": iso_utc(audit.finished_at),
            "progress": {
                "rounds_reported": record.rounds_reported if record else 0,
                "last_round": record.last_round if record else 0,
                "num_rounds": spec.num_rounds,
            },
            "dim": record.dim if record else None,
            "claim": claim,
            "design": record.design if record else None,
            "looks": [_look_summary(look) for look in looks],
            "alarm": None if alarm is None else _look_summary(alarm),
            "cause": record.cause if record else None,
            "verdict": record.verdict if record else None,
            "clients": clients,
            "links": {"self": f"/audits/{audit.id}"},
        }
    )


def _with_client_keys(claim: dict, keys: dict[int, str]) -> dict:
    """The claim with each group's clients also by their Flower node ids (``client_keys``, in
    the order of ``clients``): the page shows the id the operator knows, not the index."""
    groups = [
        {**g, "client_keys": [keys.get(int(i), str(i)) for i in g.get("clients", [])]}
        for g in claim.get("groups", [])
    ]
    return {**claim, "groups": groups} if "groups" in claim else claim


def _public_state(state: dict) -> dict:
    return {
        "rounds_trained": state.get("rounds_trained", 0),
        "steps": state.get("steps", 0),
        "planned_steps": sum(int(r.get("planned_steps", 0)) for r in state.get("rounds", [])),
        "noise_multiplier": state.get("noise_multiplier"),
        "sample_rate": state.get("sample_rate"),
    }


def _look_summary(look: dict) -> dict:
    return {
        "round": look.get("round"),
        "look": look["look"],
        "status": look["status"],
        "steps": look["steps"],
        "claim_epsilon": look["claim_epsilon"],
        "p_value": min((t["p_value"] for t in look["tests"]), default=1.0),
        "groups": [
            {
                k: g[k]
                for k in ("noise_multiplier", "sample_rate", "steps", "clients", "status")
                if k in g
            }
            for g in look.get("groups", [])
        ],
    }


def record_evidence_body(store, audit) -> dict[str, Any]:
    """The evidence bundle of an ended record-level audit, before its signature
    (:func:`flaudit.auditor.claims.record_evidence.recompute_record` recomputes it): every
    look's scores and projections with the clients' claims at that look, the seen set (the
    audit has ended), the design, claim, looks, cause and verdict. The seed stays secret (its
    commitment is in ``canary_seed``)."""
    spec = RecordServiceSpec.model_validate(audit.spec)
    with store.session() as s:
        record = s.get(RecordAudit, audit.id)
        rows = s.scalars(
            select(RecordRound).where(RecordRound.audit_id == audit.id).order_by(RecordRound.round)
        ).all()
        rounds = [
            {
                "round": r.round,
                "clients": r.clients,
                "scores": bytes_to_array(r.scores),
                "noise_units": bytes_to_array(r.noise_units),
                "shift_units": bytes_to_array(r.shift_units),
                "signals": bytes_to_array(r.signals),
            }
            for r in rows
        ]
    seed = store.canary_seed(audit.id)
    return jsonable(
        {
            "level": "record",
            "spec": audit.spec,
            "statistics": {
                "seen": seen_mask(seed, spec.num_canaries),
                "owner": canary_owner(spec),
                "dim": record.dim,
                "rounds": rounds,
            },
            "design": record.design,
            "claim": record.claim,
            "looks": record.looks or [],
            "cause": record.cause,
            "verdict": record.verdict,
        }
    )


def record_summary(store, audit) -> dict[str, Any]:
    """A record-level audit as the audit list shows it (``AuditSummary``)."""
    with store.session() as s:
        record = s.get(RecordAudit, audit.id)
    verdict = (record.verdict if record else None) or {
        "status": "running",
        "summary": "Record-level audit running: "
        + (
            "the alarm fired."
            if record and any(look["status"] == "error" for look in record.looks or [])
            else "no alarm so far."
        ),
    }
    claim = record.claim if record else None
    epsilon = None if not claim else claim.get("epsilon")
    rounds = record.last_round if record else 0
    return summary_row(
        audit,
        {
            "status": verdict["status"],
            "summary": verdict["summary"],
            "claim": None if epsilon is None else {"epsilon": epsilon, "delta": claim["delta"]},
        },
        {
            "round": rounds,
            "num_rounds": int(audit.spec["num_rounds"]),
            "fraction": rounds / int(audit.spec["num_rounds"]),
            "eta_seconds": None,
            "waiting_for": None,
        },
        None,
    )
