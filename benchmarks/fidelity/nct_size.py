"""Size of the exact claim test where the noncentrality is large against the scale's degrees of
freedom (issue #31): the cells where the former quadrature refuted a true claim too often.

One release of ``c = 5000`` seen canaries, ``R = (delta + N(0, 1)) / sqrt(chi2_nu / nu)`` with
``delta = sqrt(c) * mu``, tested at its own claim ``mu`` with the public API,
``normal_score_test(RoundSums([R], [c], nu), claim_mu=mu)``, rejecting when its p-value is at
most ``alpha``. Printed per cell: the rejection rate (the size; target ``alpha``), its 95%
Clopper-Pearson interval, and whether the data show the size above ``alpha`` (one-sided exact
binomial test at 95%), and beside it the share of the same draws above the law's true
``1 - alpha`` quantile from scipy's ``nct.isf`` (an independent route, reliable in the bulk):
the Monte Carlo error of the draws themselves, which the test's rate should match. Rerun (about
1 minute per cell of 20,000 runs on 1 core)::

    PYTHONPATH=. .venv/bin/python -m benchmarks.fidelity.nct_size --runs 20000
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from scipy import stats

from flaudit.auditor.claims import RoundSums, normal_score_test

from ._common import clopper_pearson, rate_consistent_with

#: (nu, delta): the issue's cells.
CELLS = [(30, 400.0), (30, 1000.0), (30, 3000.0), (100, 3000.0), (300, 3000.0)]
SEEN = 5000


def cell(nu: int, delta: float, *, runs: int, alpha: float, seed: int = 0) -> dict:
    rng = np.random.default_rng([seed, nu, int(delta)])
    mu = delta / math.sqrt(SEEN)
    r = (delta + rng.standard_normal(runs)) / np.sqrt(rng.chisquare(nu, runs) / nu)
    rejected = sum(
        normal_score_test(RoundSums([v], [SEEN], nu), claim_mu=mu).p_value <= alpha for v in r
    )
    lo, hi = clopper_pearson(int(rejected), runs)
    above = float(np.mean(r > stats.nct.isf(alpha, nu, delta)))
    return {
        "nu": nu,
        "delta": delta,
        "mu": mu,
        "runs": runs,
        "size": rejected / runs,
        "ci": (lo, hi),
        "ok": rate_consistent_with(int(rejected), runs, alpha),
        "above_true_quantile": above,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20_000)
    ap.add_argument("--alpha", type=float, default=0.05)
    args = ap.parse_args()
    print(
        "| ν | δ | size of the nominal 5% test | 95% interval | above 5%? "
        "| same draws above the true 95% quantile |"
    )
    print("|---|---|---|---|---|---|")
    t0 = time.time()
    for nu, delta in CELLS:
        res = cell(nu, delta, runs=args.runs, alpha=args.alpha)
        lo, hi = res["ci"]
        print(
            f"| {nu} | {delta:g} | {100 * res['size']:.2f}% | [{100 * lo:.2f}, {100 * hi:.2f}] "
            f"| {'no' if res['ok'] else 'YES'} | {100 * res['above_true_quantile']:.2f}% |",
            flush=True,
        )
    print(f"{args.runs} runs per cell in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
