"""The dashboard in a real browser against the real service: start a small audit from the page,
watch it live, check the final numbers against the API, screenshot it at desktop and phone width.

Screenshots go to ``test-output/`` (gitignored)."""

from __future__ import annotations

import math
import re

import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.slow, pytest.mark.browser]

# Records what the audit page showed, every 100 ms, so the test can tell that the counter
# advanced and the chart got points *while* the audit was running (not only at the end).
RECORDER = """
window.__snapshots = [];
setInterval(() => {
  const counter = document.getElementById("round-counter");
  if (!counter) return;
  const chart = document.getElementById("bounds-chart");
  const badge = document.querySelector(".badge-slot .badge");
  const snap = {
    round: Number(counter.dataset.round),
    total: Number(counter.dataset.total),
    points: Number((chart && chart.dataset.points) || 0),
    status: (badge && badge.dataset.status) || "",
  };
  const last = window.__snapshots[window.__snapshots.length - 1];
  if (!last || last.round !== snap.round || last.points !== snap.points || last.status !== snap.status) {
    window.__snapshots.push(snap);
  }
}, 100);
"""

# Rounds of this audit take ~0.25 s each once Flower is up (~10-20 s), so 30 rounds keep it
# running long enough for the page (polling every 1.5 s) to show several intermediate rounds.
NUM_ROUNDS = 30
SMALL_AUDIT = {
    "f-name": "e2e dashboard",
    "f-num_rounds": str(NUM_ROUNDS),
    "f-num_clients": "20",
    "f-clients_per_round": "5",
    "f-num_canaries": "20",
}


def _shown_epsilon(text: str) -> float:
    token = text.strip().split()[0]
    return math.inf if token == "∞" else float(token)


def _api_epsilon(value) -> float:
    return math.inf if value == "inf" else float(value)


def _unexpected_errors(tab, allowed_statuses: set[int]) -> list[str]:
    """Console errors other than Chromium's "Failed to load resource" lines for responses the
    test provoked on purpose (the 401 that makes the page ask for the key, a 422)."""
    pattern = re.compile(r"Failed to load resource: the server responded with a status of (\d+)")
    out = []
    for message in tab.console_errors:
        match = pattern.search(message)
        if match and int(match.group(1)) in allowed_statuses:
            continue
        out.append(message)
    return out


def _enter_key(page, key: str) -> None:
    expect(page.locator("#key-dialog")).to_be_visible()
    page.locator("#key-input").fill(key)
    page.locator("#key-ok").click()


