"""Authentication dependencies.

* API keys (``Authorization: Bearer <key>``) guard the mutating routes (``POST /audits``,
  ``POST /audits/{id}/cancel``, ``DELETE /audits/{id}``) and, when the setting
  ``require_key_for_reads`` is on, the read routes too.
* Per-audit run tokens guard the ingest routes. A run token is issued to one run only when its
  worker starts, or, for ``engine = "external"``, once in the ``POST /audits`` response (rotated
  with ``POST /audits/{id}/run-token``); the database keeps only its SHA-256 hash.
"""

from __future__ import annotations

import hmac

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from .routers.deps import AuditId
from .store import hash_token

__all__ = ["require_api_key", "read_access", "require_run_token"]

_bearer = HTTPBearer(auto_error=False, description="API key, or the run token on ingest routes")

NO_KEY_CONFIGURED = (
    "no API key is configured on the server: set FLAUDIT_API_KEY=<key> or "
    "FLAUDIT_API_KEY_FILE=<file with one key per line> and restart flaudit serve"
)


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(
        status_code=status.HTTP_401_UNAUTHORIZED,
        detail=message,
        headers={"WWW-Authenticate": "Bearer"},
    )


def _check_key(request: Request, credentials: HTTPAuthorizationCredentials | None) -> None:
    keys: tuple[str, ...] = request.app.state.settings.api_keys
    if not keys:
        raise HTTPException(
            status_code=status.HTTP_503_SERVICE_UNAVAILABLE, detail=NO_KEY_CONFIGURED
        )
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise _unauthorized("missing API key: send 'Authorization: Bearer <API key>'")
    supplied = credentials.credentials.encode("utf-8")
    ok = False
    for key in keys:  # compare against all keys in constant time each
        ok |= hmac.compare_digest(supplied, key.encode("utf-8"))
    if not ok:
        raise _unauthorized("invalid API key")


def require_api_key(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)
) -> None:
    """Dependency for mutating routes."""
    _check_key(request, credentials)


async def read_access(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)
) -> None:
    """Dependency for read routes: open unless ``require_key_for_reads`` is set."""
    if request.app.state.settings.require_key_for_reads:
        _check_key(request, credentials)


def require_run_token(
    audit_id: AuditId,
    request: Request,
    credentials: HTTPAuthorizationCredentials | None = Depends(_bearer),
) -> None:
    """Dependency for ingest routes: the Bearer token must be this audit's run token."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise _unauthorized("missing run token: send 'Authorization: Bearer <run token>'")
    store = request.app.state.store
    expected = store.run_token_hash(audit_id)
    if expected is None:
        if store.get_audit(audit_id) is None:
            raise HTTPException(status_code=404, detail=f"audit {audit_id!r} not found")
        raise _unauthorized(
            f"no run token is valid for audit {audit_id} (it is not running): a run that "
            "ended keeps its audit; train again against a new audit (`flaudit attach`, or "
            "POST /audits with engine 'external')"
        )
    if not hmac.compare_digest(hash_token(credentials.credentials), expected):
        raise _unauthorized("invalid run token for this audit")
