"""Issue #40: ``/docs`` (Swagger UI) and ``/redoc`` render from the package's own files with every
request to another origin aborted, and their pages keep a Content-Security-Policy that names no
other origin."""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import expect

from flaudit.service.headers import DOCS_CONTENT_SECURITY_POLICY

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def _offline(tab, service) -> list[str]:
    """Abort every request that does not go to the service; return the list of aborted URLs."""
    home = urlsplit(service.url).netloc
    aborted: list[str] = []

    def route(r):
        if urlsplit(r.request.url).netloc == home:
            r.continue_()
        else:
            aborted.append(r.request.url)
            r.abort()

    tab.page.route("**/*", route)
    return aborted


def test_swagger_ui_renders_the_operations_offline(service, tab):
    aborted = _offline(tab, service)
    tab.page.goto(f"{service.url}/docs")
    operations = tab.page.locator(".opblock-summary-path")
    expect(operations.first).to_be_visible()
    paths = {text.replace("\u200b", "") for text in operations.all_inner_texts()}
    assert {"/audits", "/audits/design", "/audits/{audit_id}"} <= paths, paths
    assert aborted == []
    loaded = {urlsplit(u).path for _, u, status in tab.responses if status == 200}
    assert {
        "/ui/vendor/swagger-ui-bundle.js",
        "/ui/vendor/swagger-ui.css",
        "/openapi.json",
    } <= loaded
    assert not [e for e in tab.console_errors if "Content Security Policy" in e], tab.console_errors


def test_redoc_renders_the_operations_offline(service, tab):
    aborted = _offline(tab, service)
    tab.page.goto(f"{service.url}/redoc")
    expect(tab.page.get_by_role("heading", name="Submit an audit")).to_be_visible()
    assert aborted == []
    loaded = {urlsplit(u).path for _, u, status in tab.responses if status == 200}
    assert {"/ui/vendor/redoc.standalone.js", "/openapi.json"} <= loaded


def test_the_docs_pages_name_no_other_origin(service):
    for page in ("/docs", "/redoc"):
        response = httpx.get(service.url + page, timeout=10)
        assert response.status_code == 200
        assert response.headers["content-security-policy"] == DOCS_CONTENT_SECURITY_POLICY
        assert "http" not in response.text.replace(service.url, ""), response.text
    assert "http" not in DOCS_CONTENT_SECURITY_POLICY and "*" not in DOCS_CONTENT_SECURITY_POLICY
