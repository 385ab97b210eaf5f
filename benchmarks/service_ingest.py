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

Capacity (issue #41): ``--audits N --interval S`` runs N external audits at once, each on its own
thread sending a round every S seconds (starts staggered over the first S seconds), and reports
whether every round was acknowledged before the next one of its audit was due, the latency of a
round (canary fetch + PUT), and the service's CPU seconds per round over the whole run (so the
idle time between rounds and the background work are in it too)::

    .venv/bin/python benchmarks/service_ingest.py --dim 1e6 --audits 4 --interval 30 --rounds 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
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


def _peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM, Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


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


def _external_audit(client: httpx.Client, k: int, dim: int, claim_rounds: int) -> tuple[str, dict]:
    """A new external audit with its claim and a zero initial model: ``(id, run token header)``."""
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
        "num_rounds": claim_rounds,
        "num_clients": 100 * k,
        "clients_per_round": 100,
    }
    client.put(f"/audits/{audit_id}/claim", json=claim, headers=token).raise_for_status()
    _put(client, f"/audits/{audit_id}/initial-model", np.zeros(dim, dtype=np.float32), token)
    return audit_id, token


def _fetch(client: httpx.Client, audit_id: str, token: dict, t: int, dim: int):
    """The round's canaries as a ServerApp fetches them: ``(seconds, (count, dim) array)``."""
    start = time.perf_counter()
    served = client.get(f"/audits/{audit_id}/rounds/{t}/canaries", headers=token)
    served.raise_for_status()
    fetched = time.perf_counter() - start
    count = int(served.headers["X-Canary-Count"])
    return fetched, np.frombuffer(served.content, "<f4").reshape(count, dim)


def _put_round(client, audit_id: str, token: dict, t: int, noise, canaries) -> float:
    """PUT round ``t`` = noise + the canaries' sum / 100; the seconds it took."""
    delta = noise + canaries.sum(axis=0) / 100
    start = time.perf_counter()
    _put(
        client,
        f"/audits/{audit_id}/rounds/{t}",
        delta,
        token,
        clip_norm=1.0,
        cohort_size=100,
        num_failures=0,
        num_canaries_inserted=canaries.shape[0],
    )
    return time.perf_counter() - start


