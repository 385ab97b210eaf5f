"""A Gaussian mechanism with canaries played through the real ingest routes, shared by the
service's verdict, metrics, webhook, evidence and report tests: ``BASE`` (a synthetic audit of
4 rounds, 400 canaries, z = 1) and ``gaussian_run``; ``fix_canary_seeds`` makes such runs
reproducible."""

from __future__ import annotations

import numpy as np

import flaudit.service.routers.audits as audits_router
from flaudit.auditor.canaries import canary_vectors, resolve_canary_family, seen_mask
from flaudit.auditor.spec import AuditSpec

from .conftest import AUTH, f32, start_run

DIM = 1000

BASE = {
    "name": "gaussian",
    "task": "synthetic",
    "task_options": {"dim": DIM},
    "num_rounds": 4,
    "num_clients": 400,
    "clients_per_round": 5,
    "participation": "uniform",
    "num_canaries": 400,
    "noise_multiplier": 1.0,
    "clip_norm": 1.0,
    "delta": 1e-5,
}


def fix_canary_seeds(monkeypatch, first: int) -> None:
    """The service's audits get the canary seeds ``first``, ``first + 1``, ... (large and
    secret-looking): a run below is then the same run every time. The service draws them from
    the OS, so a correct run would end refuted in about 5% of test runs (the verdict's own
    false-alarm level), which one CI run cannot tell from a bug."""
    seeds = iter(range(first, 2**128))
    monkeypatch.setattr(audits_router, "new_master_seed", lambda: next(seeds))


def gaussian_run(
    client,
    store,
    spec: dict,
    *,
    noise_scale: float,
    rounds: int | None = None,
    noise_seed: int = 3,
    weight_factor: float | None = None,
):
    """Submit ``spec``, play a Gaussian mechanism whose noise is ``noise_scale`` times the claimed
    one (1: correct; below 1: a DP bug) and ingest ``rounds`` rounds (all by default) with their
    canary participants, then the final model. ``weight_factor``: a weighted FedAvg whose
    canaries (at the heaviest client's weight) move the model ``weight_factor`` times C/n,
    reported with each round. Returns (audit id, round acks)."""
    created = client.post("/audits", json=spec, headers=AUTH)
    assert created.status_code == 201, created.text
    audit_id = created.json()["id"]
    headers = start_run(store, audit_id)
    parsed = AuditSpec.model_validate(spec)
    seed = store.canary_seed(audit_id)
    k, num_rounds = parsed.num_canaries, parsed.num_rounds
    rng = np.random.default_rng(noise_seed)
    seen = seen_mask(seed, k)
    family = resolve_canary_family(parsed.canary_family, num_canaries=k, dim=DIM)
    canaries = canary_vectors(seed, np.arange(k), DIM, family=family)
    round_of = rng.integers(0, num_rounds, size=k)  # each canary's one (known) round
    m, z = parsed.clients_per_round, parsed.noise_multiplier
    theta = rng.normal(size=DIM).astype(np.float32)
    base = f"/audits/{audit_id}"
    assert (
        client.put(f"{base}/initial-model", content=f32(theta), headers=headers).status_code == 200
    )
    acks = []
    for t in range(1, (rounds or num_rounds) + 1):
        inserted = seen & (round_of == t - 1)
        total = canaries[inserted].sum(axis=0, dtype=np.float64) * (weight_factor or 1.0)
        update = (total + rng.normal(scale=noise_scale * z, size=DIM)) / m
        participants = np.flatnonzero(round_of == t - 1).astype("<i4")
        meta = {
            "clip_norm": 1.0,
            "cohort_size": m,
            "num_canaries_inserted": int(inserted.sum()),
            "num_participants": int(participants.size),
        }
        if weight_factor is not None:
            meta["weight_factor"] = weight_factor
        response = client.put(
            f"{base}/rounds/{t}",
            params=meta,
            content=f32(update) + participants.tobytes(),
            headers=headers,
        )
        assert response.status_code == 200, response.text
        acks.append(response.json())
        theta = theta + update.astype(np.float32)
        if response.json()["stop"]:
            break
    response = client.put(f"{base}/final-model", content=f32(theta), headers=headers)
    assert response.status_code == 200, response.text
    return audit_id, acks
