"""Benchmark: one round through the service's ingest route, end to end, at real model sizes.

What a ServerApp's round costs the service (``PUT /audits/{id}/rounds/{t}``: read and check the
float32 body, score all k canaries, store the round and its statistics in one transaction, then
acknowledge), timed from the client over loopback against a real ``flaudit serve`` (SQLite in a
temp dir). The audit is an external one (``"engine": "external"``), so the rounds come from this
script, as from a user's own ServerApp; its canaries come from ``GET
/audits/{id}/rounds/{t}/canaries`` (timed too: the wrapper's per-round fetch). Each round's
delta is fresh float32 noise plus the served canaries.

    .venv/bin/python benchmarks/service_ingest.py                       # d = 1.2M, k = 2000
    .venv/bin/python benchmarks/service_ingest.py --dim 4100000 --canaries 10000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _service import AUTH, running_service  # noqa: E402


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _put(client: httpx.Client, path: str, vector: np.ndarray, token: dict, **params):
    body = np.ascontiguousarray(vector, dtype="<f4").tobytes()
    response = client.put(
        path,
        content=body,
        params=params,
        headers={**token, "Content-Type": "application/octet-stream"},
    )
    response.raise_for_status()
    return response


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dim", type=float, default=1.2e6)
    parser.add_argument("--canaries", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=10, help="rounds sent (and timed)")
    parser.add_argument(
        "--claim-rounds",
        type=int,
        default=500,
        help="num_rounds of the run's claim: k/2 seen canaries spread over them "
        "(500, as EMNIST in Andrew et al.: ~2 canaries per round at k = 2000)",
    )
    args = parser.parse_args(argv)
    dim, k, rounds = int(args.dim), args.canaries, args.rounds
    if rounds > args.claim_rounds:
        parser.error("--rounds must not exceed --claim-rounds")
    rng = np.random.default_rng(0)
    with running_service() as (url, _, service), httpx.Client(base_url=url, timeout=120) as client:
        created = client.post(
            "/audits",
            headers=AUTH,
            json={
                "name": "service-ingest-bench",
                "engine": "external",
                "num_canaries": k,
                "canary_repeats": 1,
                "delta": 1e-5,
                "max_canary_fraction": 1.0,
            },
        )
        if created.status_code != 201:
            raise SystemExit(f"POST /audits: {created.status_code} {created.text}")
        audit_id = created.json()["id"]
        token = {"Authorization": f"Bearer {created.json()['environment']['FLAUDIT_RUN_TOKEN']}"}
        claim = {
            "noise_multiplier": 1.0,
            "clip_norm": 1.0,
            "num_rounds": args.claim_rounds,
            "num_clients": 100 * k,
            "clients_per_round": 100,
        }
        client.put(f"/audits/{audit_id}/claim", json=claim, headers=token).raise_for_status()
        _put(client, f"/audits/{audit_id}/initial-model", np.zeros(dim), token)
        fetch, ingest, cpu = [], [], []
        for t in range(1, rounds + 1):
            start = time.perf_counter()
            served = client.get(f"/audits/{audit_id}/rounds/{t}/canaries", headers=token)
            served.raise_for_status()
            fetch.append(time.perf_counter() - start)
            count = int(served.headers["X-Canary-Count"])
            canaries = np.frombuffer(served.content, "<f4").reshape(count, dim)
            delta = (
                rng.standard_normal(dim, dtype=np.float32) / np.float32(np.sqrt(dim))
                + canaries.sum(axis=0) / 100
            )
            start, start_cpu = time.perf_counter(), _cpu_seconds(service.pid)
            _put(
                client,
                f"/audits/{audit_id}/rounds/{t}",
                delta,
                token,
                clip_norm=1.0,
                cohort_size=100,
                num_failures=0,
                num_canaries_inserted=count,
            )
            ingest.append(time.perf_counter() - start)
            cpu.append(_cpu_seconds(service.pid) - start_cpu)
        audit = client.get(f"/audits/{audit_id}").json()
    result = {
        "d": dim,
        "k": k,
        "rounds": rounds,
        "body_mib": dim * 4 / 2**20,
        "ingest_seconds": ingest,
        "median_ingest_seconds": statistics.median(ingest),
        "service_cpu_seconds": cpu,
        "median_service_cpu_seconds": statistics.median(cpu),
        "claim_rounds": args.claim_rounds,
        "canary_fetch_seconds": fetch,
        "median_canary_fetch_seconds": statistics.median(fetch),
        "rounds_stored": audit["progress"]["round"],
    }
    print(json.dumps(result))
    print(
        f"d = {dim}, k = {k}: PUT round (body {result['body_mib']:.1f} MiB) median "
        f"{result['median_ingest_seconds']:.3f} s (min {min(ingest):.3f}, max {max(ingest):.3f}) "
        f"over {rounds} rounds, service CPU {result['median_service_cpu_seconds']:.3f} s per round; "
        f"GET round canaries median "
        f"{result['median_canary_fetch_seconds']:.3f} s; rounds stored {result['rounds_stored']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
