"""Audit resources: submit, list, read, per-round history, per-canary cosines, cancel, delete."""

from __future__ import annotations

import importlib.util
import secrets
from typing import Annotated, Literal

from fastapi import APIRouter, Body, Depends, HTTPException, Query, Request, Response, status
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import Discriminator, Tag
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool

from ...auditor.canaries import new_master_seed
from ...auditor.claims import audit_design
from ...auditor.claims.alerts import design_warning
from ...auditor.record_spec import RecordServiceSpec, is_record_level
from ...auditor.spec import AuditSpec, Engine
from ..auth import read_access, require_api_key
from ..evidence_store import commit_seed
from ..external import attach_environment
from ..record import create_record_audit, is_record_audit
from ..record_views import record_summary, record_view
from ..schemas import (
    AuditCreated,
    AuditDesignOut,
    AuditList,
    AuditOut,
    AuditStatus,
    CosinesOut,
    RoundList,
    RunTokenOut,
)
from ..store import ACTIVE_STATUSES, ENDED_STATUSES, Store
from ..strict_json import StrictJSONRoute
from ..tradeoff_view import audit_view_with_tradeoff
from ..views import audit_summary_view, audit_view, cosines_csv, cosines_view, round_view
from .deps import AuditId, get_store

router = APIRouter(prefix="/audits", tags=["audits"], route_class=StrictJSONRoute)

#: Largest page of ``GET /audits/{id}/cosines`` in JSON (bounded response size and memory).
MAX_COSINES_PAGE = 10_000

_NOT_FOUND = {404: {"description": "No audit with this id."}}
_AUTH = {
    401: {"description": "Missing or invalid API key."},
    503: {"description": "No API key configured on the server."},
}


#: The tags of ``POST /audits``'s two spec kinds (pydantic puts them into an error's location).
SPEC_TAGS = ("user", "record")


def _spec_kind(data: object) -> str:
    return "record" if is_record_level(data) else "user"


def untagged(loc: tuple | list) -> tuple:
    """An error location without the spec kind's tag: ``("body", "user", "delta")`` is
    ``("body", "delta")``, the field as the client sent it (no field is named after a tag)."""
    loc = tuple(loc)
    if len(loc) > 2 and loc[0] == "body" and loc[1] in SPEC_TAGS:
        return (loc[0], *loc[2:])
    return loc


#: ``POST /audits`` takes a user-level spec or, with ``"level": "record"``, a record-level one.
SubmittedSpec = Annotated[
    Annotated[AuditSpec, Tag("user")] | Annotated[RecordServiceSpec, Tag("record")],
    Discriminator(_spec_kind),
    Body(),
]


def _get_or_404(store: Store, audit_id: str):
    audit = store.get_audit(audit_id)
    if audit is None:
        raise HTTPException(status_code=404, detail=f"audit {audit_id!r} not found")
    return audit


def _task_error(message: str) -> HTTPException:
    return HTTPException(
        status_code=422,
        detail=[{"loc": ["body", "task"], "msg": message, "type": "value_error"}],
    )


def _check_custom_task(task: str, *, allowed: bool) -> None:
    """Refuse a ``module.path:factory`` task unless allowed and its top-level package exists.

    Only the top-level package is looked up (``importlib.util.find_spec`` on it runs no code);
    the module itself is imported by the worker, never by the service process.
    """
    if not allowed:
        raise _task_error(
            f"custom task {task!r} refused: this service runs only the built-in "
            "tasks (synthetic, digits); set FLAUDIT_ALLOW_CUSTOM_TASKS=1 to allow "
            "'module.path:factory' tasks (they run code from the server's Python path)"
        )
    package = task.split(":", 1)[0].split(".", 1)[0]
    if importlib.util.find_spec(package) is None:
        raise _task_error(
            f"custom task {task!r}: no package {package!r} on the service's Python path"
        )


