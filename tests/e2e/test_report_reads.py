"""What a reviewer reads (issue #40): the printable report and the refuted audit's page.

Three ended audits on the real app (ingested round by round through the REST routes, as
tests/e2e/test_report.py makes them): a refuted one (0.2x the claimed noise), a consistent one
and one with a deliberate bug injected (the testing notice). The report's visible text has no
API identifier (snake_case), no Python boolean and no JSON; the refuted page and the report show
first the picture the verdict rests on and name each picture's adversary; the audit list shows
the verdict, not the worker's exit status, and the valid lower bound, not an estimate.
Screenshots go to test-output/report-*.png and test-output/refuted-page.png."""

from __future__ import annotations

import re
import threading

import httpx
import pytest
import uvicorn
from playwright.sync_api import expect

from flaudit.service.store import Store
from flaudit.service.vocabulary import VOCABULARY
from tests.processes import free_port, wait_for
from tests.service.conftest import CIPHER, make_client
from tests.service.gaussian_runs import BASE, fix_canary_seeds, gaussian_run

pytestmark = [pytest.mark.slow, pytest.mark.browser]

#: name -> (spec changes, the noise the run really adds as a multiple of the claimed noise)
CASES = {
    "refuted": ({}, 0.2),
    "consistent": ({}, 1.0),
    "bug": ({"inject_bug": {"kind": "noise_scale", "factor": 0.2}}, 0.2),
}

SNAKE = re.compile(r"\b[a-z]+_[a-z_]+\b")
BOOLEAN = re.compile(r"\bTrue\b|\bFalse\b")
JSON = re.compile(r'[{]"|[\[][{"]')
THREAT_WORDS = ("final model", "every round", "rounds a canary joined")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The three audits, their API bodies and report files, and the app served by uvicorn."""
    path = tmp_path_factory.mktemp("report-reads")
    store = Store(f"sqlite:///{path / 'flaudit.db'}", cipher=CIPHER)
    mp = pytest.MonkeyPatch()
    fix_canary_seeds(mp, 0x5EED_2026_1206_0F1A_0D17_C0DE_0040)
    audits = {}
    try:
        with make_client(store, allow_bug_injection=True) as client:
            for name, (changes, scale) in CASES.items():
                spec = {**BASE, "name": f"{name} audit", **changes}
                audit_id, _ = gaussian_run(client, store, spec, noise_scale=scale)
                response = client.get(f"/audits/{audit_id}/report")
                assert response.status_code == 200, response.text
                file = path / f"{name}.html"
                file.write_bytes(response.content)
                audits[name] = (client.get(f"/audits/{audit_id}").json(), file)
    finally:
        mp.undo()
    port = free_port()
    app = make_client(store).app
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(
            lambda: server.started and httpx.get(f"{url}/healthz").status_code == 200,
            timeout=30,
            interval=0.2,
            what="uvicorn",
        )
        yield audits, url
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        store.dispose()


def identifiers(text: str) -> list[str]:
    return SNAKE.findall(text) + BOOLEAN.findall(text) + JSON.findall(text)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(CASES))
def test_the_report_reads_like_a_document(name, served, browser, output_dir):
    audits, _ = served
    audit, file = audits[name]
    if name == "consistent":
        assert audit["verdict"]["status"] == "consistent", audit["verdict"]
    else:
        assert audit["verdict"]["status"] == "claim_refuted", audit["verdict"]
    context = browser.new_context(offline=True, viewport={"width": 1100, "height": 1400})
    page = context.new_page()
    try:
        page.goto(file.as_uri())
        text = page.evaluate("document.body.innerText")
        assert identifiers(text) == [], identifiers(text)
        assert ("Testing: bug injected" in text) == (name == "bug")
        # the checks, each named (the page once showed "Another check · passes · p = 0.340")
        rows = page.locator("#checks tr").all()[1:]
        assert len(rows) == len(audit["diagnostics"]) >= 3
        for row, d in zip(rows, audit["diagnostics"]):
            cells = [c.inner_text() for c in row.locator("td").all()]
            assert cells[0] == VOCABULARY["diagnostics"][d["name"]]["name"], (cells, d["name"])
            assert cells[1] in ("passes", "needs attention", "not run") and cells[2] and cells[3]
        if name == "bug":
            assert "noise × 0.2" in page.locator("#bug-injected").inner_text()
        # every picture says which adversary it is about
        figures = page.locator("figure").all()
        assert len(figures) >= 2
        for figure in figures:
            caption = figure.locator("figcaption .adversary").first.inner_text()
            assert any(word in caption for word in THREAT_WORDS), caption
        # a legend entry keeps its line sample beside its words
        entries = page.locator(".legend .key").all()
        assert len(entries) >= 3
        for entry in entries:
            swatch = entry.locator(".swatch").bounding_box()
            words = entry.locator("span").bounding_box()
            box = entry.bounding_box()
            assert swatch["x"] + swatch["width"] <= words["x"] + 0.5, (swatch, words)
            assert box["y"] <= swatch["y"] and swatch["y"] + swatch["height"] <= box["y"] + 24
        if name != "consistent":
            first_picture_rests_the_verdict(page, audit)
        page.screenshot(path=str(output_dir / f"report-{name}.png"), full_page=True)
        page.locator(".charts").screenshot(path=str(output_dir / f"report-{name}-pictures.png"))
    finally:
        context.close()


def first_picture_rests_the_verdict(page, audit) -> None:
    """The first picture is the one of the test that refuted the claim, and says so."""
    by = audit["verdict"]["refuted_by"] or {}
    first = page.locator("figure").first
    assert first.get_attribute("data-threat-model") == by.get("threat_model"), by
    assert "verdict rests on" in first.inner_text()


@pytest.mark.timeout(120)
def test_the_refuted_page_leads_with_the_evidence_it_rests_on(served, browser, output_dir):
    audits, url = served
    audit, _ = audits["refuted"]
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(f"{url}/ui/#/audits/{audit['id']}")
        expect(page.locator("#verdict-summary")).to_have_text(audit["verdict"]["summary"])
        first = page.locator(".charts-row > section").first
        expect(first).to_have_attribute(
            "data-threat-model", audit["verdict"]["refuted_by"]["threat_model"]
        )
        expect(first).to_contain_text("The verdict rests on this")
        for section in page.locator(".charts-row > section").all():
            adversary = section.locator(".adversary").inner_text()
            assert any(word in adversary for word in THREAT_WORDS), adversary
        page.wait_for_timeout(500)
        page.screenshot(path=str(output_dir / "refuted-page.png"), full_page=True)
        page.set_viewport_size({"width": 390, "height": 844})
        page.wait_for_timeout(400)
        assert page.evaluate("document.documentElement.scrollWidth") <= 391
        page.screenshot(path=str(output_dir / "refuted-page-390.png"), full_page=True)
        page.set_viewport_size({"width": 1280, "height": 1000})

        # the list: the verdict instead of "succeeded", the valid bound instead of an estimate
        page.goto(f"{url}/ui/#/")
        for body, _ in audits.values():
            row = page.locator(f'tr[data-audit-id="{body["id"]}"]')
            expect(row.locator(".list-verdict")).to_be_visible()
            expect(row).not_to_contain_text("succeeded")
            bound = body["verdict"]["largest_valid_bound"]
            cell = row.locator("td.bound")
            if bound is None:
                expect(cell).to_have_text("–")
            else:
                expect(cell).to_contain_text("ε ≥")
        page.screenshot(path=str(output_dir / "report-reads-list.png"), full_page=False)
    finally:
        context.close()
    assert errors == []
