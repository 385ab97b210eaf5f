"""Audits made cheaply and for real: an external-engine audit (``engine = "external"``) fed
synthetic DP-FedAvg rounds through the service's real ingest routes, as a user's ServerApp feeds
it. The driver never sees the canary seed: each round it asks the service for the canaries to
insert, adds them (scaled to the clip norm) to clipped random client updates, adds Gaussian noise
of standard deviation ``actual_noise * S`` and sends ``(sum + noise) / m``. An ``actual_noise``
below the claimed ``noise_multiplier`` is a DP bug the audit should catch.
"""

from __future__ import annotations

import httpx
import numpy as np


def _put(client: httpx.Client, path: str, vector, token: dict, **params) -> httpx.Response:
    response = client.put(
        path,
        content=np.asarray(vector, "<f4").tobytes(),
        params=params,
        headers={**token, "Content-Type": "application/octet-stream"},
    )
    response.raise_for_status()
    return response


def run_synthetic_audit(
    client: httpx.Client,
    *,
    name: str,
    num_canaries: int,
    noise_multiplier: float,
    actual_noise: float,
    num_rounds: int = 4,
    num_clients: int = 200,
    clients_per_round: int = 100,
    canary_repeats: int = 1,
    dim: int = 2000,
    clip_norm: float = 1.0,
    delta: float = 1e-5,
    seed: int = 0,
) -> str:
    """Create, claim, feed and end one external audit; returns its id (status succeeded)."""
    spec = {
        "name": name,
        "engine": "external",
        "num_canaries": num_canaries,
        "canary_repeats": canary_repeats,
        "max_canary_fraction": 1.0,
        "delta": delta,
    }
    created = client.post("/audits", json=spec)
    created.raise_for_status()
    body = created.json()
    audit_id = body["id"]
    token = {"Authorization": f"Bearer {body['environment']['FLAUDIT_RUN_TOKEN']}"}
    claim = {
        "noise_multiplier": noise_multiplier,
        "clip_norm": clip_norm,
        "num_rounds": num_rounds,
        "num_clients": num_clients,
        "clients_per_round": clients_per_round,
        "strategy": "synthetic rounds (tests/e2e/synthetic_runs.py)",
    }
    client.put(f"/audits/{audit_id}/claim", json=claim, headers=token).raise_for_status()
    rng = np.random.default_rng(seed)
    theta = rng.standard_normal(dim)
    _put(client, f"/audits/{audit_id}/initial-model", theta, token)
    for t in range(1, num_rounds + 1):
        response = client.get(f"/audits/{audit_id}/rounds/{t}/canaries", headers=token)
        response.raise_for_status()
        count = int(response.headers["X-Canary-Count"])
        canaries = np.frombuffer(response.content, "<f4").reshape(count, dim).astype(np.float64)
        # the canaries take cohort slots: clients_per_round replies in all
        updates = rng.standard_normal((clients_per_round - count, dim))
        norms = np.linalg.norm(updates, axis=1, keepdims=True)
        updates *= np.minimum(1.0, clip_norm / norms)
        total = updates.sum(axis=0) + clip_norm * canaries.sum(axis=0)
        total += actual_noise * clip_norm * rng.standard_normal(dim)
        delta_t = total / clients_per_round
        _put(
            client,
            f"/audits/{audit_id}/rounds/{t}",
            delta_t,
            token,
            clip_norm=clip_norm,
            cohort_size=clients_per_round,
            num_failures=0,
            num_canaries_inserted=count,
        )
        theta = theta + delta_t
    _put(client, f"/audits/{audit_id}/final-model", theta, token, accuracy=0.5, loss=1.0)
    return audit_id