def check_allowed(spec: AuditSpec, settings) -> None:
    """Refuse (422 naming the field) what this service does not run: a custom task unless
    ``FLAUDIT_ALLOW_CUSTOM_TASKS=1``, ``inject_bug`` unless ``FLAUDIT_ALLOW_BUG_INJECTION=1``.
    ``POST /audits`` and ``POST /audits/design`` answer the same spec the same way."""
    if ":" in spec.task:
        _check_custom_task(spec.task, allowed=settings.allow_custom_tasks)
    if spec.inject_bug is not None and not settings.allow_bug_injection:
        raise HTTPException(
            status_code=422,
            detail=[
                {
                    "loc": ["body", "inject_bug"],
                    "msg": (
                        "inject_bug refused: a deliberate DP bug is a testing feature the operator "
                        "must allow with FLAUDIT_ALLOW_BUG_INJECTION=1"
                    ),
                    "type": "value_error",
                }
            ],
        )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=AuditCreated,
    dependencies=[Depends(require_api_key)],
    responses=_AUTH,
    summary="Submit an audit",
)
def create_audit(spec: SubmittedSpec, request: Request, response: Response) -> AuditCreated:
    """Validate and store the spec, draw the audit's secret canary seed, and queue the run.

    Returns 201 with the new audit's id and its design (what it can detect; the same as
    `POST /audits/design`); a spec that cannot test its own claim is accepted with a warning
    naming what would make it testable. Poll `GET /audits/{id}` for progress, estimates and
    the verdict.

    With `"engine": "external"` flaudit starts nothing: the audit waits for your own Flower
    ServerApp, and the response carries, once, the `environment` it needs (audit id, ingest
    URL, run token) for `CanaryAuditStrategy.from_env` (docs/flower.md). The app declares its
    DP claim (noise multiplier, clipping, sampling, rounds) itself.

    With `"level": "record"` (issue #37) the audit is of the DP-SGD inside your Flower app's
    clients: flaudit trains nothing; your ServerApp asks `POST /audits/{id}/record/plans` for
    each client's canary plan and reports each round to `PUT /audits/{id}/record/rounds/{t}`
    (`flaudit.server.record_http.RecordAuditClient`, docs/record-level.md).
    """
    store: Store = request.app.state.store
    if isinstance(spec, RecordServiceSpec):
        seed = new_master_seed()
        audit = create_record_audit(store, spec, seed)
        commitment = commit_seed(store, audit.id, seed)
        return JSONResponse(
            status_code=201,
            headers={"Location": f"/audits/{audit.id}"},
            content={
                "id": audit.id,
                "status": "running",
                "level": "record",
                "links": {
                    "self": f"/audits/{audit.id}",
                    "plans": f"/audits/{audit.id}/record/plans",
                    "rounds": f"/audits/{audit.id}/record/rounds/{{round}}",
                    "end": f"/audits/{audit.id}/record/end",
                },
                "seed_commitment": commitment,
            },
        )
    design = audit_design(spec)
    warning = design_warning(spec, design)
    shown = {
        "design": AuditDesignOut.model_validate(design.to_dict()),
        "warnings": [warning] if warning else [],
    }
    check_allowed(spec, request.app.state.settings)
    if spec.engine == Engine.external:
        # A run flaudit does not start: the user's ServerApp attaches with a run token; the
        # seed stays here (the app fetches each round's canary vectors instead).
        token, seed = secrets.token_urlsafe(32), new_master_seed()
        audit = store.create_audit(
            name=spec.name,
            spec=spec.model_dump(mode="json"),
            canary_seed=seed,
            run_token=token,
        )
        shown["seed_commitment"] = commit_seed(store, audit.id, seed)
        response.headers["Location"] = f"/audits/{audit.id}"
        return AuditCreated(
            id=audit.id,
            status="running",
            links={"self": f"/audits/{audit.id}"},
            **shown,
            environment=attach_environment(
                audit_id=audit.id,
                ingest_url=request.app.state.settings.public_url,
                run_token=token,
            ),
        )
    seed = new_master_seed()
    audit = store.create_audit(name=spec.name, spec=spec.model_dump(mode="json"), canary_seed=seed)
    shown["seed_commitment"] = commit_seed(store, audit.id, seed)
    runner = request.app.state.runner
    if runner is not None:
        runner.wake()
    response.headers["Location"] = f"/audits/{audit.id}"
    return AuditCreated(
        id=audit.id, status="queued", links={"self": f"/audits/{audit.id}"}, **shown
    )


