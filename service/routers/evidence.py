"""Evidence routes: the signed bundle and the printable report of an ended audit, the canary-seed
commitment of any audit, and the service's public signing keys (docs/evidence.md)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse

from ..auth import read_access
from ..evidence import build_bundle, commitment_view
from ..evidence_schemas import CommitmentOut, EvidenceOut, KeyList, RecordEvidenceOut
from ..evidence_store import list_signing_keys
from ..record import is_record_audit, record_view
from ..report import render_record_report, render_report
from ..store import ENDED_STATUSES, Store
from ..tradeoff_view import audit_view_with_tradeoff
from ..views import iso_utc
from .deps import AuditId

router = APIRouter(tags=["evidence"])

_NOT_FOUND = {404: {"description": "No audit with this id."}}
_NOT_ENDED = {409: {"description": "The audit has not ended yet."}}


def _ended_audit(store: Store, audit_id: str):
    audit = store.get_audit(audit_id)
    if audit is None:
        raise HTTPException(status_code=404, detail=f"audit {audit_id!r} not found")
    if audit.status not in ENDED_STATUSES:
        raise HTTPException(
            status_code=409,
            detail=(f"audit {audit_id!r} is {audit.status}: its evidence exists once it has ended"),
        )
    return audit


@router.get(
    "/audits/{audit_id}/evidence",
    response_model=EvidenceOut,
    dependencies=[Depends(read_access)],
    responses={**_NOT_FOUND, **_NOT_ENDED},
    summary="Signed evidence bundle of an ended audit (check it with `flaudit verify`)",
)
def get_evidence(audit_id: AuditId, request: Request) -> JSONResponse:
    """Spec, claim, every published statistic the estimates need, verdict, estimates, versions
    and times, signed with the service's Ed25519 key. `flaudit verify` recomputes the
    verdict and every number from it offline."""
    store: Store = request.app.state.store
    bundle = build_bundle(store, _ended_audit(store, audit_id))
    (RecordEvidenceOut if bundle.get("level") == "record" else EvidenceOut).model_validate(bundle)
    return JSONResponse(
        bundle, headers={"Content-Disposition": f'attachment; filename="{audit_id}-evidence.json"'}
    )


@router.get(
    "/audits/{audit_id}/commitment",
    response_model=CommitmentOut,
    dependencies=[Depends(read_access)],
    responses=_NOT_FOUND,
    summary="The commitment to the audit's canary seed (made at creation; never the seed)",
)
def get_commitment(audit_id: AuditId, request: Request) -> dict:
    store: Store = request.app.state.store
    audit = store.get_audit(audit_id)
    if audit is None:
        raise HTTPException(status_code=404, detail=f"audit {audit_id!r} not found")
    return commitment_view(store, audit)


@router.get(
    "/audits/{audit_id}/report",
    response_class=HTMLResponse,
    dependencies=[Depends(read_access)],
    responses={
        **_NOT_FOUND,
        **_NOT_ENDED,
        200: {"content": {"text/html": {}}, "description": "One self-contained HTML file."},
    },
    summary="Printable report of an ended audit: one self-contained HTML file",
)
def get_report(audit_id: AuditId, request: Request) -> HTMLResponse:
    """Verdict, tiles, f-DP picture, bounds over rounds, design, gaps, spec, evidence hash and
    key id; inline CSS and SVG, nothing fetched when viewed; prints to PDF."""
    store: Store = request.app.state.store
    audit = _ended_audit(store, audit_id)
    bundle = build_bundle(store, audit)
    if is_record_audit(audit):
        return HTMLResponse(
            render_record_report(record_view(store, audit), bundle),
            headers={"Content-Disposition": f'attachment; filename="{audit_id}-report.html"'},
        )
    view = audit_view_with_tradeoff(store, audit)
    html = render_report(view, bundle, [r.estimates or [] for r in store.list_rounds(audit_id)])
    return HTMLResponse(
        html, headers={"Content-Disposition": f'attachment; filename="{audit_id}-report.html"'}
    )


@router.get(
    "/keys",
    response_model=KeyList,
    dependencies=[Depends(read_access)],
    summary="The service's public signing keys (active and retired)",
)
def get_keys(request: Request) -> dict:
    keys = list_signing_keys(request.app.state.store)
    return {
        "keys": [
            {
                "key_id": k.key_id,
                "algorithm": "Ed25519",
                "public_key": k.public_key,
                "created_at": iso_utc(k.created_at),
                "retired_at": iso_utc(k.retired_at),
            }
            for k in keys
        ]
    }
