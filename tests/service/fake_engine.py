"""A light stand-in for the Flower engine, used by the service tests.

``worker(payload)`` runs in the runner's worker process like ``simulation_worker``: it plays a
DP-FedAvg-like Gaussian mechanism in numpy (seen canaries added at clip norm S in one round
each, Gaussian noise z*S on the sum) and reports through the same HTTP ingest routes. The
spec's ``task_options`` set ``dim`` and ``round_seconds`` (sleep per round).
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

from flaudit.auditor.canaries import canary_vectors, resolve_canary_family, seen_mask
from flaudit.auditor.spec import AuditSpec

#: The spec's ``task`` for audits run by this engine (a custom task, so its ``task_options`` are
#: free; the service needs ``FLAUDIT_ALLOW_CUSTOM_TASKS=1``, see :data:`FAKE_ENV`).
FAKE_TASK = "tests.service.fake_engine:task"
#: Service environment that runs audits with this engine.
FAKE_ENV = {
    "FLAUDIT_WORKER_TARGET": "tests.service.fake_engine:worker",
    "FLAUDIT_ALLOW_CUSTOM_TASKS": "1",
}
#: A spec of this engine without its rounds and task options (10 clients, 5 a round, 20
#: canaries, z = 0.5)
FAKE_SPEC = {
    "task": FAKE_TASK,
    "num_clients": 10,
    "clients_per_round": 5,
    "num_canaries": 20,
    "noise_multiplier": 0.5,
    "clip_norm": 1.0,
    "delta": 1e-5,
}


def task(**options):
    """Named by :data:`FAKE_TASK`; never called (the fake worker builds no Flower task)."""
    raise NotImplementedError("the fake engine builds no task")


def synthetic_run(seed: int, spec: AuditSpec, dim: int, *, noise_seed: int = 0):
    """Return ``(theta_0, [delta_1..delta_T], metadata list)`` of a Gaussian-mechanism run."""
    rng = np.random.default_rng(noise_seed)
    k, rounds = spec.num_canaries, spec.num_rounds
    seen = seen_mask(seed, k)
    family = resolve_canary_family(spec.canary_family, num_canaries=k, dim=dim)
    canaries = canary_vectors(seed, np.arange(k), dim, family=family)
    round_of = rng.integers(0, rounds, size=k)
    clip = spec.clip_norm or 1.0
    m = spec.clients_per_round
    theta0 = rng.normal(size=dim).astype(np.float32)
    deltas, meta = [], []
    for t in range(rounds):
        inserted = seen & (round_of == t)
        total = clip * canaries[inserted].sum(axis=0, dtype=np.float64)
        noise = rng.normal(scale=spec.noise_multiplier * clip, size=dim)
        deltas.append(((total + noise) / m).astype(np.float32))
        meta.append(
            {
                "clip_norm": clip,
                "cohort_size": m,
                "num_canaries_inserted": int(inserted.sum()),
                "num_failures": 0,
                "clipped_fraction": 0.0,
                "noise_stddev": spec.noise_multiplier * clip,
            }
        )
    return theta0, deltas, meta


def worker(payload: dict) -> None:
    import httpx

    spec = AuditSpec.model_validate(payload["spec"])
    dim = int(spec.task_options.get("dim", 500))
    pause = float(spec.task_options.get("round_seconds", 0.0))
    fail_at = int(spec.task_options.get("fail_at_round", 0))
    theta0, deltas, meta = synthetic_run(int(payload["seed"]), spec, dim)
    base = f"{payload['base_url']}/audits/{payload['audit_id']}"
    headers = {
        "Authorization": f"Bearer {payload['token']}",
        "Content-Type": "application/octet-stream",
    }
    ack_log = os.environ.get("FLAUDIT_TEST_ACK_LOG")
    with httpx.Client(timeout=30) as client:

        def put(path, vector, params=None):
            r = client.put(
                f"{base}/{path}",
                content=vector.astype("<f4").tobytes(),
                params=params,
                headers=headers,
            )
            r.raise_for_status()
            if ack_log:
                with open(ack_log, "a") as fh:
                    fh.write(json.dumps({"path": path, "status": r.status_code}) + "\n")
                    fh.flush()
                    os.fsync(fh.fileno())

        put("initial-model", theta0)
        theta = theta0.astype(np.float64)
        for t, (delta, m) in enumerate(zip(deltas, meta), start=1):
            time.sleep(pause)
            if t == fail_at:  # a careless engine error that even quotes the seed
                raise RuntimeError(f"synthetic failure at round {t} (seed {payload['seed']})")
            put(f"rounds/{t}", delta, m)
            theta += delta
        put("final-model", theta.astype(np.float32), {"accuracy": 0.5, "loss": 1.0})