@pytest.mark.timeout(240)
def test_start_an_audit_from_the_page_and_watch_it_live(service, tab, output_dir):
    page = tab.page
    page.add_init_script(RECORDER)
    page.goto(service.url + "/")  # the service redirects / to the dashboard
    expect(page.locator("#audits-table")).to_be_visible()
    for field_id, value in SMALL_AUDIT.items():
        page.locator(f"#{field_id}").fill(value)
    page.locator("#start-audit").click()

    # The POST gets 401 without a key: the page asks once, keeps it in session storage, retries.
    _enter_key(page, service.api_key)
    page.wait_for_url(re.compile(r"#/audits/[^/]+$"))
    audit_id = page.url.split("#/audits/")[1]
    assert service.api_key not in page.url
    assert page.evaluate("sessionStorage.getItem('flaudit.apiKey')") == service.api_key
    assert page.evaluate("Object.keys(localStorage).length") == 0

    # Live: while running, the round counter advances (two different rounds > 0 shown) and the
    # bounds-over-rounds chart gets points; the verdict is provisional.
    page.wait_for_function(
        """() => new Set(window.__snapshots
                   .filter(s => s.status === 'running' && s.round > 0 && s.points > 0)
                   .map(s => s.round)).size >= 2""",
        timeout=150_000,
    )
    page.wait_for_selector(
        ".badge-slot .badge[data-status=succeeded], .badge-slot .badge[data-status=failed], "
        ".badge-slot .badge[data-status=cancelled]",
        timeout=180_000,
    )
    audit = service.client.get(f"/audits/{audit_id}").json()
    assert audit["status"] == "succeeded", (audit["reason"], service.log_tail())
    snapshots = page.evaluate("window.__snapshots")
    rounds_shown = [s["round"] for s in snapshots]
    assert rounds_shown == sorted(rounds_shown), "the round counter went backwards"
    assert any(s["round"] == 0 for s in snapshots), "never saw the audit before its first round"
    assert rounds_shown[-1] == audit["progress"]["num_rounds"] == NUM_ROUNDS
    expect(page.locator("#round-counter")).to_have_text(f"Round {NUM_ROUNDS} of {NUM_ROUNDS}")

    # The verdict is the API's sentence; the tiles and the f-DP picture are drawn.
    expect(page.locator("#verdict-summary")).to_be_visible()
    if audit.get("verdict"):
        expect(page.locator("#verdict-summary")).to_have_text(audit["verdict"]["summary"])
    assert "empirical" in page.locator("#fdp-chart").get_attribute("data-drawn").split(",")
    assert page.locator("#bounds-chart canvas").count() == 1

    # The details (collapsed) show every estimate the API returns, with the same numbers.
    expect(page.locator("#estimates-table")).not_to_be_visible()
    page.locator("#details > summary").click()
    rows = page.locator("#estimates-table tbody tr")
    expect(rows).to_have_count(len(audit["estimates"]))
    shown_estimators = set(rows.evaluate_all("rs => rs.map(r => r.dataset.estimator)"))
    assert {
        "two_gaussian",
        "lower_bound",
        "one_run",
        "analytic",
        "gdp_lower_bound",
    } <= shown_estimators
    shown = sorted(
        _shown_epsilon(t) for t in page.locator("#estimates-table td.eps-cell").all_inner_texts()
    )
    expected = sorted(_api_epsilon(e["epsilon"]) for e in audit["estimates"])
    assert len(shown) == len(expected)
    for got, want in zip(shown, expected):
        assert got == want or math.isclose(got, want, rel_tol=6e-3, abs_tol=1e-9), (shown, expected)
    for label in ("What it is", "Adversary", "Assumes", "In one line"):
        cells = page.locator(f'#estimates-table td[data-label="{label}"]').all_inner_texts()
        assert len(cells) == len(audit["estimates"]) and all(c.strip() for c in cells), label
    expect(page.locator("#diagnostics li")).to_have_count(len(audit["diagnostics"]))
    # Once ended, the score histograms show inserted and held-out canaries with the null.
    for tm in audit["spec"]["threat_models"]:
        chart = page.locator(f"#density-{tm}")
        expect(chart.locator("canvas")).to_have_count(1)
        assert {"seen", "unseen", "null"} <= set(chart.get_attribute("data-drawn").split(","))

    page.screenshot(path=str(output_dir / "dashboard-audit-1280.png"), full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_timeout(400)
    assert page.evaluate("document.documentElement.scrollWidth") <= 391, (
        "horizontal scroll at phone width"
    )
    page.screenshot(path=str(output_dir / "dashboard-audit-390.png"), full_page=True)

    page.goto(service.url + "/ui/#/")
    row = page.locator(f'#audits-table tr[data-audit-id="{audit_id}"]')
    # a succeeded audit shows its verdict, not the worker's exit status
    expect(row.locator(".list-verdict")).to_have_attribute(
        "data-verdict", audit["verdict"]["status"]
    )
    assert page.evaluate("document.documentElement.scrollWidth") <= 391
    page.screenshot(path=str(output_dir / "dashboard-list-390.png"), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 800})
    page.screenshot(path=str(output_dir / "dashboard-list-1280.png"), full_page=True)

    # The per-canary cosines download: one row per canary, labels published now it has ended.
    page.goto(service.url + f"/ui/#/audits/{audit_id}")
    # open the details once the audit has loaded (a click before the first render is lost)
    expect(page.locator("#verdict-summary")).to_have_text(audit["verdict"]["summary"])
    page.locator("#details > summary").click()
    expect(page.locator("#download-cosines")).to_be_visible()
    with page.expect_download() as download_info:
        page.locator("#download-cosines").click()
    lines = download_info.value.path().read_text().strip().splitlines()
    assert lines[0].split(",")[0] == "index" and "seen" in lines[0].split(",")
    assert len(lines) == 1 + audit["spec"]["num_canaries"]

    # A second mutating call reuses the stored key: no second prompt, no second 401.
    page.once("dialog", lambda dialog: dialog.accept())  # the confirm() before deleting
    page.locator("#delete-audit").click()
    page.wait_for_url(re.compile(r"#/$"))
    assert service.client.get(f"/audits/{audit_id}").status_code == 404
    assert [r for r in tab.responses if r[2] == 401] == [("POST", service.url + "/audits", 401)], (
        "the key should be asked for exactly once"
    )
    assert all(service.api_key not in url for _, url, _ in tab.responses)
    assert _unexpected_errors(tab, {401}) == []


@pytest.mark.timeout(60)
def test_a_bad_pasted_spec_is_refused_with_the_field_named(service, tab):
    page = tab.page
    before = service.client.get("/audits").json()["total"]
    page.goto(service.url + "/ui/#/new")
    page.locator("#json-details summary").click()

    page.locator("#spec-json").fill("{not json")
    page.locator("#start-audit").click()
    expect(page.locator("#form-error")).to_contain_text("not valid JSON")
    # nothing submitted (the design preview's POST /audits/design creates nothing)
    assert not any(method == "POST" and url.endswith("/audits") for method, url, _ in tab.responses)

    page.locator("#spec-json").fill('{"name": "bad", "num_rounds": 0}')
    page.locator("#start-audit").click()
    _enter_key(page, service.api_key)
    expect(page.locator("#form-error")).to_contain_text("num_rounds")
    expect(page.locator("#f-num_rounds")).to_have_attribute("aria-invalid", "true")
    assert page.url.endswith("#/new")
    assert service.client.get("/audits").json()["total"] == before
    assert _unexpected_errors(tab, {401, 422}) == []


@pytest.mark.timeout(60)
def test_the_form_previews_what_the_audit_can_detect(service, tab):
    page = tab.page
    before = service.client.get("/audits").json()["total"]
    page.goto(service.url + "/ui/#/new")
    expect(page.locator("#design-summary")).not_to_be_empty()
    with page.expect_response(lambda r: r.url.endswith("/audits/design")) as info:
        page.locator("#f-num_canaries").fill("6")
    design = info.value.json()
    assert info.value.status == 200
    expect(page.locator("#design-summary")).to_have_text(design["summary"])
    if design.get("advice"):
        expect(page.locator("#design-advice")).to_have_text(design["advice"])
    assert service.client.get("/audits").json()["total"] == before  # a preview stores nothing
    # the list and the form speak in words, not identifiers (every <details> open)
    from tests.e2e.test_verdicts import internal_identifiers, visible_text_with_details_open

    assert internal_identifiers(visible_text_with_details_open(page)) == []
    assert _unexpected_errors(tab, set()) == []
