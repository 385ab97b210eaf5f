"""The audit page of a record-level audit (issue #37 item 4): the real static dashboard, the API
answered by Playwright with a body of ``service/record_views.py``'s shape (``"level":
"record"``): the verdict with its cause, the claim over the run and per round client group by
group, the design line and every look, with no console error."""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.slow, pytest.mark.browser]

SUMMARY = (
    "Claim refuted at round 3: the record canaries' scores are more separable than "
    "record-level epsilon = 7.94 over 30 DP-SGD steps allows (p = 7e-05 <= level 0.005)."
)
CAUSE = "noise: the unseen canaries meet 0.53 (+/- 0.01) times the claimed noise z*C (z = 1)"
# the Flower node ids the app reported (client keys), numbered 0 and 1 by the service
NODES = ["5012944712734329771", "9182736450192837465"]

VIEW = {
    "id": "rec",
    "name": "record-level audit of a Flower app",
    "level": "record",
    "engine": "external",
    "status": "succeeded",
    "reason": None,
    "spec": {"level": "record", "num_rounds": 3, "num_clients": 2, "num_canaries": 20},
    "progress": {"rounds_reported": 3, "last_round": 3, "num_rounds": 3},
    "dim": 64,
    "claim": {
        "accountant": "pld",
        "delta": 1e-5,
        "epsilon": 7.93,
        "epsilon_per_round": 4.98,
        "groups": [
            {
                "noise_multiplier": 1.0,
                "sample_rate": 0.2,
                "steps": 30,
                "clients": [0],
                "client_keys": [NODES[0]],
                "epsilon": 7.93,
                "epsilon_per_round": 4.98,
            },
            {
                "noise_multiplier": 1.5,
                "sample_rate": 0.2,
                "steps": 30,
                "clients": [1],
                "client_keys": [NODES[1]],
                "epsilon": 3.1,
                "epsilon_per_round": 2.0,
            },
        ],
    },
    "design": {"summary": "record-level claim epsilon = 7.94 ...; catches 0.5 x in about 100%"},
    "looks": [
        {"round": 1, "look": 1, "status": "ok", "steps": 10, "claim_epsilon": 4.98, "p_value": 1.0},
        {
            "round": 3,
            "look": 3,
            "status": "error",
            "steps": 30,
            "claim_epsilon": 7.94,
            "p_value": 7e-05,
        },
        {
            "round": None,
            "look": 4,
            "status": "error",
            "steps": 30,
            "claim_epsilon": 7.94,
            "p_value": 1e-06,
        },
    ],
    "alarm": {"round": 3, "look": 3, "status": "error"},
    "cause": {"cause": "noise", "sentence": CAUSE},
    "verdict": {"status": "claim_refuted", "summary": SUMMARY},
    "clients": [{"client": key, "index": i} for i, key in enumerate(NODES)],
    "links": {"self": "/audits/rec"},
}


@pytest.mark.timeout(60)
def test_a_record_level_audit_shows_its_verdict_cause_claim_and_looks(static_url, tab):
    def handle(route):
        path = route.request.url.split("://", 1)[1].split("/", 1)[1].split("?")[0]
        bodies = {"audits/rec": VIEW, "audits/rec/rounds": {"items": []}}
        if path in bodies:
            route.fulfill(
                status=200, content_type="application/json", body=json.dumps(bodies[path])
            )
        else:
            route.fulfill(status=404, content_type="application/json", body='{"detail": "no"}')

    tab.page.route("**/audits**", handle)
    page = tab.page
    page.goto(static_url + "index.html#/audits/rec")
    expect(page.locator("#verdict-summary")).to_have_text(SUMMARY)
    expect(page.locator("#cause")).to_contain_text(CAUSE)
    expect(page.locator("#record-claim tr")).to_have_count(3)  # header + two noise groups
    # each group's clients by the Flower node id the operator knows, not the service's index
    expect(page.locator("#record-claim th").first).to_have_text("clients (Flower node id)")
    expect(page.locator("#record-claim td:first-child")).to_have_text(NODES)
    expect(page.locator("#record-looks tr")).to_have_count(4)
    # the alarm column in words, as the user-level page says it; never the API's ok / error
    expect(page.locator("#record-looks td:nth-child(2)")).to_have_text(
        ["no alarm", "alarm", "alarm"]
    )
    expect(page.locator("#record-looks")).not_to_contain_text(re.compile(r"\b(ok|error)\b"))
    expect(page.locator("#record-looks")).to_contain_text("end")
    expect(page.locator("#record-design")).to_contain_text("catches 0.5")
    assert tab.console_errors == []
