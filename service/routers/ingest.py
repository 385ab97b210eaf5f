"""Ingest routes used by the ServerApp's ``HttpRoundReporter`` (docs/architecture.md).

Bodies are raw little-endian float32 vectors (``Content-Type: application/octet-stream``); a
round's body may append its ``num_participants`` canary indices as little-endian int32.
Oversized bodies are refused from ``Content-Length`` before reading, and reading stops as soon
as a streamed body passes the limit. Every 2xx means the data is committed to the database.
"""

from __future__ import annotations

import functools
import re
import time
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from ...auditor.claims import audit_design
from ...auditor.spec import AuditClaim, AuditSpec, Engine
from ...protocol.wire import RUN_ID_HEADER
from ..auth import require_run_token
from ..external import round_canaries, size_to_federation
from ..live import IngestError
from ..schemas import (
    ClaimAck,
    FinalMetricsQuery,
    Heartbeat,
    HeartbeatAck,
    IngestAck,
    MissingRound,
    RoundMetadataQuery,
)
from ..silence import progress_at, silence_limit
from ..strict_json import StrictJSONRoute
from ..tables import utcnow
from .bodies import (
    UnusableBody,
    http_error,
    read_float32_body,
    read_round_body,
    read_vector,
)
from .deps import AuditId, RoundNumber

router = APIRouter(
    prefix="/audits",
    tags=["ingest"],
    dependencies=[Depends(require_run_token)],
    route_class=StrictJSONRoute,
)

_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/octet-stream": {
                "schema": {"type": "string", "format": "binary"},
            }
        },
        "description": (
            "Raw little-endian float32 vector of length d. Rounds: the released update ρ̄_t, "
            "followed by num_participants little-endian int32 canary indices when that query "
            "parameter is set."
        ),
    }
}
#: The ingest routes' error responses (OpenAPI ``responses``); the canary route shares them.
INGEST_ERRORS = {
    400: {"description": "Body not a whole number of float32 values, or truncated."},
    401: {"description": "Missing or invalid run token."},
    404: {"description": "No audit with this id."},
    409: {
        "description": (
            "Out of order, audit not running, initial model missing, or the audit belongs to "
            "another run (X-Flaudit-Run-Id), or a run is bound and the request has no "
            "X-Flaudit-Run-Id."
        )
    },
    413: {"description": "Body larger than 4*d bytes or the configured maximum."},
    415: {"description": "Content-Type is not application/octet-stream."},
    422: {"description": "Wrong length, NaN/Inf values, or invalid query metadata."},
}


_DECLARE_CLAIM_FIRST = "declare the claim first (PUT /audits/{id}/claim; CanaryAuditStrategy does)"


def _is_external(audit) -> bool:
    return audit.spec.get("engine") == Engine.external.value


_RUN_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


def _run_id(request: Request) -> str | None:
    """The run identity of the request (header ``X-Flaudit-Run-Id``), checked; None if absent."""
    value = request.headers.get(RUN_ID_HEADER)
    if value is None:
        return None
    if not _RUN_ID.match(value):
        raise http_error(422, f"{RUN_ID_HEADER}: 1 to 64 letters, digits, '_', '.', ':' or '-'")
    return value


def _other_run(audit, mine: str) -> str:
    started = audit.started_at.isoformat(timespec="seconds") if audit.started_at else "?"
    return (
        f"audit {audit.id} belongs to another run: run {audit.run_id} declared its claim at "
        f"{started} and reports to it; this run ({mine}) may not mix its rounds into it. Start "
        "a new audit for this run (`flaudit attach`, or POST /audits with engine 'external'), "
        "or, if this run continues that training after a crash, resume explicitly "
        "(CanaryAuditStrategy.from_env(..., resume=True) or FLAUDIT_RESUME=1)"
    )


def _no_run_id(audit) -> str:
    return (
        f"audit {audit.id} is bound to run {audit.run_id}: a request without the "
        f"{RUN_ID_HEADER} header cannot show it comes from that run, so it is refused (nothing "
        f"stored). Send {RUN_ID_HEADER} with every request of the run (CanaryAuditStrategy "
        "does), or start a new audit for this run"
    )


def _check_owner(request: Request, audit) -> None:
    """An external audit takes data only from the run that owns it (409 naming the audit):
    once a run is bound, a request of another run, or without the run id header, is refused."""
    mine = _run_id(request)
    if _is_external(audit) and audit.run_id is not None and mine != audit.run_id:
        raise http_error(409, _no_run_id(audit) if mine is None else _other_run(audit, mine))


