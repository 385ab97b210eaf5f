"""Record-level audits fed by a Flower app (issue #37): canary plans, round reports, end.

Created with ``POST /audits`` and ``"level": "record"`` (:mod:`.audits`); read with
``GET /audits/{id}``. Every route here needs the API key: a plan is derived from the secret
seed. The seed and the seen/unseen split never appear in an answer.
"""

from __future__ import annotations

import json

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from ...protocol.record_wire import PLAN_DIMENSION_HEADER, PLAN_STEPS_HEADER, split_round
from ..auth import require_api_key
from ..record import RecordProblem, canary_plan, end_record_audit, report_round
from ..record_schemas import PlanRequest, RoundHead
from ..strict_json import StrictJSONRoute
from .deps import AuditId, RoundNumber

router = APIRouter(
    prefix="/audits/{audit_id}/record",
    tags=["record-level audits"],
    route_class=StrictJSONRoute,
    dependencies=[Depends(require_api_key)],
)

_ERRORS = {
    401: {"description": "Missing or invalid API key."},
    404: {"description": "No record-level audit with this id."},
    409: {"description": "The audit has ended, or the round was already reported."},
    422: {"description": "A field is invalid (the message names it)."},
}


def _invalidate(request: Request, audit_id: str) -> None:
    request.app.state.read_cache.invalidate(audit_id)


async def _call(func, *args, **kwargs):
    try:
        return await run_in_threadpool(func, *args, **kwargs)
    except RecordProblem as problem:
        raise HTTPException(status_code=problem.status_code, detail=problem.detail) from None


@router.post(
    "/plans",
    responses={
        **_ERRORS,
        200: {
            "content": {"application/octet-stream": {}},
            "description": "steps x d little-endian float32 (headers X-Flaudit-Plan-Steps, "
            "X-Flaudit-Plan-Dimension).",
        },
    },
    summary="A client's canary plan for a round (record-level audit)",
)
async def post_plan(audit_id: AuditId, body: PlanRequest, request: Request) -> Response:
    """Row `s` of the plan is the sum of the unit canary directions sampled at the client's
    DP-SGD step `s` of this round: `steps x d` float32, `steps` the client's previous reply's.
    The same request again answers the same plan. The client is numbered at its first
    appearance; one past the audit's `num_clients` is refused."""
    data = await _call(
        canary_plan,
        request.app.state.store,
        audit_id,
        client=body.client,
        round=body.round,
        dimension=body.dimension,
        dp=body.dp,
    )
    steps = len(data) // (4 * body.dimension)
    return Response(
        content=data,
        media_type="application/octet-stream",
        headers={PLAN_STEPS_HEADER: str(steps), PLAN_DIMENSION_HEADER: str(body.dimension)},
    )


@router.put(
    "/rounds/{round}",
    responses={
        **_ERRORS,
        400: {"description": "Truncated body or a head that is not JSON."},
        415: {"description": "Content-Type is not application/octet-stream."},
    },
    summary="Report a round's client updates and DP parameters (record-level audit)",
)
async def put_round(audit_id: AuditId, round: RoundNumber, request: Request) -> dict:
    """Body (protocol/record_wire.py): a 4-byte length, a JSON head (`dimension`, `dtype`
    "float32", `clients`: `[{client, dp}]`), then each client's update as `d` little-endian
    float32. Answers the look after the round (`alarm`, `claim_epsilon`, `p_value`, `cause`
    once the alarm fired). A round already stored answers its stored look."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/octet-stream":
        raise HTTPException(415, f"Content-Type must be application/octet-stream, got {media!r}")
    body = await request.body()
    try:
        raw, data = split_round(body)
    except ValueError as error:
        raise HTTPException(400, str(error)) from None
    try:
        parsed = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise HTTPException(400, f"the round's head is not JSON: {error}") from None
    try:
        head = RoundHead.model_validate(parsed)
    except ValidationError as error:
        detail = [
            {"loc": ["head", *e["loc"]], "msg": e["msg"], "type": e["type"]}
            for e in error.errors(include_url=False, include_input=False)
        ]
        raise HTTPException(422, detail) from None
    answer = await _call(report_round, request.app.state.store, audit_id, round, head, data)
    _invalidate(request, audit_id)
    return answer


@router.post("/end", responses=_ERRORS, summary="End a record-level audit: the verdict")
async def post_end(audit_id: AuditId, request: Request) -> dict:
    """The final look, the claim over the run (client by client), the verdict and its cause;
    the audit ends `succeeded`. Ended already: the same verdict."""
    answer = await _call(end_record_audit, request.app.state.store, audit_id)
    _invalidate(request, audit_id)
    return answer
