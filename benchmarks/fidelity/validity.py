"""Validity of the lower bounds: how often does a 95% lower bound exceed the true epsilon?

Simulated Gaussian-mechanism audits with known epsilon (sensitivity 1, noise sigma): each of k
canaries is seen with probability 1/2, the seen ones are added to one release, unseen cosines
follow the exact null (flaudit.server.simulated_audit.gaussian_mechanism_scores). Per run we compute

* eps_lo with the FPR exact from the null CDF (final-model style): none / bonferroni / split,
* eps_lo with a Jeffreys bound on the unseen canaries (all-iterates style): none / bonferroni / split,
* the one-run bound (Steinke et al. Thm 3.1, Bonferroni over its grid),

and count the runs where the bound exceeds the true epsilon (dp-accounting, exact Gaussian).
A valid 95% bound exceeds it in at most 5% of runs; "consistent" means the count is within the
binomial limit that a correct 5% bound exceeds with probability <= 1e-3
(``_common.binomial_limit``); with 1400 runs it catches a bound that exceeds the truth in 8% of
runs with probability 0.94 (fewer runs are refused).

    .venv/bin/python -m benchmarks.fidelity.validity --reps 1400
"""

from __future__ import annotations

import argparse
import os
import sys

# Runnable by path too; one BLAS thread per process (shared machine). Before numpy is imported.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
import time  # noqa: E402

from benchmarks.fidelity._common import clopper_pearson, dump, rate_consistent_with  # noqa: E402
from flaudit.auditor.estimators import Bonferroni, NoCorrection, Split, epsilon_lower_bound
from flaudit.auditor.estimators.analytic import (
    gaussian_epsilon_for_sigma,
    gaussian_sigma_for_epsilon,
)
from flaudit.auditor.estimators.one_run import one_run_lower_bound  # noqa: E402
from flaudit.server.simulated_audit import gaussian_mechanism_scores  # noqa: E402

BOUNDS = (
    "exact_null/none",
    "exact_null/bonferroni",
    "exact_null/split",
    "jeffreys/none",
    "jeffreys/bonferroni",
    "jeffreys/split",
    "one_run/bonferroni",
)
VALID = {b for b in BOUNDS if not b.endswith("/none")}


def run_bounds(
    sigma: float,
    d: int,
    k: int,
    delta: float,
    seed: int,
    *,
    one_run: bool = True,
    family: str | None = None,
    bounds=BOUNDS,
) -> dict:
    """The lower bounds named in ``bounds`` (default all) for one simulated audit
    (``family=None``: orthogonal where k <= d)."""
    scores, seen = gaussian_mechanism_scores(sigma, d, k, seed=seed, family=family)
    s, u = scores[seen], scores[~seen]
    out = {}
    corrections = {"none": NoCorrection(), "bonferroni": Bonferroni(), "split": Split(seed=seed)}
    for name, corr in corrections.items():
        if f"exact_null/{name}" in bounds:
            out[f"exact_null/{name}"] = epsilon_lower_bound(
                s, d=d, delta=delta, correction=corr
            ).epsilon
        if f"jeffreys/{name}" in bounds:
            out[f"jeffreys/{name}"] = epsilon_lower_bound(
                s, u, delta=delta, correction=corr
            ).epsilon
    if one_run and "one_run/bonferroni" in bounds:
        out["one_run/bonferroni"] = one_run_lower_bound(scores, seen, delta=delta).epsilon
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--reps", type=int, default=1400)
    p.add_argument(
        "--epsilons",
        type=float,
        nargs="+",
        default=[0.0, 0.5, 2.0, 8.0],
        help="true epsilons (0 means sigma = 1000: no measurable signal)",
    )
    p.add_argument(
        "--configs", nargs="+", default=["10000:200", "10000:1000", "100000:1000"], help="d:k pairs"
    )
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=6)
    p.add_argument(
        "--family",
        choices=["orthogonal", "gaussian"],
        default=None,
        help="canary family (default: the audit default, orthogonal where k <= d)",
    )
    args = p.parse_args(argv)
    rows = []
    print(f"{'eps':>6} {'d':>7} {'k':>5} | " + " ".join(f"{b:>22}" for b in BOUNDS), flush=True)
    for eps in args.epsilons:
        sigma = 1000.0 if eps == 0 else gaussian_sigma_for_epsilon(eps, args.delta)
        true_eps = gaussian_epsilon_for_sigma(sigma, args.delta)
        for cfg in args.configs:
            d, k = (int(float(x)) for x in cfg.split(":"))
            t0 = time.perf_counter()
            exceed = {b: 0 for b in BOUNDS}
            means = {b: 0.0 for b in BOUNDS}
            for r in range(args.reps):
                out = run_bounds(
                    sigma,
                    d,
                    k,
                    args.delta,
                    args.seed * 10**7 + hash((eps, d, k)) % 10**6 * 10 + r,
                    family=args.family,
                )
                for b in BOUNDS:
                    exceed[b] += out[b] > true_eps
                    means[b] += out[b] / args.reps
            row = {
                "true_epsilon": true_eps,
                "sigma": sigma,
                "d": d,
                "k": k,
                "reps": args.reps,
                "seconds": time.perf_counter() - t0,
                "bounds": {},
            }
            for b in BOUNDS:
                lo, hi = clopper_pearson(exceed[b], args.reps)
                row["bounds"][b] = {
                    "exceed": exceed[b],
                    "rate": exceed[b] / args.reps,
                    "ci95": [lo, hi],
                    "mean_bound": means[b],
                    "valid_mode": b in VALID,
                    "consistent_with_5pct": rate_consistent_with(exceed[b], args.reps, 0.05),
                }
            rows.append(row)
            cells = " ".join(
                f"{exceed[b] / args.reps:>8.3f} (mean {means[b]:>5.2f})" for b in BOUNDS
            )
            print(f"{true_eps:>6.3f} {d:>7} {k:>5} | {cells} [{row['seconds']:.0f} s]", flush=True)
    bad = [
        (r["true_epsilon"], r["d"], r["k"], b)
        for r in rows
        for b, v in r["bounds"].items()
        if v["valid_mode"] and not v["consistent_with_5pct"]
    ]
    print("valid modes consistent with <= 5% everywhere:", not bad, bad if bad else "")
    print(dump({"delta": args.delta, "family": args.family or "default", "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
