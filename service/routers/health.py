"""Liveness and readiness probes."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ..schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="Liveness: the process answers")
def healthz() -> dict:
    return {"status": "ok", "detail": {}}


@router.get(
    "/readyz",
    response_model=Health,
    responses={503: {"model": Health, "description": "Database unreachable or runner stopped."}},
    summary="Readiness: database reachable and runner alive",
)
def readyz(request: Request):
    detail: dict = {}
    ok = True
    try:
        request.app.state.store.ping()
        detail["database"] = "ok"
    except Exception as exc:  # report the kind of failure, not connection strings
        ok = False
        detail["database"] = f"unreachable ({type(exc).__name__})"
    runner = request.app.state.runner
    if runner is None:
        detail["runner"] = "disabled"
    else:
        alive = runner.alive
        detail["runner"] = "ok" if alive else "stopped"
        detail["running_audits"] = len(runner.active)
        ok = ok and alive
    body = {"status": "ok" if ok else "unavailable", "detail": detail}
    return JSONResponse(body, status_code=200 if ok else 503)
