"""The audit sizes itself (issue #28 item 2), through the real service app: ``num_canaries =
"auto"`` (the default of engine "external") is chosen when the ServerApp declares its
federation, and a claim the federation cannot satisfy ends the audit at once (``failed``, the
reason in the API and on the page), never "Running (round 0)"."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import pytest
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg

from flaudit.auditor.claims.sizing import canaries_needed, max_canaries
from flaudit.commands import cli
from flaudit.server.http_reporter import HttpRoundReporter, ReportingError
from flaudit.server.wrapper import CanaryAuditStrategy

from .conftest import AUTH

#: Flower's advanced-pytorch shape: 3 SuperNodes, 2 sampled per round, 10 rounds, z = 1.
CLAIM = {
    "noise_multiplier": 1.0,
    "clip_norm": 0.1,
    "num_rounds": 10,
    "num_clients": 3,
    "clients_per_round": 2,
    "strategy": "DifferentialPrivacyServerSideFixedClipping > FedAvg",
}


def _create(client, **spec):
    response = client.post(
        "/audits", json={"name": "byo", "engine": "external", **spec}, headers=AUTH
    )
    assert response.status_code == 201, response.text
    body = response.json()
    return body, {"Authorization": f"Bearer {body['environment']['FLAUDIT_RUN_TOKEN']}"}


def test_auto_is_the_byo_default_and_sizes_the_audit_when_the_claim_arrives(client):
    body, token = _create(client)
    assert body["design"]["testable"] and "Sizes itself" in body["design"]["summary"]
    waiting = client.get(f"/audits/{body['id']}").json()
    assert waiting["spec"]["num_canaries"] == "auto" and waiting["status"] == "running"
    assert client.get(f"/audits/{body['id']}/cosines").json()["total"] == 0
    ack = client.put(f"/audits/{body['id']}/claim", json=CLAIM, headers=token)
    assert ack.status_code == 200, ack.text
    spec, design = ack.json()["spec"], ack.json()["design"]
    cap = max_canaries(clients_per_round=2, num_rounds=10, canary_repeats=spec["canary_repeats"])
    # z = 1 needs more canaries than 2 per round x 10 rounds hold: the cap, and an honest design
    assert spec["num_canaries"] == cap == 20 and not design["testable"]
    assert "at most 20 canaries" in design["advice"] and "train 20 rounds" in design["advice"]
    audit = client.get(f"/audits/{body['id']}").json()
    assert audit["spec"]["num_canaries"] == 20 and audit["status"] == "running"
    verdict = audit["verdict"]["summary"]
    assert "inconclusive so far" in verdict and "train 20 rounds" in verdict
    assert "use at least" not in verdict  # no advice the federation forbids
    again = client.put(f"/audits/{body['id']}/claim", json=CLAIM, headers=token)
    assert again.status_code == 200 and again.json()["stored"] is False  # idempotent


def test_auto_picks_the_fewest_canaries_that_make_the_claim_testable(client):
    body, token = _create(client, num_canaries="auto")
    claim = {**CLAIM, "num_clients": 100, "clients_per_round": 10, "num_rounds": 100}
    ack = client.put(f"/audits/{body['id']}/claim", json=claim, headers=token).json()
    k = ack["spec"]["num_canaries"]
    assert ack["design"]["testable"] and ack["spec"]["canary_repeats"] == 1
    assert k == max(32, canaries_needed(noise_multiplier=1.0, canary_repeats=1, num_rounds=100))
    assert "Catches noise" in ack["design"]["summary"]


@pytest.mark.parametrize(
    "k,claim,words",
    [
        (100, {"num_rounds": 5}, "at most 10 canaries"),  # issue #28: 100 canaries in 5 rounds
        (16, {"num_clients": 1, "clients_per_round": 20}, "clients_per_round"),  # 20 of 1 + ~8
    ],
)
def test_a_claim_the_federation_cannot_satisfy_ends_the_audit_at_once(client, k, claim, words):
    body, token = _create(client, num_canaries=k)
    refused = client.put(f"/audits/{body['id']}/claim", json={**CLAIM, **claim}, headers=token)
    assert refused.status_code == 422 and words in refused.text, refused.text
    assert f"audit {body['id']} failed" in refused.text
    audit = client.get(f"/audits/{body['id']}").json()
    assert audit["status"] == "failed" and audit["finished_at"] is not None
    assert audit["reason"].startswith("refused before round 1: ") and words in audit["reason"]
    assert "Value error" not in audit["reason"]
    assert "Running" not in audit["verdict"]["summary"]
    listed = client.get("/audits", headers=AUTH).json()["items"]
    assert [a["status"] for a in listed if a["id"] == body["id"]] == ["failed"]
    # the run may not go on with it (its token was revoked with the audit)
    assert client.put(f"/audits/{body['id']}/claim", json=CLAIM, headers=token).status_code == 401


def test_the_cap_is_deterministic_not_a_draw_of_the_secret_seen_set(client):
    """k <= n * floor(T / r) always fits; one more canary is always refused, whatever the seed
    drew (the refusal no longer depends on, or reveals, how many canaries are seen)."""
    for k, fits in ((20, True), (21, False), (21, False), (21, False)):
        body, token = _create(client, num_canaries=k)
        status = client.put(f"/audits/{body['id']}/claim", json=CLAIM, headers=token).status_code
        assert status == (200 if fits else 422), (k, status)


def test_num_canaries_is_validated(client):
    for bad in ("many", 1, 0, -3, 2_000_000, 2.5, True):
        response = client.post(
            "/audits", json={"engine": "external", "num_canaries": bad}, headers=AUTH
        )
        assert response.status_code == 422 and "num_canaries" in response.text, bad
    built_in = client.post("/audits", json={"num_canaries": "auto"}, headers=AUTH)
    assert built_in.status_code == 422 and "engine 'external'" in built_in.text


class _Grid:
    """The one thing ``declare`` asks a Grid: its nodes (3 SuperNodes)."""

    def get_node_ids(self):
        return [11, 12, 13]


def _wrapped(client, audit_id, token, **options):
    http = httpx.Client(transport=client._transport, base_url="http://testserver")
    reporter = HttpRoundReporter("http://testserver", audit_id, token, client=http, backoff=0.0)
    dp = DifferentialPrivacyServerSideFixedClipping(
        FedAvg(fraction_evaluate=0.0),
        noise_multiplier=1.0,
        clipping_norm=0.1,
        num_sampled_clients=2,
    )
    return CanaryAuditStrategy(dp, reporter=reporter, **options)


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append((record.levelno, record.getMessage()))


@pytest.fixture
def flwr_log():
    handler, logger = _Lines(), logging.getLogger("flwr")
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)


def test_the_serverapp_log_says_what_auto_chose_before_round_1(client, flwr_log):
    body, token = _create(client)
    strategy = _wrapped(client, body["id"], token["Authorization"].split()[1])
    strategy.declare(_Grid(), 10)
    design = [m for level, m in flwr_log if m.startswith("flaudit: audit design:")]
    assert design == [
        "flaudit: audit design: 20 canaries, 1 repeat(s) per seen canary: "
        + client.get(f"/audits/{body['id']}").json()["verdict"]["design"]["summary"]
        + " Not testable: "
        + client.get(f"/audits/{body['id']}").json()["verdict"]["design"]["advice"]
    ]
    assert "train 20 rounds" in design[0]


def test_a_refused_claim_is_one_clear_line_in_the_serverapp_log(client, flwr_log):
    body, token = _create(client, num_canaries=100)
    strategy = _wrapped(client, body["id"], token["Authorization"].split()[1])
    with pytest.raises(ReportingError, match="at most 10 canaries"):
        strategy.declare(_Grid(), 5)
    errors = [m for level, m in flwr_log if level >= logging.ERROR]
    assert len(errors) == 1 and errors[0].startswith(
        "flaudit: the audit service refused this run's claim: audit "
        f"{body['id']} failed: refused before round 1: num_canaries: 100 canaries do not fit"
    )
    assert "at most 2 sampled clients per round × 5 rounds per canary period = 10" in errors[0]
    assert client.get(f"/audits/{body['id']}").json()["status"] == "failed"


@pytest.mark.parametrize(
    "argv,wanted", [([], "auto"), (["--canaries", "auto"], "auto"), (["--canaries", "12"], 12)]
)
def test_flaudit_attach_defaults_to_auto(client, monkeypatch, capsys, argv, wanted):
    monkeypatch.setenv("FLAUDIT_API_KEY", AUTH["Authorization"].split()[1])
    monkeypatch.setattr(httpx, "post", lambda url, **kw: client.post(url, **kw))
    code = cli.main(["attach", "--url", "http://testserver", "--format", "json", *argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    audit_id = json.loads(out.out)["FLAUDIT_AUDIT_ID"]
    assert client.get(f"/audits/{audit_id}").json()["spec"]["num_canaries"] == wanted
    if wanted == "auto":
        assert "flaudit: design: Sizes itself when your ServerApp declares" in out.err


def test_flaudit_attach_refuses_a_bad_count(capsys):
    with pytest.raises(SystemExit):
        cli.main(["attach", "--canaries", "1"])
    assert "at least 2 canaries" in capsys.readouterr().err


def test_docs_show_the_lines_the_serverapp_logs(client, flwr_log):
    """docs/flower.md quotes the design line and the refusal line: they are what the code logs
    (flaudit attach's default delta, 1e-5)."""
    page = (Path(__file__).parents[2] / "docs" / "flower.md").read_text()
    documented = [line for line in page.splitlines() if line.startswith("flaudit: ")]
    body, token = _create(client, delta=1e-5)
    _wrapped(client, body["id"], token["Authorization"].split()[1]).declare(_Grid(), 10)
    body, token = _create(client, num_canaries=100, delta=1e-5)
    with pytest.raises(ReportingError):
        _wrapped(client, body["id"], token["Authorization"].split()[1]).declare(_Grid(), 5)
    logged = [
        m.replace(body["id"], "<id>")
        for _, m in flwr_log
        if m.startswith(("flaudit: audit design", "flaudit: the audit service refused"))
    ]
    assert len(logged) == 2 and all(line in documented for line in logged), (logged, documented)


def test_the_wrapper_may_fix_the_canaries_of_an_auto_audit(client, flwr_log):
    body, token = _create(client)
    run_token = token["Authorization"].split()[1]
    strategy = _wrapped(client, body["id"], run_token, num_canaries=12)
    strategy.declare(_Grid(), 10)
    assert client.get(f"/audits/{body['id']}").json()["spec"]["num_canaries"] == 12
    assert any(m.startswith("flaudit: audit design: 12 canaries") for _, m in flwr_log)
    # an audit that fixed its canaries refuses another number (and ends: it cannot start)
    fixed, token = _create(client, num_canaries=20)
    with pytest.raises(ReportingError, match="asks for 12 canaries"):
        _wrapped(client, fixed["id"], token["Authorization"].split()[1], num_canaries=12).declare(
            _Grid(), 10
        )
    assert client.get(f"/audits/{fixed['id']}").json()["status"] == "failed"
    # "auto" from the app keeps the audit's own number
    fixed, token = _create(client, num_canaries=20)
    _wrapped(client, fixed["id"], token["Authorization"].split()[1], num_canaries="auto").declare(
        _Grid(), 10
    )
    assert client.get(f"/audits/{fixed['id']}").json()["spec"]["num_canaries"] == 20


@pytest.mark.parametrize("bad", [1, "many", 2.0, True, 10**7])
def test_the_wrapper_checks_num_canaries(client, bad):
    with pytest.raises(ValueError, match="num_canaries must be an integer from 2"):
        _wrapped(client, "x", "y", num_canaries=bad)
