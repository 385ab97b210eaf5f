"""Security headers on every response (dashboard and API): a Content-Security-Policy without
inline scripts or styles (the dashboard in ``static/`` has none), no framing, no MIME sniffing,
no referrer leaks. FastAPI's ``/docs`` and ``/redoc`` pages load their scripts from a CDN with an
inline bootstrap, so they get every header but the CSP."""

from __future__ import annotations

__all__ = ["SecurityHeaders", "CONTENT_SECURITY_POLICY"]

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
_NO_CSP = ("/docs", "/redoc")


class SecurityHeaders:
    """ASGI middleware adding the security headers to every HTTP response."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = list(_HEADERS)
        if not scope.get("path", "").startswith(_NO_CSP):
            extra.append((b"content-security-policy", CONTENT_SECURITY_POLICY.encode()))

        async def send_with_headers(message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                headers = list(message.get("headers", []))
                headers.extend((name, value) for name, value in extra if name not in present)
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
