"""The FastAPI application of the audit service: ``create_app(settings)``."""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..auditor import estimators as _estimators  # noqa: F401 - imported at start-up (see lifespan)
from ..auditor.canaries import new_master_seed
from ..auditor.spec import AuditSpec
from .docs_pages import add_docs_pages
from .evidence_store import active_signing_key, commit_seed
from .headers import SecurityHeaders
from .limits import RequestLimits
from .live import LiveAudits
from .metrics import ServiceMetrics
from .replicas import Ownership
from .routers import audits, canaries, evidence, health, ingest, metrics, record, webhooks
from .runner import Runner
from .settings import Settings
from .store import Store
from .tradeoff_view import audit_view_with_tradeoff
from .webhooks import WebhookDispatcher

__all__ = ["create_app", "ReadCache", "STATIC_DIR"]

log = logging.getLogger("flaudit.service")

#: Read only by the test suite's launcher (tests/seeded_service.py), never here: a service started
#: normally draws every canary seed from the OS and says, once, that it ignores the variable.
TEST_SEED_VARIABLE = "FLAUDIT_TEST_SEED"

STATIC_DIR = Path(__file__).resolve().parent / "static"

DESCRIPTION = """
Live empirical privacy auditing of DP-FedAvg on Flower with random canary clients
(Andrew et al. 2023). Submit an audit with `POST /audits` (API key), poll `GET /audits/{id}`.

Mutating routes need `Authorization: Bearer <API key>` (`FLAUDIT_API_KEY` or
`FLAUDIT_API_KEY_FILE`). The `ingest` routes are used by the audit's own Flower run with a
per-run token. Canary seeds are never returned; the seen/unseen split only once an audit ended.
"""


class ReadCache:
    """What reads of an audit serve from memory, dropped whenever the audit changes.

    * Serialized ``GET /audits/{id}`` bodies (at most ``max_items``).
    * The decoded per-canary arrays of ``GET /audits/{id}/cosines`` (:meth:`cosines`), so a page
      costs O(page) and not a decode of all k canaries: at most ``cosine_audits`` audits and
      ``cosine_bytes`` bytes, least recently read dropped first; an audit whose arrays alone
      exceed the budget is decoded per request and not kept.

    Every write of this process goes through :meth:`invalidate`; writes of another service
    instance on the same database are seen once a body is ``max_age`` seconds old, and by the
    cosines as soon as the audit's row shows them (their entry is keyed by its version).
    """

    def __init__(
        self,
        max_items: int = 256,
        *,
        max_age: float = 1.0,
        cosine_bytes: int = 128 << 20,
        cosine_audits: int = 4,
    ) -> None:
        if cosine_bytes < 0 or cosine_audits < 0:
            raise ValueError("cosine_bytes and cosine_audits must be >= 0")
        self._items: dict[str, tuple[float, bytes]] = {}
        self._deleted: set[str] = set()
        self._lock = threading.Lock()
        self._max = max_items
        self._max_age = max_age
        # audit id -> (version, decoded columns, bytes), least recently read first
        self._cosines: OrderedDict[str, tuple[Hashable, Any, int]] = OrderedDict()
        self._cosine_bytes_used = 0
        self._cosine_budget = cosine_bytes
        self._cosine_audits = cosine_audits
        self._cosine_loads: dict[str, threading.Lock] = {}

    def get(self, audit_id: str) -> bytes | None:
        item = self._items.get(audit_id)
        if item is None or time.monotonic() - item[0] > self._max_age:
            return None
        return item[1]

    def put(self, audit_id: str, view: dict) -> bytes:
        body = json.dumps(view, separators=(",", ":"), allow_nan=False).encode()
        with self._lock:
            if audit_id in self._deleted:  # a late refresh must not resurrect a deleted audit
                return body
            if len(self._items) >= self._max:
                self._items.pop(next(iter(self._items)))
            self._items[audit_id] = (time.monotonic(), body)
        return body

    def invalidate(self, audit_id: str, *, deleted: bool = False) -> None:
        with self._lock:
            self._items.pop(audit_id, None)
            self._drop_cosines(audit_id)
            if deleted:
                self._deleted.add(audit_id)

    def cosines(self, audit_id: str, version: Hashable, load: Callable[[], Any]) -> Any:
        """The decoded per-canary statistics of ``audit_id`` at ``version``
        (:func:`~flaudit.service.views.cosines_version`): kept ones if their version
        matches, else ``load()`` (an object with ``nbytes``), kept for the next request.

        Concurrent readers of one audit wait for a single ``load()`` (pollers after a new
        round decode the arrays once, not once each).
        """
        hit = self._cosines_hit(audit_id, version)
        if hit is not None:
            return hit
        with self._lock:
            gate = self._cosine_loads.setdefault(audit_id, threading.Lock())
        try:
            with gate:
                hit = self._cosines_hit(audit_id, version)
                if hit is not None:
                    return hit
                value = load()
                self._keep_cosines(audit_id, version, value)
                return value
        finally:
            with self._lock:
                if self._cosine_loads.get(audit_id) is gate:
                    del self._cosine_loads[audit_id]

    def _cosines_hit(self, audit_id: str, version: Hashable) -> Any | None:
        with self._lock:
            entry = self._cosines.get(audit_id)
            if entry is None or entry[0] != version:
                return None
            self._cosines.move_to_end(audit_id)
            return entry[1]

    def _keep_cosines(self, audit_id: str, version: Hashable, value: Any) -> None:
        size = int(value.nbytes)
        with self._lock:
            self._drop_cosines(audit_id)
            if audit_id in self._deleted or size > self._cosine_budget or not self._cosine_audits:
                return
            while self._cosines and (
                len(self._cosines) >= self._cosine_audits
                or self._cosine_bytes_used + size > self._cosine_budget
            ):
                self._drop_cosines(next(iter(self._cosines)))
            self._cosines[audit_id] = (version, value, size)
            self._cosine_bytes_used += size

    def _drop_cosines(self, audit_id: str) -> None:
        """(with the lock held)"""
        entry = self._cosines.pop(audit_id, None)
        if entry is not None:
            self._cosine_bytes_used -= entry[2]

    def refresh(self, store: Store, audit_id: str) -> None:
        """Rebuild the body right after a write, so pollers never queue on the database."""

        self.invalidate(audit_id)
        audit = store.get_audit(audit_id)
        if audit is not None:
            self.put(audit_id, audit_view_with_tradeoff(store, audit, cache=self))


