"""Gaussian-DP lower bound in the Table 2 setting (Gaussian mechanism, d = 10^6, k = 1000 canaries
all inserted, delta = 10^-6): power and validity of mu_lo beside today's epsilon_lo.

For each true epsilon (and a row with nothing inserted: true epsilon 0), ``--reps`` independent
releases ``rho = sum_j c_j + N(0, sigma^2 I)`` are simulated exactly in distribution
(:func:`flaudit.auditor.claims.gaussian.gaussian_mechanism_cosines`), and on the same cosines:

* ``gdp``: :func:`flaudit.auditor.estimators.gdp_lower_bound` (exact null FPR, Clopper-Pearson FNR,
  GDP_BONFERRONI: two thresholds, 95%), read as the epsilon at delta of the mu_lo-Gaussian
  mechanism;
* ``eps_lo``: :func:`flaudit.auditor.estimators.epsilon_lower_bound` (Bonferroni, 95%), today's bound;
* ``normal scores``: ``mu_lo`` of the exact normal-score test on the same cosines
  (:func:`flaudit.auditor.claims.normal_scores.final_model_rounds`, the release's noise scale of
  ``d - k`` degrees of freedom), the verdict's measured bound, read as epsilon at delta;
* ``claim test``: :func:`flaudit.auditor.claims.claim_test` against the mechanism's own claim
  ``mu = 1/sigma`` (a mechanism exactly on its claim): its rejection rate at 5% is the
  false-alarm rate.

Exceedance = share of runs whose bound exceeds the true epsilon. Rerun:

    .venv/bin/python -m benchmarks.fidelity.gdp_table2 --reps 200
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
import time  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.fidelity._common import clopper_pearson  # noqa: E402
from flaudit.auditor.claims.curve_tests import claim_test
from flaudit.auditor.claims.curves import GaussianDPClaim
from flaudit.auditor.claims.gaussian import gaussian_mechanism_cosines  # noqa: E402
from flaudit.auditor.claims.normal_scores import final_model_rounds, normal_score_test  # noqa: E402
from flaudit.auditor.estimators import epsilon_lower_bound  # noqa: E402
from flaudit.auditor.estimators.analytic import gaussian_sigma_for_epsilon  # noqa: E402
from flaudit.auditor.estimators.gdp import gdp_epsilon, gdp_lower_bound
from flaudit.auditor.estimators.lower_bound import Bonferroni  # noqa: E402
from flaudit.server.simulated_audit import sample_null_cosines  # noqa: E402

TARGETS = {1.0: 0.6, 3.0: 2.5, 10.0: 9.2}


def run_row(true_eps: float, *, d: int, k: int, delta: float, reps: int, seed: int) -> dict:
    sigma = gaussian_sigma_for_epsilon(true_eps, delta) if true_eps > 0 else None
    claim = GaussianDPClaim(1.0 / sigma) if sigma else GaussianDPClaim(0.0)
    gdp, eps_lo, normal, rejected = [], [], [], 0
    for rep in range(reps):
        if sigma is None:
            g = sample_null_cosines(d, k, rng=np.random.default_rng([seed, rep]))
        else:
            g = gaussian_mechanism_cosines(sigma, d, k, seed=seed * 100_000 + rep)
        gdp.append(gdp_lower_bound(g, d=d, delta=delta).epsilon)
        eps_lo.append(epsilon_lower_bound(g, d=d, delta=delta, correction=Bonferroni()).epsilon)
        rejected += claim_test(g, d=d, claim=claim).rejected(0.05)
        mu_lo = normal_score_test(final_model_rounds(g, d, dof=d - k), claim_mu=claim.mu).mu_lo(
            0.05
        )
        normal.append(gdp_epsilon(mu_lo, delta))
    gdp, eps_lo, normal = np.array(gdp), np.array(eps_lo), np.array(normal)
    tol = 1e-9
    return {
        "true_eps": true_eps,
        "gdp_mean": float(gdp.mean()),
        "gdp_exceed": int(np.sum(gdp > true_eps + tol)),
        "eps_lo_mean": float(eps_lo.mean()),
        "eps_lo_exceed": int(np.sum(eps_lo > true_eps + tol)),
        "claim_rejected": rejected,
        "normal_mean": float(normal.mean()),
        "normal_exceed": int(np.sum(normal > true_eps + tol)),
        "reps": reps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--d", type=int, default=10**6)
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--delta", type=float, default=1e-6)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(
        f"Table 2 setting: Gaussian mechanism, d={args.d}, k={args.k} (all inserted), "
        f"delta={args.delta:g}, {args.reps} runs per row; 95% bounds, GDP_BONFERRONI (two "
        "thresholds), exact null FPR"
    )
    print(
        "| true ε | mean ε from μ_lo (GDP, Clopper–Pearson) | target | exceed. (95% CI) | "
        "mean ε_lo (today, Jeffreys) | exceed. | claim test μ=1/σ rejects (5%) | "
        "mean ε from normal-score μ_lo | exceed. |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    t0 = time.time()
    for i, eps in enumerate((0.0, 1.0, 3.0, 10.0)):
        row = run_row(eps, d=args.d, k=args.k, delta=args.delta, reps=args.reps, seed=args.seed + i)
        n = row["reps"]
        lo, hi = clopper_pearson(row["gdp_exceed"], n)
        target = TARGETS.get(eps)
        print(
            f"| {eps:g} | {row['gdp_mean']:.3f} | {f'≥ {target:g}' if target else '—'} | "
            f"{row['gdp_exceed']}/{n} ({lo:.1%}–{hi:.1%}) | {row['eps_lo_mean']:.3f} | "
            f"{row['eps_lo_exceed']}/{n} | {row['claim_rejected']}/{n} | "
            f"{row['normal_mean']:.3f} | {row['normal_exceed']}/{n} |",
            flush=True,
        )
    print(f"wall time {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
