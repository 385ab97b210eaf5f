"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) from files installed with the package.

FastAPI's default pages load Swagger UI, ReDoc, a favicon and Google Fonts from CDNs, so they are
blank on a machine without internet access and put third-party code on a page that holds an API
key. Here the same pages (FastAPI's ``get_swagger_ui_html`` / ``get_redoc_html``) load the
vendored copies in ``static/vendor/`` (served under ``/ui/vendor/``; versions and licences in its
README), and :mod:`.headers` gives them a Content-Security-Policy that allows their inline
bootstrap but no other origin.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse

__all__ = ["VENDOR_URL", "add_docs_pages"]

#: Where ``static/vendor/`` is served (the dashboard's mount ``/ui``).
VENDOR_URL = "/ui/vendor"


def add_docs_pages(app: FastAPI) -> None:
    """Add ``GET /docs`` and ``GET /redoc`` (not in the schema) to an app made with
    ``docs_url=None, redoc_url=None``."""

    def urls(request: Request) -> tuple[str, str]:
        root = request.scope.get("root_path", "").rstrip("/")
        return root + (app.openapi_url or "/openapi.json"), root + VENDOR_URL

    @app.get("/docs", include_in_schema=False)
    def swagger_ui(request: Request) -> HTMLResponse:
        openapi_url, vendor = urls(request)
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{vendor}/swagger-ui-bundle.js",
            swagger_css_url=f"{vendor}/swagger-ui.css",
            swagger_favicon_url=f"{vendor}/swagger-ui-favicon-32x32.png",
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        openapi_url, vendor = urls(request)
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{vendor}/redoc.standalone.js",
            redoc_favicon_url=f"{vendor}/swagger-ui-favicon-32x32.png",
            with_google_fonts=False,
        )