def json_safe(value):
    """``value`` with what JSON cannot carry made printable: NaN/Infinity as strings, lone
    surrogates escaped (a validation error echoes the offending input back)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 body, rendered even when the input held NaN, Infinity or lone surrogates;
    each location names the field as sent (``POST /audits``'s spec kind tag left out)."""
    errors = [{**error, "loc": audits.untagged(error["loc"])} for error in exc.errors()]
    return JSONResponse(status_code=422, content={"detail": json_safe(jsonable_encoder(errors))})


def _submit_demo(store: Store, path: str) -> None:
    """``flaudit serve --demo``: submit the example audit if the database has no audit yet."""

    if store.count_audits() > 0:
        log.info("demo: audits exist already; not submitting %s", path)
        return
    spec = AuditSpec.model_validate_json(Path(path).read_text(encoding="utf-8"))
    seed = new_master_seed()
    audit = store.create_audit(name=spec.name, spec=spec.model_dump(mode="json"), canary_seed=seed)
    commit_seed(store, audit.id, seed)
    log.info("demo: submitted %s as audit %s", path, audit.id)


def create_app(settings: Settings | None = None, *, store: Store | None = None) -> FastAPI:
    """Build the service.

    Parameters
    ----------
    settings : Settings, optional
        Defaults to :meth:`Settings.from_env`.
    store : Store, optional
        Use this store instead of opening ``settings.database_url`` (tests).
    """
    settings = settings or Settings.from_env()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        own_store = store is None
        app.state.store = store or Store(settings.database_url, cipher=settings.seed_cipher())
        app.state.live = LiveAudits(
            app.state.store,
            canary_cache_bytes=settings.canary_cache_bytes,
            metrics=app.state.metrics,
        )
        app.state.ownership = Ownership(
            app.state.store,
            app.state.live,
            instance_id=settings.instance_id,
            lease_seconds=settings.lease_seconds,
            on_lost=app.state.read_cache.invalidate,
        )
        app.state.webhooks = WebhookDispatcher(
            app.state.store,
            backoff=settings.webhook_backoff_seconds,
            max_attempts=settings.webhook_max_attempts,
            timeout=settings.webhook_timeout_seconds,
            allow_private=settings.webhook_allow_private,
        )
        app.state.metrics.listeners[:] = [app.state.webhooks.notify]  # alarms, gaps
        app.state.webhooks.start()  # delivers from the database: pending rows survive restarts
        failed = app.state.store.fail_interrupted(
            lease_seconds=settings.lease_seconds, instance_id=settings.instance_id
        )
        if failed:
            log.warning(
                "marked %d audit(s) failed: their service instance stopped during the run",
                len(failed),
            )
        if os.environ.get(TEST_SEED_VARIABLE):  # the value is never logged
            log.warning(
                "%s is set and ignored: canary seeds are drawn from the OS (the variable "
                "is honoured only by the test suite's launcher)",
                TEST_SEED_VARIABLE,
            )
        if settings.demo_spec_path:
            _submit_demo(app.state.store, settings.demo_spec_path)
        active_signing_key(app.state.store)  # evidence bundles: made here, not by a GET
        # Move everything alive after start-up (the estimators are imported at module level,
        # not at the first round) out of the garbage collector's view: full collections over the
        # ~10^5 start-up objects otherwise stall the event loop for 100s of ms under ingest.
        gc.collect()
        gc.freeze()
        app.state.runner = None
        if settings.start_runner:
            app.state.runner = Runner(
                app.state.store,
                settings,
                on_change=lambda audit_id: app.state.read_cache.refresh(app.state.store, audit_id),
                ownership=app.state.ownership,
            )
            app.state.runner.start()
        try:
            yield
        finally:
            if app.state.runner is not None:
                app.state.runner.stop()
            app.state.webhooks.stop()
            if own_store:
                app.state.store.dispose()

    app = FastAPI(
        title="flaudit audit service",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # served from the package's files by add_docs_pages (no CDN)
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.read_cache = ReadCache()
    app.state.metrics = ServiceMetrics(app.state)  # GET /metrics: a registry per app
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_middleware(
        RequestLimits,
        max_json_body_bytes=settings.max_json_body_bytes,
        max_ingest_body_bytes=settings.max_body_bytes,
        body_timeout_seconds=settings.body_timeout_seconds,
    )
    app.add_middleware(SecurityHeaders)  # outermost: also on the limits' own 413/408 answers
    app.include_router(audits.router)
    app.include_router(ingest.router)
    app.include_router(record.router)
    app.include_router(canaries.router)
    app.include_router(health.router)
    app.include_router(evidence.router)
    app.include_router(metrics.router)
    app.include_router(webhooks.router)

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse(url="/ui/", status_code=307)

    add_docs_pages(app)
    app.mount("/ui", StaticFiles(directory=STATIC_DIR, html=True, check_dir=False), name="ui")
    _document_unparsable_bodies(app)
    return app


async def _http_error(request: Request, exc: StarletteHTTPException):
    """FastAPI's HTTP error responses, with a 405's ``Allow`` naming every method the path has
    (Starlette names only the first route that matched the path, e.g. GET but not DELETE)."""
    from fastapi.exception_handlers import http_exception_handler
    from starlette.routing import Match

    if exc.status_code == 405:
        methods: set[str] = set()
        for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"):
            probe = {
                "type": "http",
                "method": method,
                "path": request.scope["path"],
                "root_path": request.scope.get("root_path", ""),
                "headers": [],
            }
            if any(route.matches(probe)[0] is Match.FULL for route in request.app.router.routes):
                methods.add(method)
        if methods:
            exc = StarletteHTTPException(
                405, exc.detail, headers={"Allow": ", ".join(sorted(methods))}
            )
    return await http_exception_handler(request, exc)


def _document_unparsable_bodies(app: FastAPI) -> None:
    """Say in the OpenAPI responses what every route with a body answers before its own code
    runs: 400 to a JSON body it cannot parse (e.g. invalid UTF-8 inside a JSON string), and the
    request limits' 413 (body too large) and 408 (body too slow) of ``service/limits.py``."""
    default = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = default()
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    body = operation.get("requestBody", {}) if isinstance(operation, dict) else {}
                    responses = operation.get("responses", {}) if body else {}
                    if "application/json" in body.get("content", {}):
                        responses.setdefault(
                            "400",
                            {
                                "description": "The body could not be parsed (e.g. invalid UTF-8 "
                                "inside a JSON string).",
                            },
                        )
                        responses.setdefault(
                            "413",
                            {
                                "description": "Body larger than FLAUDIT_MAX_JSON_BODY_BYTES.",
                            },
                        )
                    if body:
                        responses.setdefault(
                            "408",
                            {
                                "description": "The body did not arrive within "
                                "FLAUDIT_BODY_TIMEOUT_SECONDS.",
                            },
                        )
                    if responses:
                        operation["responses"] = dict(sorted(responses.items()))
        return app.openapi_schema

    app.openapi = openapi
