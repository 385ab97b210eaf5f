"""The printable report (issue #30): GET /audits/{id}/report of an ended audit, saved to a file and
opened in headless chromium with the network off: the verdict sentence of the API is visible, the
pictures are drawn, and no request leaves the file. Also the dashboard's "Download report" link."""

from __future__ import annotations

import threading

import httpx
import pytest
import uvicorn

from flaudit.service.store import Store
from tests.processes import free_port, wait_for
from tests.service.conftest import CIPHER, make_client
from tests.service.gaussian_runs import BASE, fix_canary_seeds, gaussian_run

pytestmark = [pytest.mark.slow, pytest.mark.browser]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """A refuted and a consistent audit, ended; their API verdicts and report files."""
    path = tmp_path_factory.mktemp("report")
    store = Store(f"sqlite:///{path / 'flaudit.db'}", cipher=CIPHER)
    mp = pytest.MonkeyPatch()
    fix_canary_seeds(mp, 0x5EED_2026_1127_0F1A_0D17_C0DE_0001)
    out = {"store": store}
    try:
        with make_client(store) as client:
            for name, scale in (("refuted", 0.2), ("consistent", 1.0)):
                audit_id, _ = gaussian_run(client, store, BASE, noise_scale=scale)
                response = client.get(f"/audits/{audit_id}/report")
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/html")
                file = path / f"{name}.html"
                file.write_bytes(response.content)
                evidence = client.get(f"/audits/{audit_id}/evidence").json()
                out[name] = (client.get(f"/audits/{audit_id}").json(), file, evidence)
    finally:
        mp.undo()
    yield out
    store.dispose()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["refuted", "consistent"])
def test_the_report_opens_offline_with_the_apis_verdict(name, reports, browser, output_dir):
    audit, file, evidence = reports[name]
    context = browser.new_context(offline=True, viewport={"width": 1100, "height": 900})
    page = context.new_page()
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    try:
        page.goto(file.as_uri())
        verdict = page.locator("#verdict")
        assert verdict.is_visible()
        text = " ".join(verdict.inner_text().split())
        assert " ".join(audit["verdict"]["summary"].split()) in text
        assert audit["verdict"]["status"].replace("_", " ") in text.lower()
        for tile in ("#tile-claim", "#tile-measured", "#tile-design"):
            assert page.locator(tile).is_visible()
        # the pictures are drawn: the f-DP curves and the bounds over rounds
        assert page.locator("#fdp polyline").count() >= 3
        assert page.locator("#bounds polyline").count() >= 1
        evidence_text = page.locator("#evidence").inner_text()
        assert evidence["signature"]["digest"] in evidence_text
        assert evidence["signature"]["key_id"] in evidence_text
        page.emulate_media(media="print")
        assert page.locator("#verdict").is_visible()
        page.pdf(path=str(output_dir / f"report-{name}.pdf"))
    finally:
        context.close()
    assert requests == [file.as_uri()], requests  # the file itself, nothing else


@pytest.mark.timeout(120)
def test_the_dashboard_downloads_the_report_of_an_ended_audit(reports, browser, tmp_path):
    """The real app on the same store, served by uvicorn: the audit page's "Download report"
    link saves the report file, which carries the page's verdict sentence."""
    audit, _, _ = reports["refuted"]
    port = free_port()
    client = make_client(reports["store"])  # the app (no runner), as the service tests build it
    server = uvicorn.Server(
        uvicorn.Config(client.app, host="127.0.0.1", port=port, log_config=None)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    context = browser.new_context(accept_downloads=True)
    try:
        wait_for(
            lambda: (
                httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
                if server.started
                else False
            ),
            timeout=30,
            interval=0.2,
            what="uvicorn",
        )
        page = context.new_page()
        page.goto(f"http://127.0.0.1:{port}/ui/#/audits/{audit['id']}")
        link = page.locator("#download-report")
        link.wait_for(state="visible", timeout=20_000)
        assert link.inner_text() == "Download report"
        with page.expect_download() as info:
            link.click()
        saved = tmp_path / "downloaded.html"
        info.value.save_as(saved)
        text = saved.read_text(encoding="utf-8")
        assert info.value.suggested_filename == f"{audit['id']}-report.html"
        assert audit["verdict"]["summary"].split(":")[0] in text
        assert 'id="verdict"' in text
    finally:
        context.close()
        server.should_exit = True
        thread.join(timeout=10)
