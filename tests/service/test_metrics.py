"""``GET /metrics``: Prometheus text that parses, with the metrics of docs/operations.md, whose
values move with audits driven through the real ingest routes."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import AUTH, SMALL_SPEC, f32, make_client, put_gap, start_run, submit
from .gaussian_runs import BASE, fix_canary_seeds, gaussian_run

#: The first canary seed of the leaky runs here and in test_webhooks.py
LEAKY_SEEDS = 0x5EED_4141_0000_0F1A_0D17_C0DE_CAFE

LEAKY = {**BASE, "name": "metrics"}

FAMILIES = {
    "flaudit_audits": "gauge",
    "flaudit_rounds_ingested": "counter",
    "flaudit_round_ingest_seconds": "histogram",
    "flaudit_round_transform_seconds": "histogram",
    "flaudit_gaps_recorded": "counter",
    "flaudit_canary_budget_overruns": "counter",
    "flaudit_alarms_fired": "counter",
    "flaudit_database_up": "gauge",
    "flaudit_runner_up": "gauge",
    "flaudit_workers_running": "gauge",
    "flaudit_scrape_duration_seconds": "gauge",
}

BUDGET_REASON = (
    "the canaries did not arrive within the round budget (5 s): the service is slow or unreachable"
)


@pytest.fixture(autouse=True)
def fixed_canary_seeds(monkeypatch):
    """The same canaries on every run (the leaky run below then fires the alarm every time)."""
    fix_canary_seeds(monkeypatch, LEAKY_SEEDS)


def scrape(client, **kwargs) -> tuple[dict, dict]:
    """(family name -> type, (sample name, sorted labels) -> value) of ``GET /metrics``."""
    response = client.get("/metrics", **kwargs)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    types, samples = {}, {}
    for family in text_string_to_metric_families(response.text):
        types[family.name] = family.type
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return types, samples


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def audit_gauges(samples: dict) -> dict:
    return {
        dict(labels)["status"] + "/" + dict(labels)["verdict"]: v
        for (name, labels), v in samples.items()
        if name == "flaudit_audits"
    }


def leaky_run(client, store) -> tuple[str, list[dict]]:
    """A Gaussian mechanism with a fifth of the claimed noise (a DP bug) and its canaries, four
    rounds with their participants and the final model, through the ingest routes."""
    return gaussian_run(client, store, LEAKY, noise_scale=0.2, noise_seed=41)


def run_with_gaps(client, store) -> str:
    """Round 1 trained without canaries (they missed the round budget), round 2 too (another
    reason), round 3 not reported; the audit stays running."""
    audit_id = submit(client, SMALL_SPEC)
    headers = start_run(store, audit_id)
    dim = SMALL_SPEC["task_options"]["dim"]
    base = f"/audits/{audit_id}"
    zeros = f32(np.zeros(dim))
    assert client.put(f"{base}/initial-model", content=zeros, headers=headers).status_code == 200
    for t, reason in ((1, BUDGET_REASON), (2, "the canary fetch failed: connection refused")):
        response = put_gap(client, audit_id, headers, t, reason)
        assert response.status_code == 200, response.text
    response = client.put(
        f"{base}/rounds/3/missing",
        json={"reason": "the report was lost"},
        headers={"Authorization": headers["Authorization"]},
    )
    assert response.status_code == 200, response.text
    return audit_id


def test_metrics_parse_and_move_with_audits_through_the_ingest_routes(client, store):
    types, before = scrape(client)
    for name, kind in FAMILIES.items():
        assert types.get(name) == kind, (name, types.get(name))
    assert value(before, "flaudit_database_up") == 1
    assert audit_gauges(before) == {}
    assert value(before, "flaudit_rounds_ingested_total") == 0

    audit_id, acks = leaky_run(client, store)
    assert any(a["alarm"] == "error" for a in acks)  # the bug is caught during the run
    _, after = scrape(client)
    assert value(after, "flaudit_rounds_ingested_total") == 4
    assert value(after, "flaudit_round_ingest_seconds_count") == 4
    assert value(after, "flaudit_round_transform_seconds_count") == 4
    assert 0 < value(after, "flaudit_round_transform_seconds_sum")
    assert value(after, "flaudit_round_transform_seconds_sum") <= value(
        after, "flaudit_round_ingest_seconds_sum"
    )
    assert value(after, "flaudit_alarms_fired_total") == 1  # once, not once per later round
    verdict = client.get(f"/audits/{audit_id}").json()["verdict"]["status"]
    assert verdict == "claim_refuted"
    assert audit_gauges(after) == {"succeeded/claim_refuted": 1}
    assert value(after, "flaudit_gaps_recorded_total", kind="no_canaries") == 0

    gapped = run_with_gaps(client, store)
    response = client.get("/metrics")
    _, last = scrape(client)
    assert value(last, "flaudit_gaps_recorded_total", kind="no_canaries") == 2
    assert value(last, "flaudit_gaps_recorded_total", kind="not_reported") == 1
    assert value(last, "flaudit_canary_budget_overruns_total") == 1
    assert value(last, "flaudit_rounds_ingested_total") == 6  # rounds without canaries too
    assert value(last, "flaudit_alarms_fired_total") == 1
    assert audit_gauges(last) == {"succeeded/claim_refuted": 1, "running/running": 1}
    # no audit id, and no seed of either audit, anywhere in the exposition
    for secret in (
        audit_id,
        gapped,
        str(store.canary_seed(audit_id)),
        str(store.canary_seed(gapped)),
        format(store.canary_seed(gapped), "x"),
    ):
        assert secret not in response.text


def test_replicas_on_one_database_agree_on_what_it_holds(client, store):
    leaky_run(client, store)
    with make_client(store) as replica:  # a second instance: its own registry and counters
        _, theirs = scrape(replica)
    _, ours = scrape(client)
    assert audit_gauges(theirs) == audit_gauges(ours) == {"succeeded/claim_refuted": 1}
    assert value(ours, "flaudit_rounds_ingested_total") == 4
    assert value(theirs, "flaudit_rounds_ingested_total") == 0


def test_database_health_reads_0_when_the_database_does_not_answer(client, store, monkeypatch):
    submit(client)
    _, healthy = scrape(client)
    assert value(healthy, "flaudit_database_up") == 1
    assert audit_gauges(healthy) == {"queued/running": 1}

    def unreachable():
        raise ConnectionError("database unreachable")

    monkeypatch.setattr(store, "ping", unreachable)
    _, down = scrape(client)
    assert value(down, "flaudit_database_up") == 0
    assert audit_gauges(down) == {}  # nothing read: no stale counts
    assert value(down, "flaudit_scrape_duration_seconds") >= 0


class _Runner:
    def __init__(self, active: list[str], alive: bool) -> None:
        self.active, self.alive = active, alive

    def stop(self) -> None:
        pass


def test_worker_health_counts_this_instances_workers(client):
    _, none = scrape(client)  # the test app runs no runner
    assert value(none, "flaudit_runner_up") == 0 and value(none, "flaudit_workers_running") == 0
    client.app.state.runner = _Runner(["a", "b"], alive=True)
    _, two = scrape(client)
    assert value(two, "flaudit_runner_up") == 1 and value(two, "flaudit_workers_running") == 2
    client.app.state.runner = _Runner([], alive=False)
    _, stopped = scrape(client)
    assert value(stopped, "flaudit_runner_up") == 0


def test_metrics_need_the_key_when_reads_do(store):
    with make_client(store, require_key_for_reads=True) as locked:
        assert locked.get("/metrics").status_code == 401
        scrape(locked, headers=AUTH)
    with make_client(store) as open_:
        scrape(open_)
