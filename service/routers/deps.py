"""Shared route dependencies: the store, the live ingest state, the runner, the read cache."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Request

from ..live import LiveAudits
from ..runner import Runner
from ..store import Store

AuditId = Annotated[
    str,
    Path(
        pattern=r"^[A-Za-z0-9_-]{1,32}$",
        description="Audit id returned by POST /audits.",
        examples=["q3Zr1d0xT4mA"],
    ),
]

#: A round of an audit in a route's path: 1-based, at most 100 000.
RoundNumber = Annotated[int, Path(ge=1, le=100_000, description="Round number, 1-based.")]


def get_store(request: Request) -> Store:
    return request.app.state.store


def get_live(request: Request) -> LiveAudits:
    return request.app.state.live


def get_runner(request: Request) -> Runner | None:
    return request.app.state.runner