def _bind_unowned(request: Request, audit):
    """An external audit whose claim came without a run id belongs to the first run that names
    itself (``X-Flaudit-Run-Id``) afterwards; from then on :func:`_check_owner` holds. Returns the
    audit as stored after the attempt (another run may have been first)."""
    mine = _run_id(request)
    if not (
        _is_external(audit)
        and audit.run_id is None
        and mine is not None
        and audit.started_at is not None
        and audit.status == "running"
    ):
        return audit
    store = request.app.state.store
    if store.resume_run(audit.id, run_id=mine, previous=None):
        request.app.state.read_cache.invalidate(audit.id)
    return store.get_audit(audit.id) or audit


async def precheck_ingest(request: Request, audit_id: str, *, need_dim: bool):
    """The audit a run may send data to (or fetch canaries of): 404 if none, 409 if an external
    audit has no claim yet, is another run's, or (``need_dim``) has no initial model yet."""
    audit = await run_in_threadpool(request.app.state.store.get_audit, audit_id)
    if audit is None:
        raise http_error(404, f"audit {audit_id!r} not found")
    if _is_external(audit) and audit.started_at is None and audit.status == "running":
        raise http_error(409, _DECLARE_CLAIM_FIRST)
    if audit.run_id is None and _run_id(request) is not None:
        audit = await run_in_threadpool(_bind_unowned, request, audit)
    _check_owner(request, audit)
    ownership = request.app.state.ownership
    if not (_is_external(audit) and audit.status == "running"):
        pass  # a worker's audit: its lease stays with the runner that started it
    elif audit.owner_id == ownership.instance_id:
        ownership.serve(audit)  # held here: no query
    elif await run_in_threadpool(ownership.serve, audit):
        # another replica (or none) held it (docs/deployment.md, "Replicas"): this one serves it
        # from the database and holds it now
        request.app.state.read_cache.invalidate(audit_id)
    if need_dim and audit.dim is None:
        raise http_error(409, "send the initial model first (PUT /audits/{id}/initial-model)")
    return audit


async def _ingest(request: Request, func, *args):
    audit_id = args[0]
    cache = request.app.state.read_cache
    store = request.app.state.store

    def work():
        try:
            return func(*args)
        finally:
            cache.refresh(store, audit_id)

    try:
        return await run_in_threadpool(work)
    except IngestError as exc:
        raise http_error(exc.status_code, exc.message) from None


@router.put(
    "/{audit_id}/initial-model",
    response_model=IngestAck,
    responses=INGEST_ERRORS,
    openapi_extra=_BODY,
    summary="Ingest θ_0 (sets the model dimension d)",
)
async def put_initial_model(audit_id: AuditId, request: Request) -> IngestAck:
    await precheck_ingest(request, audit_id, need_dim=False)
    settings = request.app.state.settings
    vector = await read_float32_body(request, limit=settings.max_body_bytes, what="initial model")
    result = await _ingest(request, request.app.state.live.ingest_initial, audit_id, vector)
    return IngestAck(audit_id=audit_id, stored=result == "stored", dim=int(vector.shape[0]))


@router.put(
    "/{audit_id}/rounds/{t}",
    response_model=IngestAck,
    responses=INGEST_ERRORS,
    openapi_extra=_BODY,
    summary="Ingest round t's released update ρ̄_t, its metadata and canary participants",
)
async def put_round(
    audit_id: AuditId,
    t: RoundNumber,
    metadata: Annotated[RoundMetadataQuery, Query()],
    request: Request,
) -> IngestAck:
    """Idempotent: the same t again is a no-op (200, `stored: false`). t must be the next
    round; later rounds get 409 before the body is read."""
    audit = await precheck_ingest(request, audit_id, need_dim=True)
    if t <= audit.rounds_stored:
        ack = await run_in_threadpool(request.app.state.live.round_ack, audit_id)
        return IngestAck(audit_id=audit_id, stored=False, round=t, dim=audit.dim, **ack)
    if audit.status != "running":
        raise http_error(409, f"audit is {audit.status}; ingest refused")
    if t != audit.rounds_stored + 1:
        raise http_error(
            409, f"round {t} is out of order: the next round must be {audit.rounds_stored + 1}"
        )
    gap = None
    canaries_missing = metadata.canaries_missing
    if canaries_missing is not None:
        if metadata.num_canaries_inserted != 0:
            raise http_error(
                422,
                "canaries_missing: a round trained without canaries must say "
                f"num_canaries_inserted=0, got {metadata.num_canaries_inserted}",
            )
        gap = {"round": t, "kind": "no_canaries", "reason": canaries_missing}
    if audit.spec.get("engine") in _SERVED_ENGINES and gap is None:
        await run_in_threadpool(_check_inserted, request, audit, t, metadata.num_canaries_inserted)
    try:
        vector, participants = await read_round_body(
            request,
            audit.dim,
            metadata.num_participants,
            int(audit.spec["num_canaries"]),
            f"round {t} update",
        )
    except UnusableBody as exc:
        await _end_refused(request, audit, t, exc)
        raise
    if gap is not None:  # no canary was in this round: it adds nothing to the known-rounds test
        participants = np.empty(0, dtype=np.int64)
    started = time.perf_counter()
    result = await _ingest(
        request,
        # the body's buffer is ours: the canary transform may run in it (no copy of d values)
        functools.partial(request.app.state.live.ingest_round, consume=True),
        audit_id,
        t,
        vector,
        metadata.model_dump(exclude={"num_participants", "canaries_missing"}),
        participants,
        gap,
    )
    request.app.state.metrics.round_stored(result, time.perf_counter() - started, gap, audit_id)
    ack = await run_in_threadpool(request.app.state.live.round_ack, audit_id)  # alarm, stop
    return IngestAck(audit_id=audit_id, stored=result == "stored", round=t, dim=audit.dim, **ack)


