"""Security headers on every response (dashboard and API): a Content-Security-Policy without
inline scripts or styles (the dashboard in ``static/`` has none), no framing, no MIME sniffing,
no referrer leaks. The ``/docs`` and ``/redoc`` pages (:mod:`.docs_pages`) load their scripts from
the package's own files with an inline bootstrap, and the viewers style themselves inline: their
policy allows inline scripts and styles (and ReDoc's search worker from a ``blob:``) but, like the
dashboard's, nothing from another origin."""

from __future__ import annotations

__all__ = ["CONTENT_SECURITY_POLICY", "DOCS_CONTENT_SECURITY_POLICY", "SecurityHeaders"]

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
_HEADERS = [
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
]
#: For ``/docs`` and ``/redoc`` only: FastAPI's pages bootstrap the viewers inline.
DOCS_CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_DOCS_PAGES = ("/docs", "/redoc")


class SecurityHeaders:
    """ASGI middleware adding the security headers to every HTTP response."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = list(_HEADERS)
        policy = (
            DOCS_CONTENT_SECURITY_POLICY
            if scope.get("path", "") in _DOCS_PAGES
            else CONTENT_SECURITY_POLICY
        )
        extra.append((b"content-security-policy", policy.encode()))

        async def send_with_headers(message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                headers = list(message.get("headers", []))
                headers.extend((name, value) for name, value in extra if name not in present)
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
