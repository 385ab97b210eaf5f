"""Canary routes: what a ServerApp inserts in round ``t``, served from the secret seed that stays
in the service (docs/architecture.md). Raw little-endian float32 bodies, with headers
``X-Canary-Count`` and ``X-Canary-Dim``.

``GET .../canaries`` (the unit vectors) serves external runs; ``GET .../canary-sum`` (their sum,
``4 d`` bytes whatever their number) serves external runs and the built-in ServerApp of a
deployment audit (issue #29), each by its engine's rule
(:func:`flaudit.auditor.schedules.audit_canary_plan`).
"""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Depends, Request, Response
from starlette.concurrency import run_in_threadpool

from ...auditor.spec import AuditSpec, Engine
from ..auth import require_run_token
from ..external import round_canary_sum, round_canary_vectors
from .bodies import http_error
from .deps import AuditId, RoundNumber
from .ingest import INGEST_ERRORS, precheck_ingest

router = APIRouter(prefix="/audits", tags=["ingest"], dependencies=[Depends(require_run_token)])


@router.get(
    "/{audit_id}/rounds/{t}/canaries",
    responses={
        200: {
            "content": {"application/octet-stream": {}},
            "description": (
                "Raw little-endian float32 of shape (c, d): the unit vectors of the seen "
                "canaries to insert in round t (headers X-Canary-Count, X-Canary-Dim)."
            ),
        },
        401: INGEST_ERRORS[401],
        404: INGEST_ERRORS[404],
        409: {"description": "No claim or initial model yet, not external, or not running."},
        422: {"description": "t outside 1..num_rounds."},
    },
    summary="The canary vectors an external run inserts in round t",
)
async def get_round_canaries(
    audit_id: AuditId,
    t: RoundNumber,
    request: Request,
) -> Response:
    """What the ServerApp's wrapper adds to round t, scaled to that round's clip norm: the
    service schedules the canaries (same rule as built-in audits) and keeps the seed."""

    def vectors(seed: int, spec: AuditSpec, dim: int) -> tuple[np.ndarray, int]:
        block = round_canary_vectors(seed, spec, t, dim)
        return block, int(block.shape[0])

    return await _serve_canaries(request, audit_id, t, vectors)


@router.get(
    "/{audit_id}/rounds/{t}/canary-sum",
    responses={
        200: {
            "content": {"application/octet-stream": {}},
            "description": (
                "Raw little-endian float32 of shape (d,): the sum of the c unit canaries to "
                "insert in round t (headers X-Canary-Count = c, X-Canary-Dim = d). The wrapper "
                "inserts c replies of clip_norm * sum / c each: 4 d bytes whatever c."
            ),
        },
        401: INGEST_ERRORS[401],
        404: INGEST_ERRORS[404],
        409: {"description": "No claim or initial model yet, another engine, or not running."},
        422: {"description": "t outside 1..num_rounds."},
    },
    summary="The sum of the canaries an external or deployment run inserts in round t",
)
async def get_round_canary_sum(
    audit_id: AuditId,
    t: RoundNumber,
    request: Request,
) -> Response:
    """Like ``GET .../canaries`` but one vector: the canaries' sum (docs/estimators.md, "Canary
    replies from the round's sum", says which mechanisms this is exact for). Served to the
    built-in ServerApp of a deployment audit too (issue #29: the seed stays here), by its rule
    (:func:`flaudit.auditor.schedules.audit_canary_plan`)."""

    def total(seed: int, spec: AuditSpec, dim: int) -> tuple[np.ndarray, int]:
        return round_canary_sum(seed, spec, t, dim)

    return await _serve_canaries(
        request, audit_id, t, total, engines=(Engine.external.value, Engine.deployment.value)
    )


async def _serve_canaries(
    request: Request,
    audit_id: str,
    t: int,
    make,
    *,
    engines: tuple[str, ...] = (Engine.external.value,),
) -> Response:
    """Round ``t``'s canaries of a running audit of ``engines`` as raw little-endian float32,
    made by ``make(seed, spec, d) -> (array, c)`` off the event loop; the seed stays here."""
    audit = await precheck_ingest(request, audit_id, need_dim=True)
    if audit.spec.get("engine") not in engines:
        raise http_error(
            409,
            "canaries are served only to audits with engine "
            + " or ".join(f"'{e}'" for e in engines),
        )
    if audit.status != "running":
        raise http_error(409, f"audit is {audit.status}; no canaries served")
    spec = AuditSpec.model_validate(audit.spec)
    if t > spec.num_rounds:
        raise http_error(422, f"t: round {t} exceeds num_rounds={spec.num_rounds} of the claim")
    array, count = await run_in_threadpool(
        lambda: make(request.app.state.store.canary_seed(audit_id), spec, audit.dim)
    )
    return Response(
        content=np.ascontiguousarray(array, dtype="<f4").tobytes(),
        media_type="application/octet-stream",
        headers={"X-Canary-Count": str(count), "X-Canary-Dim": str(audit.dim)},
    )