@router.put(
    "/{audit_id}/final-model",
    response_model=IngestAck,
    responses=INGEST_ERRORS,
    openapi_extra=_BODY,
    summary="Ingest the final model θ_T (ends the audit: succeeded)",
)
async def put_final_model(
    audit_id: AuditId,
    metrics: Annotated[FinalMetricsQuery, Query()],
    request: Request,
) -> IngestAck:
    audit = await precheck_ingest(request, audit_id, need_dim=True)
    if audit.has_final:
        return IngestAck(audit_id=audit_id, stored=False, dim=audit.dim)
    try:
        vector = await read_vector(request, audit.dim, "final model")
    except UnusableBody as exc:
        await _end_refused(request, audit, None, exc)
        raise
    values = {k: v for k, v in metrics.model_dump().items() if v is not None}
    result = await _ingest(request, request.app.state.live.ingest_final, audit_id, vector, values)
    return IngestAck(audit_id=audit_id, stored=result == "stored", dim=audit.dim)


async def _end_refused(request: Request, audit, t: int | None, exc: UnusableBody) -> None:
    """A running audit whose run sent an unusable round ``t`` (None: the final model) ends
    ``failed`` on the rounds it has, the reason naming what was refused and why; its rounds
    from ``t`` on are gaps. The training that diverged produces no usable round after it."""
    if audit.status != "running" or audit.has_final:
        return
    stored = int(audit.rounds_stored)
    what = f"round {t}" if t is not None else "the final model"
    reason = (
        f"{what} was refused ({exc.detail}), so the audit ended on the {stored} round(s) "
        "it has"
        + (
            f"; rounds {t}-{audit.spec.get('num_rounds')} and the final model were never received"
            if t is not None
            else "; the final-model statistic stands on the model after the last round received"
        )
        + (
            ". A model that is not finite usually means the training diverged (with DP "
            "noise: a learning rate or noise too large for the clip norm)"
            if "non-finite" in str(exc.detail)
            else ""
        )
    )
    store = request.app.state.store

    def work() -> bool:
        try:
            return store.end_refused(audit.id, t=t if t is not None else stored + 1, reason=reason)
        finally:
            request.app.state.read_cache.refresh(store, audit.id)

    if await run_in_threadpool(work):
        request.app.state.live.forget(audit.id)


#: Engines whose ServerApp inserts the canaries the service serves (it holds no seed).
_SERVED_ENGINES = (Engine.external.value, Engine.deployment.value)


def _check_inserted(request: Request, audit, t: int, inserted: int) -> None:
    """An external or deployment run must insert exactly the canaries the service served for
    round ``t``."""
    spec = AuditSpec.model_validate(audit.spec)
    seed = request.app.state.store.canary_seed(audit.id)
    if t > spec.num_rounds:
        raise http_error(409, f"round {t} exceeds num_rounds={spec.num_rounds} of the claim")
    served = int(round_canaries(seed, spec, t).size)
    del seed
    if inserted != served:
        raise http_error(
            422,
            f"num_canaries_inserted: round {t} must insert the {served} canaries served by "
            f"GET /audits/{{id}}/rounds/{t}/canary-sum (or .../canaries), got {inserted}",
        )


