"""``GET /metrics``: the service's Prometheus metrics (docs/operations.md)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from ..auth import read_access

router = APIRouter(tags=["operations"])


@router.get(
    "/metrics",
    response_class=Response,
    dependencies=[Depends(read_access)],
    responses={
        200: {
            "content": {CONTENT_TYPE_LATEST.split(";")[0]: {}},
            "description": "The metrics in the Prometheus text format (version 0.0.4)",
        },
        401: {
            "description": "Missing or invalid API key (only with FLAUDIT_REQUIRE_KEY_FOR_READS=1)"
        },
    },
    summary="Prometheus metrics: audits by status and verdict, ingest, alarms, health",
)
async def metrics(request: Request) -> Response:
    """Counters and histograms of this instance (rounds ingested, ingest and transform
    seconds, gaps, canary budget overruns, alarms) and gauges read from the database at scrape
    time (audits by status and verdict, database up, workers running). No label names an audit
    or a canary. The list and suggested alerts: docs/operations.md."""
    body = await run_in_threadpool(request.app.state.metrics.exposition)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
