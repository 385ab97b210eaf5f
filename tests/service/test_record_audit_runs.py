"""Record-level audits in the service driven by real DP-SGD (issue #37 item 4): the built-in
engine's Opacus training (``tests/service/record_app.py``, no Flower) feeds the service through
:class:`flaudit.server.record_http.RecordAuditClient`. A correct run is not refuted; half the
claimed noise is refuted with the cause "noise"; each ended audit's signed evidence bundle
passes ``flaudit verify``, and a tampered one does not. SQLite only: each run trains 20 clients
for 3 rounds (about 25 s on an idle 2-core machine, 60 s at load 14)."""

from __future__ import annotations

import json
from html import escape

import pytest

from flaudit.commands.cli import main as cli_main
from flaudit.server.record_http import RecordAuditClient

from .conftest import API_KEY, make_client
from .gaussian_runs import fix_canary_seeds
from .record_app import SPEC, run_app

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

AUDIT = {
    "name": "record-level service test",
    "num_rounds": 3,
    "num_clients": SPEC["num_clients"],
    "num_canaries": SPEC["num_canaries"],
}


def _run(
    store, tmp_path, capsys, monkeypatch, bug=None, *, tamper=False
) -> tuple[dict, dict, dict]:
    # the service's canary seed fixed: the verdict is the same every time (issue #39)
    fix_canary_seeds(monkeypatch, 0x5EED_2026_1206_0F1A_0D17_C0DE_0038)
    with make_client(store) as client:
        audit = RecordAuditClient.create(
            "http://testserver", AUDIT, api_key=API_KEY, http_client=client
        )
        answers, _, _ = run_app(audit, num_rounds=3, bug=bug)
        verdict = audit.end()
        view = audit.status()
        bundle = client.get(f"/audits/{audit.audit_id}/evidence").json()
        keys = client.get("/keys").json()
        page = client.get(f"/audits/{audit.audit_id}/report")
    assert [a["look"] for a in answers] == [1, 2, 3]
    assert answers[0]["p_value"] == 1.0  # round 1: no client has a plan yet
    assert page.status_code == 200 and escape(verdict["summary"]) in page.text
    # the printable report words it as the page does: Flower node ids, "no alarm" / "alarm"
    assert "clients (Flower node id)" in page.text and "node-0, node-1" in page.text
    statuses = [look["status"] for look in view["looks"]]
    assert page.text.count("<td>no alarm</td>") == statuses.count("ok") >= 1
    assert page.text.count("<td>alarm</td>") == statuses.count("error")
    assert "<td>ok</td>" not in page.text and "<td>error</td>" not in page.text
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps(keys))
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(bundle))
    capsys.readouterr()
    assert cli_main(["verify", str(path), "--public-key", str(keys_file)]) == 0
    assert "verified" in capsys.readouterr().out
    if tamper:
        tampered = {**bundle, "cause": {**bundle["cause"], "cause": "clipping"}}
        path.write_text(json.dumps(tampered))
        assert cli_main(["verify", str(path), "--public-key", str(keys_file)]) != 0
    return verdict, view, bundle


def test_a_correct_app_is_not_refuted(sqlite_store, tmp_path, capsys, monkeypatch):
    verdict, view, bundle = _run(sqlite_store, tmp_path, capsys, monkeypatch)
    assert verdict["status"] == "consistent", verdict
    assert view["verdict"] == bundle["verdict"] and view["alarm"] is None
    assert bundle["level"] == "record" and view["design"]["refutable"]
    claim = view["claim"]
    assert claim["epsilon"] > claim["epsilon_per_round"] > 0  # the run's beside the round's
    # one noise group of every client, named by its Flower node id beside the service's index
    nodes = [f"node-{i}" for i in range(AUDIT["num_clients"])]
    assert [(g["client_keys"], g["clients"]) for g in claim["groups"]] == [
        (nodes, list(range(AUDIT["num_clients"])))
    ]
    assert {look["status"] for look in view["looks"]} == {"ok"}  # the API's identifier


def test_half_the_noise_is_refuted_with_the_cause_noise(
    sqlite_store, tmp_path, capsys, monkeypatch
):
    verdict, view, bundle = _run(
        sqlite_store, tmp_path, capsys, monkeypatch, bug="noise_scale=0.5", tamper=True
    )
    assert verdict["status"] == "claim_refuted", verdict
    assert verdict["cause"]["cause"] == "noise" and "less noise" in verdict["summary"]
    assert view["alarm"]["status"] == "error" and bundle["cause"]["cause"] == "noise"
    assert "error" in {look["status"] for look in view["looks"]}  # words only on the page
    assert "client_keys" not in json.dumps(bundle)  # the signed bundle keeps its indices
