"""A bring-your-own round moves at most 3 x 4d bytes between the wrapper and the service, whatever
the number of canaries (issue #23): the service serves the round's canary sum once and the
wrapper inserts c replies of sum / c; they add up to the c canaries."""

from __future__ import annotations

import types

import httpx
import numpy as np

from flaudit.server.canary_audit import CanaryAudit
from flaudit.server.http_reporter import HttpRoundReporter
from flaudit.server.reporting import RoundMetadata

from .conftest import AUTH

EXTERNAL = {
    "name": "byo-traffic",
    "engine": "external",
    "num_canaries": 32,
    "canary_repeats": 4,
    "max_canary_fraction": 1.0,
    "delta": 1e-5,
}
# canaries take cohort slots: 16 sampled per round leave room for the ~8 seen canaries a round
# (at most 32 canaries fit: 16 × 2-round periods)
CLAIM = {
    "noise_multiplier": 1.0,
    "clip_norm": 0.5,
    "num_rounds": 8,
    "num_clients": 16,
    "clients_per_round": 16,
    "strategy": "DifferentialPrivacyServerSideFixedClipping > FedAvg",
}
DIM = 5000


class CountingTransport(httpx.BaseTransport):
    """Counts request and response body bytes through another transport."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner
        self.sent = 0
        self.received = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent += len(request.read())
        response = self.inner.handle_request(request)
        body = response.read()
        self.received += len(body)
        return httpx.Response(response.status_code, headers=response.headers, content=body)


def _attach(client):
    response = client.post("/audits", json=EXTERNAL, headers=AUTH)
    assert response.status_code == 201, response.text
    created = response.json()
    audit_id = created["id"]
    token = {"Authorization": f"Bearer {created['environment']['FLAUDIT_RUN_TOKEN']}"}
    claim = client.put(f"/audits/{audit_id}/claim", json=CLAIM, headers=token)
    assert claim.status_code == 200, claim.text
    theta0 = np.zeros(DIM, dtype="<f4").tobytes()
    put = client.put(
        f"/audits/{audit_id}/initial-model",
        content=theta0,
        headers={**token, "Content-Type": "application/octet-stream"},
    )
    assert put.status_code == 200, put.text
    return audit_id, token["Authorization"].split()[1]


def test_a_byo_round_moves_at_most_three_vectors_whatever_the_number_of_canaries(client):
    audit_id, run_token = _attach(client)
    counter = CountingTransport(client._transport)
    http = httpx.Client(transport=counter, base_url="http://testserver")
    # canaries_ahead=0: one round's own traffic (fetching ahead moves the same sums earlier:
    # one d-vector per round in the steady state, plus the first round's look-ahead)
    reporter = HttpRoundReporter(
        "http://testserver", audit_id, run_token, client=http, backoff=0.0, canaries_ahead=0
    )
    audit = CanaryAudit(types.SimpleNamespace(), reporter, clip_norm=0.5)  # both wrappers' core
    clip_norm = 0.5
    for t in (1, 2):
        counter.sent = counter.received = 0
        replies = audit.round_canaries(t, DIM)  # the fetch seam
        count = replies.shape[0]
        assert count >= 4  # enough canaries that c full vectors would exceed the bound
        # what the replies add to the aggregate equals the c canaries (old route, c x 4d bytes)
        full = client.get(
            f"/audits/{audit_id}/rounds/{t}/canaries",
            headers={"Authorization": f"Bearer {run_token}", "X-Flaudit-Run-Id": reporter.run_id},
        )  # the bound run
        vectors = np.frombuffer(full.content, "<f4").reshape(count, DIM).astype(np.float64)
        np.testing.assert_allclose(
            (clip_norm * replies.astype(np.float64)).sum(axis=0),
            clip_norm * vectors.sum(axis=0),
            atol=1e-6,
        )
        norms = np.linalg.norm(replies.astype(np.float64), axis=1)
        np.testing.assert_allclose(norms, 1 / np.sqrt(count), rtol=1e-5)  # orthonormal canaries
        assert np.all(clip_norm * norms <= clip_norm)  # clipping at clip_norm leaves them alone
        delta = (clip_norm * replies.sum(axis=0) / (3 + count)).astype(np.float32)
        reporter.report_round(
            t,
            delta,
            RoundMetadata(
                clip_norm=clip_norm,
                cohort_size=3 + count,
                num_canaries_inserted=count,
                num_failures=0,
                clipped_fraction=0.0,
                noise_stddev=clip_norm,
            ),
        )
        moved = counter.sent + counter.received
        assert moved <= 3 * 4 * DIM, (t, count, moved)
        assert count * 4 * DIM > 3 * 4 * DIM  # the old route would not have fit
    # report_round raises on any non-2xx: both rounds were stored and scored