@router.post(
    "/design",
    response_model=AuditDesignOut,
    summary="What an audit spec can detect, before running it (no key needed)",
)
def design_audit(spec: AuditSpec, request: Request) -> AuditDesignOut:
    """From the spec alone (canaries k, rounds T, schedule, claim): the smallest bug this audit
    catches in 95% of runs, the largest claim it can refute, whether it can test its own claim
    and, if not, what would make it testable. Pure computation: nothing is stored. A spec
    `POST /audits` would refuse (a custom task or `inject_bug` the operator has not allowed) is
    refused here too (422 naming the field)."""
    check_allowed(spec, request.app.state.settings)
    return AuditDesignOut.model_validate(audit_design(spec).to_dict())


@router.post(
    "/{audit_id}/run-token",
    response_model=RunTokenOut,
    dependencies=[Depends(require_api_key)],
    responses={
        **_NOT_FOUND,
        **_AUTH,
        409: {"description": "Not a running audit of engine 'external'."},
    },
    summary="Rotate the run token of an external audit (revokes the old one)",
)
def rotate_run_token(audit_id: AuditId, request: Request) -> RunTokenOut:
    """For a leaked run token: the old token stops working at once; the new one is returned
    only in this response (the service keeps its hash). Restart or reconfigure your ServerApp
    with the new environment; rounds already stored stay."""
    store: Store = request.app.state.store
    audit = _get_or_404(store, audit_id)
    if audit.spec.get("engine") != Engine.external.value or audit.status != "running":
        raise HTTPException(
            status_code=409,
            detail=(
                "only a running audit of engine 'external' has a run token you hold; "
                f"this one is {audit.status} with engine {audit.spec.get('engine')!r}"
            ),
        )
    token = secrets.token_urlsafe(32)
    if not store.rotate_run_token(audit_id, run_token=token):
        raise HTTPException(status_code=409, detail="the audit ended meanwhile")
    return RunTokenOut(
        id=audit_id,
        environment=attach_environment(
            audit_id=audit_id, ingest_url=request.app.state.settings.public_url, run_token=token
        ),
    )


