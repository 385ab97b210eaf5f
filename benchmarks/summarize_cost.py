"""Cost of `flaudit.auditor.claims.summarize` per call (k canaries), as the service calls it.

Rerun: .venv/bin/python benchmarks/summarize_cost.py [--k 1000] [--repeats 3]
Prints the best of --repeats wall times for each call at d = 10^6 and d = 500 (exact null).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from flaudit.auditor.claims import AuditLook, summarize

CALLS = [
    ("per round: max_cosines only", dict(max=True)),
    ("per round + one_run=True (what the service does)", dict(max=True, one_run=True)),
    ("end: both statistics", dict(max=True, final=True)),
    ("end: both + one-run", dict(max=True, final=True, one_run=True)),
    (
        "end: both + one-run + bootstrap=200",
        dict(max=True, final=True, one_run=True, bootstrap=200),
    ),
    ("per round + known-rounds scores + claim tests (GDP, Poisson)", dict(max=True, known=True)),
    ("per round + known-rounds + claims + one_run", dict(max=True, known=True, one_run=True)),
    (
        "end: all statistics + claims + one-run",
        dict(max=True, final=True, known=True, one_run=True),
    ),
]


def _inputs(d: int, k: int):
    rng = np.random.default_rng(0)
    seen = rng.random(k) < 0.5
    final = rng.normal(0, d**-0.5, k) + seen / (1.54 * d**0.5)
    maxc = rng.normal(3, 1, k) / d**0.5 + seen * 0.5 / d**0.5
    known = rng.normal(0, 1, k) + seen * 1.0
    return seen, final, maxc, known


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    dims = (10**6, 500)
    from flaudit.auditor.claims.curves import audit_claims
    from flaudit.auditor.spec import AuditSpec

    claims = audit_claims(AuditSpec(num_canaries=args.k, num_clients=10 * args.k))
    rows = {name: [] for name, _ in CALLS}
    for d in dims:
        seen, final, maxc, known = _inputs(d, args.k)
        summarize(AuditLook(seen=seen, dim=d, delta=1e-6, max_cosines=maxc))  # warm imports
        for name, opts in CALLS:
            best = float("inf")
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                summarize(
                    AuditLook(
                        seen=seen,
                        dim=d,
                        delta=1e-6,
                        max_cosines=maxc,
                        final_cosines=final if opts.get("final") else None,
                        one_run=opts.get("one_run", False),
                        bootstrap=opts.get("bootstrap", 0),
                        known_rounds_scores=known if opts.get("known") else None,
                        claims=claims if opts.get("known") else None,
                    )
                )
                best = min(best, time.perf_counter() - t0)
            rows[name].append(best)
    print(f"summarize cost, k = {args.k}, best of {args.repeats}")
    print("| call | d = 10^6 | d = 500 (exact null) |\n|---|---|---|")
    for name, times in rows.items():
        cells = " | ".join(f"{t * 1000:.0f} ms" if t < 1 else f"{t:.2f} s" for t in times)
        print(f"| {name} | {cells} |")


if __name__ == "__main__":
    main()
