"""How the audit page renders given API answers of the agreed JSON shape (CONTRACT's verdict,
docs/api.md): the API routes are answered by Playwright from canned bodies, the page itself is the
real static dashboard. Covers what the real four-verdict test (test_verdicts.py) does not: a
running audit (provisional verdict, the picture without the measured curve while labels are
secret, merged histograms), a failure reason, polling that stops once the audit has ended, reads
that need the key, and an old service without a verdict."""

from __future__ import annotations

import json
import math
import re
import time

import numpy as np
import pytest
from playwright.sync_api import expect

from flaudit.service.app import STATIC_DIR

pytestmark = [pytest.mark.slow, pytest.mark.browser]

DIM = 10_000


def _estimate(
    epsilon,
    estimator,
    threat_model,
    *,
    variance="n/a",
    correction="n/a",
    confidence=None,
    **details,
):
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


GUARANTEE = (
    "If the DP implementation satisfies its claims (1-Gaussian DP ...), an alarm (error "
    "or warning) fires with probability at most 5% over all 11 looks ..."
)


#: GET /audits/{id}'s progress.waiting_for of a run stalled before round 5 (service/views.py)
WAITING = (
    "waiting for round 5's updates (62 s so far; rounds 1-4 came 0.1 s apart: this one is slower)"
)
RUNNING = "Running: no evidence against the claim ε = 4.0 at δ = 1e-6 after round 4 of 10."
DESIGN = {
    "summary": "catches noise × 0.8 or smaller (ε ≥ 5.1 at δ = 1e-6) in 95% of runs",
    "advice": None,
    "testable": True,
    "claim_mu": 1.0,
    "claim_epsilon": 4.0,
    "delta": 1e-6,
}


def _verdict(status="running", summary=RUNNING, bound_eps=4.2, bound_mu=1.1):
    bound = (
        None
        if bound_eps is None
        else {
            "estimator": "normal_scores",
            "name": "Normal-score bound on μ",
            "threat_model": "known_rounds",
            "mu": bound_mu,
            "epsilon": bound_eps,
            "delta": 1e-6,
            "confidence": 0.95,
        }
    )
    return {
        "status": status,
        "summary": summary,
        "claim": {"mu": 1.0, "epsilon": 4.0, "delta": 1e-6, "description": "one round"},
        "refuted_by": None,
        "design": DESIGN,
        "largest_valid_bound": bound,
        "tier": None,
        "round": 4,
        "gaps": None,
    }


def _tradeoff(ended: bool) -> dict:
    from flaudit.auditor.claims.tradeoff import tradeoff_picture

    seen = np.random.default_rng(3).normal(0.8, 1, 50) if ended else None
    return tradeoff_picture(seen, claim_mu=1.0, mu_lo=0.4)