@router.get(
    "",
    response_model=AuditList,
    dependencies=[Depends(read_access)],
    summary="List audits (newest first)",
)
def list_audits(
    store: Annotated[Store, Depends(get_store)],
    status: Annotated[
        AuditStatus | None, Query(description="Only audits with this status.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500, description="Page size.")] = 50,
    offset: Annotated[int, Query(ge=0, le=10_000_000, description="Items to skip.")] = 0,
) -> dict:
    """Paged list with each audit's status, progress and headline epsilon."""
    audits, total = store.list_audits(
        status=status.value if status else None, limit=limit, offset=offset
    )
    return {
        "items": [
            record_summary(store, a) if is_record_audit(a) else audit_summary_view(a)
            for a in audits
        ],
        "total": total,
    }


@router.get(
    "/{audit_id}",
    response_model=AuditOut,
    dependencies=[Depends(read_access)],
    responses=_NOT_FOUND,
    summary="Audit status, progress and every current estimate",
)
async def get_audit(audit_id: AuditId, request: Request) -> Response:
    """Status (with the reason when failed or cancelled), round t of T with ETA, every current
    estimate with its method metadata (including the analytic epsilon), diagnostics, alerts,
    histogram bins for plots and final-model metrics."""
    cache = request.app.state.read_cache
    body = cache.get(audit_id)  # served from memory on the event loop: pollers never queue
    if body is None:

        def load() -> bytes:
            store = request.app.state.store
            audit = _get_or_404(store, audit_id)
            if is_record_audit(audit):
                return cache.put(audit_id, record_view(store, audit))
            return cache.put(audit_id, audit_view_with_tradeoff(store, audit, cache=cache))

        body = await run_in_threadpool(load)
    return Response(content=body, media_type="application/json")


@router.get(
    "/{audit_id}/rounds",
    response_model=RoundList,
    dependencies=[Depends(read_access)],
    responses=_NOT_FOUND,
    summary="Per-round history of metadata and estimates",
)
def get_rounds(audit_id: AuditId, store: Annotated[Store, Depends(get_store)]) -> dict:
    audit = _get_or_404(store, audit_id)
    ended = audit.status in ENDED_STATUSES
    return {"items": [round_view(r, ended=ended) for r in store.list_rounds(audit_id)]}


@router.get(
    "/{audit_id}/cosines",
    response_model=CosinesOut,
    dependencies=[Depends(read_access)],
    responses={
        **_NOT_FOUND,
        200: {"content": {"text/csv": {}}, "description": "JSON, or CSV with format=csv."},
    },
    summary="Per-canary statistics (recompute every estimate from these)",
)
def get_cosines(
    audit_id: AuditId,
    request: Request,
    store: Annotated[Store, Depends(get_store)],
    format: Annotated[Literal["json", "csv"], Query(description="Response format.")] = "json",
    limit: Annotated[
        int, Query(ge=1, le=MAX_COSINES_PAGE, description="JSON page size (canaries per page).")
    ] = MAX_COSINES_PAGE,
    offset: Annotated[
        int, Query(ge=0, le=10_000_000, description="First canary index (JSON).")
    ] = 0,
):
    """Per canary j: max over rounds of cos(c_j, Δ_t), the latest round's cosine,
    cos(c_j, θ_T − θ_0) and cos(c_j, θ_T). The seen/unseen label is published only once the
    audit has ended; the canary seed never is. JSON comes in pages of at most
    10000 canaries (`limit`, `offset`; `total` is k); CSV streams every canary."""
    audit = _get_or_404(store, audit_id)
    cache = request.app.state.read_cache  # arrays decoded once per round, not once per page
    if format == "csv":
        return StreamingResponse(
            iterate_in_threadpool(cosines_csv(store, audit, cache=cache)),
            media_type="text/csv",
            headers={"Content-Disposition": f'attachment; filename="{audit_id}-cosines.csv"'},
        )
    return JSONResponse(cosines_view(store, audit, limit=limit, offset=offset, cache=cache))


@router.post(
    "/{audit_id}/cancel",
    response_model=AuditOut,
    dependencies=[Depends(require_api_key)],
    responses={**_NOT_FOUND, **_AUTH, 409: {"description": "The audit has already ended."}},
    summary="Cancel a queued or running audit",
)
def cancel_audit(audit_id: AuditId, request: Request) -> Response:
    """Stops the Flower run (kills the worker's process group, Ray included); the audit ends
    `cancelled`; rounds already stored stay readable."""
    store: Store = request.app.state.store
    audit = _get_or_404(store, audit_id)
    if audit.status not in ACTIVE_STATUSES:
        raise HTTPException(status_code=409, detail=f"audit already ended ({audit.status})")
    runner = request.app.state.runner
    if runner is not None:
        runner.cancel(audit_id)
    else:
        store.finish(
            audit_id, status="cancelled", reason="cancelled by the user", only_if=ACTIVE_STATUSES
        )
    request.app.state.read_cache.invalidate(audit_id)
    audit = _get_or_404(store, audit_id)
    return JSONResponse(audit_view(audit))


@router.delete(
    "/{audit_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    dependencies=[Depends(require_api_key)],
    responses={**_NOT_FOUND, **_AUTH},
    summary="Delete an audit and its stored data (cancels it first if it runs)",
)
def delete_audit(audit_id: AuditId, request: Request) -> Response:
    store: Store = request.app.state.store
    audit = _get_or_404(store, audit_id)
    runner = request.app.state.runner
    if audit.status in ACTIVE_STATUSES and runner is not None:
        runner.cancel(audit_id, reason="deleted by the user")
    store.delete_audit(audit_id)
    request.app.state.live.forget(audit_id)
    request.app.state.read_cache.invalidate(audit_id, deleted=True)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