@router.put(
    "/{audit_id}/claim",
    response_model=ClaimAck,
    responses={
        401: INGEST_ERRORS[401],
        404: INGEST_ERRORS[404],
        409: {
            "description": (
                "Not an external audit, not running, a different claim stored, or the audit "
                "belongs to another run (resume=true to take it over with the same claim)."
            )
        },
        422: {"description": "A claim field is invalid, or the completed spec is inconsistent."},
    },
    summary="Declare the DP claim of an external run (its ServerApp does, once)",
)
def put_claim(
    audit_id: AuditId,
    claim: AuditClaim,
    request: Request,
    resume: Annotated[
        bool,
        Query(
            description=(
                "Continue the audit of the same training after its ServerApp crashed: the run sending "
                "this claim (X-Flaudit-Run-Id) takes the audit over and continues after its last "
                "stored round. The claim must be the one declared (num_rounds aside)."
            )
        ),
    ] = False,
) -> ClaimAck:
    """The settings of the run as its Flower strategy has them (noise multiplier, clipping,
    sampling, rounds). They complete the audit's spec, so the analytic epsilon and every alarm
    use them. The first run to declare its claim owns the audit (header X-Flaudit-Run-Id);
    another run is refused (409) unless it resumes explicitly. Idempotent: the same claim of
    the same run again is a no-op; a different one is refused (409)."""
    store = request.app.state.store
    mine = _run_id(request)
    audit = store.get_audit(audit_id)
    if audit is None:
        raise http_error(404, f"audit {audit_id!r} not found")
    if not _is_external(audit):
        raise http_error(
            409, "only an audit with engine 'external' takes a claim from its ServerApp"
        )
    # no claim declared yet: a refusal ends the audit
    first = audit.started_at is None and audit.status == "running"
    try:
        spec = claim.apply(AuditSpec.model_validate(audit.spec))
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False)
        if first:
            _refuse_federation(
                request, audit, "; ".join(e["msg"].removeprefix("Value error, ") for e in errors)
            )
        raise HTTPException(
            status_code=422,
            detail=[
                {"loc": ["body", *map(str, e["loc"])], "msg": e["msg"], "type": e["type"]}
                for e in errors
            ],
        ) from None
    except ValueError as exc:  # the claim asks for other canaries than the audit fixed
        if first:
            _refuse_federation(request, audit, str(exc))
        raise http_error(422, str(exc)) from None
    # The seen canaries take cohort slots: at most clients_per_round per round; "auto" chooses
    # the canaries here, from the federation. A resumed run keeps the stored spec (its
    # num_rounds may count only the rounds left), checked when the claim was first declared:
    # checking the plan over the rounds left would refuse a resume whenever more canaries are
    # seen than those rounds have slots.
    if not (resume and audit.started_at is not None):
        try:
            spec = size_to_federation(store.canary_seed(audit_id), spec)
        except ValueError as exc:
            if first:
                _refuse_federation(request, audit, str(exc))
            raise http_error(422, str(exc)) from None
    wanted = spec.model_dump(mode="json")
    if audit.started_at is not None and audit.spec == wanted:
        audit = _bind_unowned(request, audit)
    if audit.started_at is not None:
        if mine is None and audit.run_id is not None:
            raise http_error(409, _no_run_id(audit))
        if mine is None or audit.run_id is None or mine == audit.run_id:
            if audit.spec == wanted:
                return ClaimAck(
                    audit_id=audit_id,
                    stored=False,
                    spec=spec,
                    rounds_stored=audit.rounds_stored,
                    design=audit_design(spec).to_dict(),
                )
            raise http_error(409, "a different claim was declared for this audit already")
        if not resume:
            raise http_error(409, _other_run(audit, mine))
        return _resume(request, audit, mine, wanted)
    if audit.status != "running":
        raise http_error(409, f"audit is {audit.status}; claim refused")
    if not store.declare_claim(audit_id, spec=wanted, run_id=mine):
        raise http_error(409, "the claim was declared meanwhile, or the audit ended")
    request.app.state.read_cache.invalidate(audit_id)
    return ClaimAck(audit_id=audit_id, stored=True, spec=spec, design=audit_design(spec).to_dict())


def _refuse_federation(request: Request, audit, problem: str) -> None:
    """End ``audit`` (``failed``, the reason on the page and in the API) and raise 422: the
    first claim of its run asks what the federation cannot do, so it will never start."""
    reason = f"refused before round 1: {problem}"
    request.app.state.store.finish(audit.id, status="failed", reason=reason, only_if=("running",))
    request.app.state.read_cache.invalidate(audit.id)
    raise http_error(422, f"audit {audit.id} failed: {reason}")


