"""Round reporters: HTTP wire format, retries, 4xx; the local tracker path."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from flaudit.auditor.canaries import canary_vectors, seen_mask
from flaudit.auditor.statistics import CosineTracker
from flaudit.server.http_reporter import HttpRoundReporter, ReportingError
from flaudit.server.reporting import LocalRoundReporter, RoundMetadata

META = RoundMetadata(
    clip_norm=0.5,
    cohort_size=4,
    num_canaries_inserted=1,
    num_failures=0,
    clipped_fraction=0.25,
    noise_stddev=0.5,
)


def _reporter(handler, **kwargs):
    client = httpx.Client(transport=httpx.MockTransport(handler))
    return HttpRoundReporter(
        "http://auditor", "a1", "tok-123", client=client, backoff=0.0, **kwargs
    )


def test_http_reporter_sends_raw_float32_with_bearer_and_metadata():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    reporter = _reporter(handler)
    delta = np.array([1.5, -2.0, 3.25], dtype=np.float64)
    reporter.report_initial(np.zeros(3))
    reporter.report_round(1, delta, META)
    reporter.report_final(np.ones(3), {"accuracy": 0.9, "loss": 0.1, "other": 2.0})
    paths = [r.url.path for r in seen]
    assert paths == ["/audits/a1/initial-model", "/audits/a1/rounds/1", "/audits/a1/final-model"]
    assert all(r.method == "PUT" and r.headers["authorization"] == "Bearer tok-123" for r in seen)
    assert np.array_equal(np.frombuffer(seen[1].content, dtype="<f4"), delta.astype(np.float32))
    params = dict(seen[1].url.params)
    assert float(params["clip_norm"]) == 0.5 and int(params["num_canaries_inserted"]) == 1
    assert "train_loss" not in params
    assert set(dict(seen[2].url.params)) == {"accuracy", "loss"}
    assert "tok-123" not in repr(reporter)


def test_http_reporter_retries_5xx_and_connection_errors_then_succeeds():
    calls = {"n": 0}

    def handler(request):
        calls["n"] += 1
        if calls["n"] == 1:
            raise httpx.ConnectError("refused")
        if calls["n"] == 2:
            return httpx.Response(503)
        return httpx.Response(200)

    _reporter(handler, max_retries=3).report_round(1, np.zeros(2), META)
    assert calls["n"] == 3


def test_http_reporter_stop_mode_gives_up_after_max_retries_and_raises_on_4xx_at_once():
    calls = {"n": 0}

    def flaky(request):
        calls["n"] += 1
        return httpx.Response(500)

    with pytest.raises(ReportingError, match="3 attempts .*training stops .*'stop'"):
        _reporter(flaky, max_retries=2, on_service_error="stop").report_round(1, np.zeros(2), META)
    assert calls["n"] == 3

    calls["n"] = 0

    def reject(request):
        calls["n"] += 1
        return httpx.Response(422, text="wrong length")

    with pytest.raises(ReportingError, match="422"):
        _reporter(reject, max_retries=5, on_service_error="stop").report_round(1, np.zeros(2), META)
    assert calls["n"] == 1
    with pytest.raises(ValueError, match="on_service_error"):
        _reporter(reject, on_service_error="ignore")


def test_http_reporter_fails_open_buffers_in_order_and_sends_when_the_service_is_back(caplog):
    """Continue mode: an outage raises nothing, logs one warning, and the rounds arrive later
    in order; a round that does not fit the buffer is sent as a gap."""
    state = {"up": False, "seen": []}

    def handler(request):
        if not state["up"]:
            raise httpx.ConnectError("refused")
        state["seen"].append(request.url.path)
        return httpx.Response(200, json={})

    reporter = _reporter(handler, max_retries=1, retry_seconds=0.05, buffer_bytes=20)
    with caplog.at_level("WARNING", logger="flaudit.server.reporting"):
        reporter.report_initial(np.zeros(2))
        reporter.report_round(1, np.zeros(2), META)  # 8 bytes: kept
        reporter.report_round(2, np.zeros(2), META)  # 16 bytes: kept
        reporter.report_round(3, np.zeros(2), META)  # would be 24 > 20: a gap
        assert reporter.pending() == 4 and state["seen"] == []
        state["up"] = True
        reporter.report_final(np.ones(2), {})  # drains
    assert state["seen"] == [
        "/audits/a1/initial-model",
        "/audits/a1/rounds/1",
        "/audits/a1/rounds/2",
        "/audits/a1/rounds/3/missing",
        "/audits/a1/final-model",
    ]
    assert reporter.pending() == 0
    assert reporter.gaps == [
        {
            "round": 3,
            "kind": "not_reported",
            "reason": "not reported: the wrapper's buffer (0 MiB) was full "
            "while the service was away",
        }
    ]
    unreachable = [r for r in caplog.records if "is unreachable (" in r.getMessage()]
    assert len(unreachable) == 1  # one clear warning per outage
    assert any(
        "is back (unreachable for" in r.getMessage()
        and "5 buffered report(s) delivered" in r.getMessage()
        for r in caplog.records
    )
    reporter.close()


def test_http_reporter_drain_gives_up_and_says_what_is_lost(caplog):
    def down(request):
        raise httpx.ConnectError("refused")

    reporter = _reporter(down, max_retries=0, retry_seconds=0.05, drain_seconds=0.2)
    with caplog.at_level("WARNING", logger="flaudit.server.reporting"):
        reporter.report_initial(np.zeros(2))
        reporter.report_round(1, np.zeros(2), META)
        reporter.report_final(np.ones(2), {})  # returns after drain_seconds, raises nothing
    assert reporter.pending() == 3
    assert any(
        "still unreachable; not reported: the initial model, round 1, the final model"
        in r.getMessage()
        for r in caplog.records
    )
    reporter.close()


def test_http_reporter_sends_its_run_identity_and_the_reason_of_a_round_without_canaries():
    seen = []

    def handler(request):
        seen.append(request)
        if request.url.path.endswith("/canary-sum"):
            raise httpx.ConnectError("refused")
        return httpx.Response(200, json={"spec": {"num_rounds": 3, "timeout_seconds": 60}})

    reporter = _reporter(handler, max_retries=0, run_id="run-a")
    reporter.declare_claim({"noise_multiplier": 1.0})
    block = reporter.round_canaries(1)
    assert block.size == 0
    meta = RoundMetadata(
        clip_norm=0.5,
        cohort_size=2,
        num_canaries_inserted=0,
        num_failures=0,
        clipped_fraction=0.0,
        noise_stddev=0.5,
    )
    reporter.report_round(1, np.zeros(2), meta)
    assert reporter.drain(5)  # queued behind the outage the failed fetch revealed
    assert all(r.headers["x-flaudit-run-id"] == "run-a" for r in seen)
    rounds = [r for r in seen if r.url.path == "/audits/a1/rounds/1"]
    assert "service unreachable" in dict(rounds[-1].url.params)["canaries_missing"]
    assert reporter.gaps[0]["kind"] == "no_canaries"
    reporter.close()


def test_local_reporter_gives_canary_statistics():
    seed, k, d = 2024, 20, 4000
    mask = seen_mask(seed, k)
    directions = canary_vectors(seed, np.arange(k), d, family="orthogonal")
    reporter = LocalRoundReporter(CosineTracker(seed, k, d))  # default family: orthogonal
    theta0 = np.zeros(d, dtype=np.float32)
    reporter.report_initial(theta0)
    delta = directions[mask].sum(axis=0)  # the seen canaries, no noise
    reporter.report_round(1, delta, META)
    reporter.report_final(theta0 + delta, {"accuracy": 1.0})
    final = reporter.tracker.final_cosines
    assert final[mask].min() > 0.1 and np.abs(final[~mask]).max() < 0.1
    with pytest.raises(ValueError, match="server_round"):
        reporter.report_round(3, delta, META)


def test_local_reporter_feeds_the_known_rounds_statistic_from_participants():
    from flaudit.auditor.claims.known_rounds import KnownRoundsStatistic
    from flaudit.server.reporting import participant_mask

    seed, k, d = 77, 40, 3000
    mask = seen_mask(seed, k)
    directions = canary_vectors(seed, np.arange(k), d, family="orthogonal").astype(np.float64)
    reporter = LocalRoundReporter.for_audit(canary_seed=seed, num_canaries=k)
    reporter.report_initial(np.zeros(d, dtype=np.float32))
    rng = np.random.default_rng(0)
    expected = KnownRoundsStatistic(k, dim=d)
    for t in (1, 2):
        part = np.flatnonzero(rng.random(k) < 0.5)
        inside = np.zeros(k, dtype=bool)
        inside[part] = True
        update = (directions[inside & mask].sum(axis=0) + rng.normal(scale=0.5, size=d)) / 4
        meta = RoundMetadata(
            0.5,
            4,
            int((inside & mask).sum()),
            0,
            0.0,
            0.5,
            participants=tuple(int(j) for j in part),
        )
        reporter.report_round(t, update.astype(np.float32), meta)
        u = update.astype(np.float32).astype(np.float64)
        expected.update(directions @ u / np.linalg.norm(u), inside, ~mask)
    # the orthogonal family's cosines are null-standardized (divided by the energy outside the
    # seen canaries, statistics.null_standardized_cosines), plain cosines here: within 1%
    np.testing.assert_allclose(
        reporter.known_rounds.scores, expected.scores, rtol=1e-2, equal_nan=True
    )
    for bad, words in (([-1], "negative"), ([k], "out of range"), ([2, 2], "twice")):
        with pytest.raises(ValueError, match=f"participants: .*{words}"):
            participant_mask(bad, k)


def test_http_reporter_appends_participants_as_int32_and_counts_them_in_the_query():
    seen = {}

    def handler(request):
        seen["body"], seen["params"] = request.content, dict(request.url.params)
        return httpx.Response(200, json={})

    meta = RoundMetadata(0.5, 4, 1, 0, 0.25, 0.5, participants=(2, 9))
    _reporter(handler).report_round(1, np.array([1.0, 2.0], dtype=np.float32), meta)
    assert seen["params"]["num_participants"] == "2" and "participants" not in seen["params"]
    assert seen["body"][:8] == np.array([1, 2], "<f4").tobytes()
    assert np.frombuffer(seen["body"][8:], "<i4").tolist() == [2, 9]
