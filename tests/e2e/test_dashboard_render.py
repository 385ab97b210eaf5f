"""How the audit page renders given API answers of the agreed JSON shape (docs/architecture.md,
docs/dashboard.md): the API routes are answered by Playwright from canned bodies, the page
itself is the real static dashboard. Covers what a short real run rarely produces: a lower
bound above the analytic epsilon, epsilon = inf, the merged-canaries histogram of a running
audit, a failure reason, and that polling stops once the audit has ended."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.slow, pytest.mark.browser]

DIM = 10_000


def _estimate(epsilon, estimator, threat_model, *, variance="n/a", correction="n/a", confidence=None, **details):
    return {
        "epsilon": "inf" if epsilon == math.inf else epsilon,
        "estimator": estimator,
        "threat_model": threat_model,
        "delta": 1e-6,
        "variance": variance,
        "correction": correction,
        "confidence": confidence,
        "method": f"{estimator} test row",
        "details": details,
    }


def _histogram(merged: bool) -> dict:
    rng = np.random.default_rng(0)
    edges = np.linspace(-0.04, 0.06, 31)
    seen = np.histogram(rng.normal(0.02, 0.01, 50), edges)[0]
    unseen = np.histogram(rng.normal(0.0, 0.01, 50), edges)[0]
    centres = (edges[1:] + edges[:-1]) / 2
    out = {
        "bin_edges": edges.tolist(),
        "null": (np.sqrt(DIM / (2 * np.pi)) * np.exp(-DIM * centres**2 / 2)).tolist(),
        "null_kind": "N(0, 1/d)",
    }
    if merged:
        out["canaries"] = (seen + unseen).tolist()
    else:
        out["seen"], out["unseen"] = seen.tolist(), unseen.tolist()
    return out


GUARANTEE = ("If the DP implementation satisfies its claims (1-Gaussian DP ...), an alarm (error "
             "or warning) fires with probability at most 5% over all 11 looks ...")


def _audit(status: str, *, round_: int, alerts=(), reason=None, guarantee=GUARANTEE,
           bug=None) -> dict:
    ended = status in ("succeeded", "failed", "cancelled")
    return {
        "id": "abc",
        "name": "rendered",
        "status": status,
        "reason": reason,
        "spec": {"name": "rendered", "task": "synthetic", "num_rounds": 10, "threat_models": ["final_model", "all_iterates"]},
        "created_at": "2026-01-01T00:00:00Z",
        "started_at": "2026-01-01T00:00:01Z",
        "finished_at": "2026-01-01T00:00:30Z" if ended else None,
        "progress": {"round": round_, "num_rounds": 10, "fraction": round_ / 10, "eta_seconds": None if ended else 12.0},
        "dim": DIM,
        "estimates": [
            _estimate(math.inf, "two_gaussian", "final_model", variance="fitted"),
            _estimate(1.5, "two_gaussian", "final_model", variance="null"),
            _estimate(4.2, "lower_bound", "final_model", correction="bonferroni", confidence=0.95),
            _estimate(7.0, "lower_bound", "all_iterates", correction="none", confidence=0.95),
            _estimate(0.3, "one_run", "final_model", correction="bonferroni", confidence=0.95),
            _estimate(3.0, "analytic", "poisson_subsampled", accountant="rdp"),
            _estimate(4.0, "analytic", "known_rounds", accountant="pld"),
        ],
        "diagnostics": [
            {"name": "anderson_darling_seen_final", "value": 2.1, "ok": False, "hint": "", "details": {}},
        ],
        "alerts": list(alerts),
        "alarm_guarantee": guarantee,
        "bug_injected": bug,
        "histograms": {"final_model": _histogram(not ended), "all_iterates": _histogram(not ended)},
        "metrics": {},
        "links": {"rounds": "/audits/abc/rounds", "cosines": "/audits/abc/cosines"},
    }


def _serve(tab, audit: dict, *, key: str | None = None, auth_log: list | None = None) -> list[str]:
    """Answer the API from ``audit``; returns the list of API paths requested. With ``key``,
    every route answers 401 unless the request carries ``Authorization: Bearer <key>``."""
    requested: list[str] = []

    def handle(route):
        path = route.request.url.split("://", 1)[1].split("/", 1)[1].split("?")[0]
        requested.append(path)
        authorization = route.request.headers.get("authorization")
        if auth_log is not None:
            auth_log.append((route.request.url, authorization))
        if key is not None and authorization != f"Bearer {key}":
            route.fulfill(status=401, content_type="application/json", body='{"detail": "missing or invalid API key"}')
            return
        if path == "audits/abc":
            body = audit
        elif path == "audits/abc/rounds":
            body = {"items": [{"round": t, "clip_norm": 1.0, "cohort_size": 10, "num_canaries_inserted": 1,
                               "num_failures": 0, "estimates": audit["estimates"]} for t in range(1, audit["progress"]["round"] + 1)]}
        else:
            route.fulfill(status=404, content_type="application/json", body='{"detail": "not found"}')
            return
        route.fulfill(status=200, content_type="application/json", body=json.dumps(body))

    tab.page.route("**/audits**", handle)
    return requested


@pytest.mark.timeout(60)
def test_running_audit_with_a_violating_bound(static_url, tab):
    requested = _serve(tab, _audit("running", round_=4))
    page = tab.page
    page.goto(static_url + "index.html#/audits/abc")
    expect(page.locator("#round-counter")).to_have_text("Round 4 of 10")
    expect(page.locator("#eta")).to_contain_text("12 s left")
    # No alert from the service: the page raises none of its own (the alarm is the service's
    # claim tests, with one guarantee over all looks), but highlights the valid bound above the
    # known-rounds epsilon (4.2 > 4.0; the uncorrected 7.0 is not a valid bound) in the table,
    # and states the alarm's guarantee.
    expect(page.locator("#alerts [role=alert]")).to_have_count(0)
    expect(page.locator("#alarm-guarantee")).to_contain_text("at most 5% over all 11 looks")
    expect(page.locator("#bug-injected")).to_have_count(0)
    expect(page.locator("#estimates-table tr.violation")).to_have_count(1)
    expect(page.locator("#estimates-table tr.violation")).to_have_attribute("data-estimator", "lower_bound")
    # inf is shown as such, never as a number
    assert "∞" in page.locator("#estimates-table td.eps-cell").all_inner_texts()
    # while running, seen and unseen are merged and the page says why
    legend = page.locator("section:has(#density-final_model) .legend")
    expect(legend).to_contain_text("labels hidden")
    expect(legend).not_to_contain_text("unseen")
    # the diagnostic without a service hint gets the page's plain-language one
    expect(page.locator("#diagnostics")).to_contain_text("trust ε_lo")
    # analytic entries with the same threat model family stay apart: two reference lines
    expect(page.locator("#eps-chart .ref-line")).to_have_count(2)
    # epsilon = inf (the fitted-variance series, off by default) is drawn as an off-chart arrow
    expect(page.locator("#eps-chart .off-chart")).to_have_count(0)
    page.locator('#eps-legend input[data-series-key="two_gaussian|final_model|fitted|n/a"]').check()
    assert page.locator("#eps-chart .off-chart").count() >= 1
    # the zoom to 2x the analytic epsilon is on by default
    expect(page.locator("#eps-zoom")).to_be_checked()
    # still polling
    n = sum(p == "audits/abc" for p in requested)
    page.wait_for_timeout(3500)
    assert sum(p == "audits/abc" for p in requested) >= n + 2
    assert tab.console_errors == []


@pytest.mark.timeout(60)
def test_failed_audit_shows_the_reason_and_stops_polling(static_url, tab):
    alert = {"level": "error", "message": "eps_lo 4.2 exceeds analytic 3.0"}
    requested = _serve(tab, _audit("failed", round_=4, alerts=[alert], reason="Ray worker died"))
    page = tab.page
    page.goto(static_url + "index.html#/audits/abc")
    expect(page.locator("#failure-reason")).to_contain_text("Ray worker died")
    expect(page.locator(".badge-slot .badge")).to_have_attribute("data-status", "failed")
    # the service's alert is shown once, not doubled by the page's own check
    expect(page.locator("#alerts .banner")).to_have_count(1)
    expect(page.locator("#alerts [role=alert]")).to_contain_text(alert["message"])
    expect(page.locator("#alerts")).to_contain_text(alert["message"])
    legend = page.locator("section:has(#density-all_iterates) .legend")
    expect(legend).to_contain_text("unseen canaries")
    expect(page.locator("#delete-audit")).to_be_visible()
    n = len(requested)
    page.wait_for_timeout(3500)
    assert len(requested) == n, "the page kept polling an ended audit"
    assert tab.console_errors == []


@pytest.mark.timeout(60)
def test_reads_that_need_the_key_ask_once_and_keep_it_out_of_urls(static_url, tab):
    key = "read-key-123"
    auth_log: list = []
    _serve(tab, _audit("succeeded", round_=10), key=key, auth_log=auth_log)
    page = tab.page
    page.goto(static_url + "index.html#/audits/abc")
    expect(page.locator("#key-dialog")).to_be_visible()
    expect(page.locator("#key-dialog")).to_contain_text(".flaudit/api-key")  # where the key is
    page.locator("#key-input").fill(key)
    page.keyboard.press("Enter")  # the dialog's form submits with Enter
    expect(page.locator("#round-counter")).to_have_text("Round 10 of 10")
    expect(page.locator("#key-button")).to_contain_text("✓")
    assert page.evaluate("sessionStorage.getItem('flaudit.apiKey')") == key
    rejected = [url for url, authorization in auth_log if authorization is None]
    assert len(rejected) == 1, rejected  # asked once; every later call carried the key
    assert all(authorization == f"Bearer {key}" for _, authorization in auth_log[1:])
    assert all(key not in url for url, _ in auth_log) and key not in page.url
    assert [e for e in tab.console_errors if "status of 401" not in e] == []


@pytest.mark.timeout(60)
def test_no_dp_claim_and_an_injected_bug_are_said_plainly(static_url, tab):
    no_claim = ("No DP claim: the audit's noise multiplier is 0, so there is no privacy claim to "
                "test and no DP alarm can fire.")
    _serve(tab, _audit("running", round_=2, alerts=[{"level": "info", "message": no_claim}],
                       guarantee=no_claim,
                       bug="bug injected: noise_scale=0.5 (testing only; the claim does not know "
                           "about it)"))
    page = tab.page
    page.goto(static_url + "index.html#/audits/abc")
    expect(page.locator("#bug-injected")).to_contain_text("bug injected: noise_scale=0.5")
    expect(page.locator("#alarm-guarantee")).to_contain_text("No DP claim.")
    expect(page.locator("#alarm-guarantee")).to_contain_text("no DP alarm can fire")
    assert tab.console_errors == []


@pytest.mark.timeout(60)
def test_an_estimate_above_the_claim_says_why_and_the_bootstrap_shows_an_interval(static_url, tab):
    """A point estimate (ε_est) above the tightest analytic ε on a correct run: the tile and the
    table say on screen that it is an estimate, not a bound, and no alarm is raised; the
    bootstrap diagnostic shows its interval, not a bare width that reads like an ε."""
    audit = _audit("succeeded", round_=10)
    audit["estimates"] = [
        _estimate(1.5, "two_gaussian", "final_model", variance="null"),
        _estimate(10.7, "two_gaussian", "all_iterates", variance="fitted"),
        _estimate(0.4, "lower_bound", "all_iterates", correction="bonferroni", confidence=0.95),
        _estimate(3.08, "analytic", "known_rounds", accountant="pld"),
    ]
    audit["diagnostics"] = [{
        "name": "bootstrap_all_iterates_epsilon", "value": 14.2, "ok": False,
        "hint": "", "details": {"lower": 1.2, "upper": 15.4, "confidence": 0.95},
    }]
    _serve(tab, audit)
    page = tab.page
    page.goto(static_url + "index.html#/audits/abc")
    tile = page.locator(".tile", has_text="ε_est, all iterates")
    expect(tile).to_contain_text("10.7")
    expect(tile).to_contain_text("not a bound and not a sign of a DP bug")
    final_tile = page.locator(".tile", has_text="ε_est, final model")
    expect(final_tile).not_to_contain_text("not a bound")  # 1.5 is below the claim
    row = page.locator("#estimates-table tr", has_text="10.7")
    expect(row.locator(".above-claim")).to_contain_text("above the analytic ε")
    expect(page.locator("#estimates-table .above-claim")).to_have_count(1)
    expect(page.locator("#alerts [role=alert]")).to_have_count(0)
    diagnostics = page.locator("#diagnostics")
    expect(diagnostics).to_contain_text("95% interval [1.20, 15.4]")
    expect(diagnostics).not_to_contain_text("value 14.2")
    assert tab.console_errors == []