def _resume(request: Request, audit, mine: str, wanted: dict) -> ClaimAck:
    """Hand ``audit`` to run ``mine`` (explicit resume): same claim, audit still running."""
    if audit.status != "running":
        raise http_error(
            409,
            f"audit {audit.id} is {audit.status} ({audit.reason or 'ended'}); it "
            "cannot be resumed: start a new audit for this run",
        )
    stored = {k: v for k, v in audit.spec.items() if k != "num_rounds"}
    if stored != {k: v for k, v in wanted.items() if k != "num_rounds"}:
        raise http_error(
            409,
            f"resume: the claim differs from the one declared for audit {audit.id}; "
            "a resumed run must keep the DP settings (noise, clipping, sampling)",
        )
    if not request.app.state.store.resume_run(audit.id, run_id=mine, previous=audit.run_id):
        raise http_error(409, "the audit changed owner or ended meanwhile; try again")
    request.app.state.read_cache.invalidate(audit.id)
    spec = AuditSpec.model_validate(audit.spec)
    return ClaimAck(
        audit_id=audit.id,
        stored=False,
        spec=spec,
        rounds_stored=audit.rounds_stored,
        resumed=True,
        design=audit_design(spec).to_dict(),
    )


@router.put(
    "/{audit_id}/heartbeat",
    response_model=HeartbeatAck,
    responses={
        401: INGEST_ERRORS[401],
        404: INGEST_ERRORS[404],
        409: {"description": "Audit not running, claim missing, or another run's."},
    },
    summary="The run is alive (sent while training is slow), and what it is doing",
)
async def put_heartbeat(
    audit_id: AuditId, request: Request, body: Heartbeat | None = None
) -> HeartbeatAck:
    """An external audit ends when its run shows no sign of progress (claim, any ingest, or a
    heartbeat) for its silence limit: 150 s, at most ``timeout_seconds`` (returned here). A
    heartbeat counts as of what its optional JSON body reports (``round``, ``phase``, and in
    seconds ``grid_age_seconds``: since the SuperLink last answered the ServerApp,
    ``progress_age_seconds``: since the run last moved, ``round_timeout_seconds``): as of the
    SuperLink's last answer, and no later than its round timeout plus 120 s after its last move
    minus the limit (service/silence.py); without a body, as of now. The wrapper sends one
    whenever it has been quiet for a quarter of the limit, at most every 30 s."""
    audit = await precheck_ingest(request, audit_id, need_dim=False)
    if audit.status != "running":
        raise http_error(409, f"audit is {audit.status}: {audit.reason or 'ended'}")
    limit = silence_limit(audit.spec)
    at = progress_at(
        utcnow(), body.model_dump() if body is not None else None, silence_seconds=limit.seconds
    )
    if not await run_in_threadpool(request.app.state.store.touch, audit_id, at=at):
        raise http_error(409, "the audit ended meanwhile")
    return HeartbeatAck(audit_id=audit_id, status="running", silence_limit_seconds=limit.seconds)


@router.put(
    "/{audit_id}/rounds/{t}/missing",
    response_model=IngestAck,
    responses={
        401: INGEST_ERRORS[401],
        404: INGEST_ERRORS[404],
        409: {"description": "Not the next round, audit not running, or another run's."},
        422: {"description": "No reason given."},
    },
    summary="Round t was trained but cannot be reported: record it as a gap",
)
async def put_missing_round(
    audit_id: AuditId,
    t: RoundNumber,
    body: MissingRound,
    request: Request,
) -> IngestAck:
    """The audit moves past round ``t`` without its update and lists it in ``gaps`` (kind
    ``not_reported``): the all-iterates and known-rounds statistics skip it; the final model
    still carries its canaries. Idempotent: a round already passed is a no-op."""
    audit = await precheck_ingest(request, audit_id, need_dim=True)
    if t <= audit.rounds_stored:
        return IngestAck(audit_id=audit_id, stored=False, round=t, dim=audit.dim)
    if audit.status != "running":
        raise http_error(409, f"audit is {audit.status}; ingest refused")
    if t != audit.rounds_stored + 1 or t > int(audit.spec.get("num_rounds", 0)):
        raise http_error(
            409,
            f"round {t} is out of order: the next round must be "
            f"{audit.rounds_stored + 1} (of {audit.spec.get('num_rounds')})",
        )

    def work() -> bool:
        try:
            return request.app.state.store.store_missing_round(audit_id, t=t, reason=body.reason)
        finally:
            request.app.state.read_cache.refresh(request.app.state.store, audit_id)

    if not await run_in_threadpool(work):
        raise http_error(409, f"round {t} was stored meanwhile or the audit ended")
    request.app.state.metrics.gap("not_reported", body.reason, audit_id=audit_id, round=t)
    return IngestAck(audit_id=audit_id, stored=True, round=t, dim=audit.dim)