def _concurrent(args, dim: int, k: int) -> int:
    """``--audits`` audits at once, a round each every ``--interval`` seconds (module docstring)."""
    audits, interval, rounds = args.audits, args.interval, args.rounds
    load = [os.getloadavg()[0]]
    with running_service() as (url, _, service), httpx.Client(base_url=url, timeout=300) as setup:
        ids = [_external_audit(setup, k, dim, args.claim_rounds) for _ in range(audits)]
        lock = threading.Lock()
        results: list[dict] = []
        errors: list[str] = []
        begin = time.monotonic() + 1.0
        cpu0, client_cpu0 = _cpu_seconds(service.pid), time.process_time()

        def drive(index: int, audit_id: str, token: dict) -> None:
            noise = np.random.default_rng(index).standard_normal(dim, dtype=np.float32)
            noise /= np.float32(np.sqrt(dim))
            with httpx.Client(base_url=url, timeout=300) as client:
                for t in range(1, rounds + 1):
                    due = begin + index * interval / audits + (t - 1) * interval
                    time.sleep(max(0.0, due - time.monotonic()))
                    started = time.monotonic()
                    try:
                        fetched, canaries = _fetch(client, audit_id, token, t, dim)
                        put = _put_round(client, audit_id, token, t, noise, canaries)
                    except httpx.HTTPError as exc:
                        with lock:
                            errors.append(type(exc).__name__)
                        return
                    done = time.monotonic()
                    with lock:
                        results.append(
                            {
                                "audit": index,
                                "t": t,
                                "late_start_s": started - due,
                                "fetch_s": fetched,
                                "put_s": put,
                                "round_s": done - started,
                                "kept_up": done <= due + interval,
                            }
                        )
                        load.append(os.getloadavg()[0])

        threads = [
            threading.Thread(target=drive, args=(i, a, tok)) for i, (a, tok) in enumerate(ids)
        ]
        wall0 = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.monotonic() - wall0
        service_cpu = _cpu_seconds(service.pid) - cpu0
        client_cpu = time.process_time() - client_cpu0
        peak_rss = _peak_rss_mib(service.pid)
        stored = [setup.get(f"/audits/{a}").json()["progress"]["round"] for a, _ in ids]
    per_round = sorted(r["round_s"] for r in results)
    n = max(len(results), 1)
    result = {
        "d": dim,
        "k": k,
        "audits": audits,
        "interval_s": interval,
        "rounds_per_audit": rounds,
        "rounds_done": len(results),
        "errors": errors,
        "rounds_stored": stored,
        "all_kept_up": len(results) == audits * rounds and all(r["kept_up"] for r in results),
        "round_seconds_median": statistics.median(per_round) if per_round else None,
        "round_seconds_max": max(per_round) if per_round else None,
        "put_seconds_median": statistics.median(r["put_s"] for r in results) if results else None,
        "fetch_seconds_median": (
            statistics.median(r["fetch_s"] for r in results) if results else None
        ),
        "service_cpu_seconds": service_cpu,
        "service_cpu_seconds_per_round": service_cpu / n,
        "client_cpu_seconds_per_round": client_cpu / n,
        "service_peak_rss_mib": peak_rss,
        "wall_seconds": wall,
        "service_cpu_share_of_2_cores": service_cpu / (2 * wall),
        "loadavg_1min": [round(min(load), 2), round(max(load), 2)],
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result))
    print(
        f"d = {dim}, k = {k}: {audits} audits, a round each every {interval:g} s, "
        f"{len(results)}/{audits * rounds} rounds done, kept up: {result['all_kept_up']}; "
        f"round (fetch + PUT) median {result['round_seconds_median']:.3f} s, max "
        f"{result['round_seconds_max']:.3f} s; service CPU {result['service_cpu_seconds_per_round']:.3f} "
        f"s per round ({100 * result['service_cpu_share_of_2_cores']:.0f}% of 2 cores over "
        f"{wall:.0f} s); service peak RSS {peak_rss:.0f} MiB; "
        f"load {result['loadavg_1min'][0]}-{result['loadavg_1min'][1]}"
    )
    return 0 if not errors else 1


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
    parser.add_argument("--audits", type=int, default=1, help="concurrent audits (capacity)")
    parser.add_argument(
        "--interval",
        type=float,
        default=0.0,
        help="seconds between an audit's rounds (0: back to back, one audit)",
    )
    args = parser.parse_args(argv)
    dim, k, rounds = int(args.dim), args.canaries, args.rounds
    if rounds > args.claim_rounds:
        parser.error("--rounds must not exceed --claim-rounds")
    if args.audits > 1 or args.interval > 0:
        return _concurrent(args, dim, k)
    rng = np.random.default_rng(0)
    with running_service() as (url, _, service), httpx.Client(base_url=url, timeout=120) as client:
        audit_id, token = _external_audit(client, k, dim, args.claim_rounds)
        fetch, ingest, cpu, fetch_cpu = [], [], [], []
        for t in range(1, rounds + 1):
            start_cpu = _cpu_seconds(service.pid)
            fetched, canaries = _fetch(client, audit_id, token, t, dim)
            fetch.append(fetched)
            fetch_cpu.append(_cpu_seconds(service.pid) - start_cpu)
            noise = rng.standard_normal(dim, dtype=np.float32) / np.float32(np.sqrt(dim))
            start_cpu = _cpu_seconds(service.pid)
            ingest.append(_put_round(client, audit_id, token, t, noise, canaries))
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
        "canary_fetch_service_cpu_seconds": fetch_cpu,
        "median_canary_fetch_service_cpu_seconds": statistics.median(fetch_cpu),
        "rounds_stored": audit["progress"]["round"],
    }
    print(json.dumps(result))
    print(
        f"d = {dim}, k = {k}: PUT round (body {result['body_mib']:.1f} MiB) median "
        f"{result['median_ingest_seconds']:.3f} s (min {min(ingest):.3f}, max {max(ingest):.3f}) "
        f"over {rounds} rounds, service CPU {result['median_service_cpu_seconds']:.3f} s per round; "
        f"GET round canaries median "
        f"{result['median_canary_fetch_seconds']:.3f} s (service CPU "
        f"{result['median_canary_fetch_service_cpu_seconds']:.3f} s); "
        f"rounds stored {result['rounds_stored']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