def _audit(
    status: str, *, round_: int, alerts=(), reason=None, guarantee=GUARANTEE, bug=None, verdict=None
) -> dict:
    ended = status in ("succeeded", "failed", "cancelled")
    return {
        "id": "abc",
        "name": "rendered",
        "status": status,
        "reason": reason,
        "spec": {
            "name": "rendered",
            "task": "synthetic",
            "num_rounds": 10,
            "threat_models": ["final_model", "all_iterates"],
        },
        "created_at": "2026-01-01T00:00:00Z",
        "started_at": "2026-01-01T00:00:01Z",
        "finished_at": "2026-01-01T00:00:30Z" if ended else None,
        "progress": {
            "round": round_,
            "num_rounds": 10,
            "fraction": round_ / 10,
            "eta_seconds": None if ended else 12.0,
            "waiting_for": None if ended else WAITING,
        },
        "dim": DIM,
        "estimates": [
            _estimate(math.inf, "two_gaussian", "final_model", variance="fitted"),
            _estimate(1.5, "two_gaussian", "final_model", variance="null"),
            _estimate(
                4.2, "normal_scores", "known_rounds", correction="n/a", confidence=0.95, mu=1.1
            ),
            _estimate(4.2, "lower_bound", "final_model", correction="bonferroni", confidence=0.95),
            _estimate(7.0, "lower_bound", "all_iterates", correction="none", confidence=0.95),
            _estimate(0.3, "one_run", "final_model", correction="bonferroni", confidence=0.95),
            _estimate(3.0, "analytic", "poisson_subsampled", accountant="rdp"),
            _estimate(4.0, "analytic", "known_rounds", accountant="pld"),
        ],
        "diagnostics": [
            {
                "name": "anderson_darling_seen_final",
                "value": 2.1,
                "ok": False,
                "hint": "",
                "details": {},
            },
            {
                "name": "unseen_known_rounds_vs_null",
                "value": 0.34,
                "ok": True,
                "hint": "",
                "details": {"p_value": 0.34},
            },
        ],
        "alerts": list(alerts),
        "alarm_guarantee": guarantee,
        "bug_injected": bug,
        "histograms": {"final_model": _histogram(not ended), "all_iterates": _histogram(not ended)},
        "verdict": _verdict() if verdict is None else verdict,
        "tradeoff": _tradeoff(ended),
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
            route.fulfill(
                status=401,
                content_type="application/json",
                body='{"detail": "missing or invalid API key"}',
            )
            return
        if path == "audits/abc":
            body = audit
        elif path == "audits/abc/rounds":
            body = {
                "items": [
                    {
                        "round": t,
                        "clip_norm": 1.0,
                        "cohort_size": 10,
                        "num_canaries_inserted": 1,
                        "num_failures": 0,
                        "estimates": audit["estimates"],
                    }
                    for t in range(1, audit["progress"]["round"] + 1)
                ]
            }
        elif path == "audits/abc/webhook-deliveries":
            body = {"items": []}  # no alert webhooks subscribed
        else:
            route.fulfill(
                status=404, content_type="application/json", body='{"detail": "not found"}'
            )
            return
        route.fulfill(status=200, content_type="application/json", body=json.dumps(body))

    tab.page.route("**/audits**", handle)
    return requested


#: The audit page's poll interval (service/static/audit.js)
POLL_MS = int(re.search(r"const POLL_MS = (\d+);", (STATIC_DIR / "audit.js").read_text())[1])
#: Counts the page's requests for audit abc when they start (a poll the page's timers fire
#: inside ``clock.run_for`` is counted before that call returns)
FETCH_COUNTER = """
window.__auditFetches = 0;
const realFetch = window.fetch;
window.fetch = (...args) => {
  if (String(args[0]?.url ?? args[0]).includes("audits/abc")) window.__auditFetches += 1;
  return realFetch(...args);
};
"""


@pytest.mark.timeout(60)
def test_running_audit_shows_a_provisional_verdict_and_keeps_polling(static_url, tab):
    requested = _serve(tab, _audit("running", round_=4))
    page = tab.page
    page.goto(static_url + "index.html#/audits/abc")
    expect(page.locator("#round-counter")).to_have_text("Round 4 of 10")
    # what the run waits for, then the time left (issue #40)
    expect(page.locator("#eta")).to_have_text(f" · {WAITING} · about 12 s left")
    expect(page.locator("#verdict-summary")).to_have_text(RUNNING)
    expect(page.locator("#verdict .verdict")).to_have_attribute("data-status", "running")
    expect(page.locator("#tile-claim .tile-value")).to_have_text("ε = 4.00")
    expect(page.locator("#tile-measured .tile-value")).to_have_text("ε ≥ 4.20")
    expect(page.locator("#tile-design")).to_contain_text(DESIGN["summary"])
    # while running, the picture has the claim and the bound but no measured curve, and says why
    expect(page.locator("#fdp-chart canvas")).to_have_count(1)
    assert page.locator("#fdp-chart").get_attribute("data-drawn") == "claim,mu_lo"
    expect(page.locator("#fdp-note")).to_contain_text("appear when the audit ends")
    # the bounds over rounds: one line per round so far, the claim line
    assert "claim" in page.locator("#bounds-chart").get_attribute("data-drawn")
    # details are collapsed; opened, seen and unseen stay merged and the page says why
    expect(page.locator("#estimates-table")).not_to_be_visible()
    page.locator("#details > summary").click()
    expect(page.locator("#estimates-table tbody tr")).to_have_count(8)
    expect(page.locator("#details")).to_contain_text("stays secret while the audit runs")
    # every check says which check it is (issue #40: "Another check · passes · p = 0.340")
    expect(page.locator("#diagnostics .diag-head")).to_have_text(
        [
            "The seen canaries' final-model scores look Gaussian · needs attention · value 2.10",
            (
                "Normal-score test calibrated: held-out canaries' normal scores look standard "
                "normal · passes · p = 0.340"
            ),
        ]
    )
    assert "∞" in page.locator("#estimates-table td.eps-cell").all_inner_texts()
    # still polling: two more requests come (within a deadline no loaded machine reaches)
    n = sum(p == "audits/abc" for p in requested)
    deadline = time.monotonic() + 30
    while sum(p == "audits/abc" for p in requested) < n + 2:
        assert time.monotonic() < deadline, "the page stopped polling a running audit"
        page.wait_for_timeout(100)
    assert tab.console_errors == []


@pytest.mark.timeout(60)
def test_failed_audit_shows_the_reason_and_stops_polling(static_url, tab):
    alert = {"level": "error", "message": "the known_rounds claim is rejected"}
    _serve(tab, _audit("failed", round_=4, alerts=[alert], reason="Ray worker died"))
    page = tab.page
    # the page's own timers on a clock the test moves, and its requests counted as they start
    page.clock.install()
    page.add_init_script(FETCH_COUNTER)
    page.goto(static_url + "index.html#/audits/abc")
    expect(page.locator("#failure-reason")).to_contain_text("Ray worker died")
    expect(page.locator(".badge-slot .badge")).to_have_attribute("data-status", "failed")
    # the alarm's message is in the details, its identifiers put into words
    page.locator("#details > summary").click()
    expect(page.locator("#alarm-log")).to_contain_text("the known-rounds claim is rejected")
    expect(page.locator("#alarm-guarantee")).to_contain_text("Gaussian DP with μ = 1")
    expect(page.locator("#delete-audit")).to_be_visible()
    n = page.evaluate("window.__auditFetches")
    assert n >= 1
    page.clock.run_for(4 * POLL_MS)  # four poll intervals of the page's time, at once
    assert page.evaluate("window.__auditFetches") == n, "the page kept polling an ended audit"
    assert tab.console_errors == []


@pytest.mark.timeout(60)
def test_an_attached_audit_says_when_it_stops_waiting_and_why_it_ended(static_url, tab):
    """Issue #28: an attached audit whose run never claims it says how long it waits; once
    ended, why (the run never started)."""
    audit = _audit("running", round_=0)
    audit["spec"] = {**audit["spec"], "engine": "external", "start_timeout_seconds": 600}
    audit["started_at"] = None
    _serve(tab, audit)
    page = tab.page
    page.goto(static_url + "index.html#/audits/abc")
    expect(page.locator("#eta")).to_contain_text(
        "waiting for your Flower app… (the audit ends if no run starts within 10 min 0 s"
    )
    reason = (
        "the run never started: no Flower run declared its claim within 600 s of the "
        "audit's creation (start_timeout_seconds = 600 s)"
    )
    ended = {**audit, "status": "failed", "reason": reason, "finished_at": "2026-01-01T00:10:01Z"}
    tab.page.unroute("**/audits**")
    _serve(tab, ended)
    page.reload()
    expect(page.locator("#failure-reason")).to_contain_text("the run never started")
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
def test_an_injected_bug_is_said_plainly_and_no_bound_is_not_a_number(static_url, tab):
    audit = _audit(
        "running",
        round_=2,
        verdict=_verdict(bound_eps=None),
        bug="bug injected: noise_scale=0.5 (testing only; the claim does not know about it)",
    )
    _serve(tab, audit)
    page = tab.page
    page.goto(static_url + "index.html#/audits/abc")
    expect(page.locator("#bug-injected")).to_contain_text("bug injected: noise × 0.5")
    expect(page.locator("#tile-measured .tile-value")).to_have_text("none yet")
    assert page.locator("#tile-measured").get_attribute("data-epsilon") == ""
    assert tab.console_errors == []


@pytest.mark.timeout(60)
def test_a_service_without_verdicts_is_said_plainly(static_url, tab):
    audit = _audit("succeeded", round_=10)
    del audit["verdict"], audit["tradeoff"]
    _serve(tab, audit)
    page = tab.page
    page.goto(static_url + "index.html#/audits/abc")
    expect(page.locator("#verdict-summary")).to_contain_text("does not report a verdict")
    expect(page.locator("#fdp-chart")).to_contain_text("Nothing to draw yet")
    assert tab.console_errors == []


@pytest.mark.timeout(60)
def test_the_list_shows_each_audits_verdict_when_the_api_sends_it(static_url, tab):
    items = [
        {
            "id": "a1",
            "name": "buggy",
            "status": "succeeded",
            "created_at": "2026-01-01T00:00:00Z",
            "progress": {"round": 4, "num_rounds": 4, "fraction": 1.0},
            "headline_epsilon": 7.1,
            "verdict": {"status": "claim_refuted"},
        },
        {
            "id": "a2",
            "name": "older service",
            "status": "running",
            "created_at": "2026-01-01T00:00:00Z",
            "progress": {"round": 1, "num_rounds": 4, "fraction": 0.25},
            "headline_epsilon": None,
        },
    ]

    def handle(route):
        path = route.request.url.split("://", 1)[1].split("/", 1)[1].split("?")[0]
        if path == "audits":
            route.fulfill(
                status=200,
                content_type="application/json",
                body=json.dumps({"items": items, "total": 2}),
            )
        else:
            route.fulfill(status=200, content_type="application/json", body="{}")

    tab.page.route("**/audits**", handle)
    page = tab.page
    page.goto(static_url + "index.html#/")
    expect(page.locator('#audits-table tr[data-audit-id="a1"] .list-verdict')).to_have_text(
        "✕ Claim refuted"
    )
    expect(page.locator('#audits-table tr[data-audit-id="a2"] .list-verdict')).to_have_count(0)
