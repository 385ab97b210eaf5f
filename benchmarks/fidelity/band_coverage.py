"""Coverage of the f-DP picture's band when one release's seen scores share its noise scale
(issue #31).

One final model in the canaries' own coordinates: ``y = N(0, I_d)`` plus ``mu`` on the seen
canaries' columns (each of ``k`` canaries seen by a fair coin), final cosines ``y_j / ||y||``,
normal scores ``Phi^-1(F_d(cos))`` of the seen ones: what
:func:`flaudit.auditor.claims.tradeoff.tradeoff_picture` draws. The true trade-off curve
``beta(alpha) = P(Z_seen <= Phi^-1(1 - alpha))`` is estimated from all releases' seen scores
pooled; a release's band *covers* when it lies at or below that curve at every ``alpha`` of the
picture's grid at once (the band's promise: 95%, for independent scores). Rerun::

    PYTHONPATH=. .venv/bin/python -m benchmarks.fidelity.band_coverage --runs 1000
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy import special

from flaudit.auditor.claims.tradeoff import tradeoff_picture
from flaudit.auditor.estimators.null import null_probit

from ._common import clopper_pearson

CELLS = [
    (1000, 400, 1.0),
    (1000, 400, 3.0),
    (1000, 900, 3.0),
    (10_000, 2000, 3.0),
    (1000, 900, 7.5),
    (100_000, 10_000, 1.0),
]  # (d, k, mu)


def cell(d: int, k: int, mu: float, *, runs: int, seed: int = 0) -> dict:
    rng = np.random.default_rng([seed, d, k, int(mu * 100)])
    scores, bands = [], []
    for _ in range(runs):
        seen = rng.random(k) < 0.5
        y = rng.standard_normal(d)
        y[:k][seen] += mu
        z = null_probit(y[:k][seen] / np.linalg.norm(y), d)
        scores.append(z)
        bands.append(np.asarray(tradeoff_picture(z, claim_mu=None, mu_lo=None)["band"]))
    alpha = np.linspace(0.0, 1.0, 101)
    pooled = np.sort(np.concatenate(scores))
    truth = np.searchsorted(pooled, special.ndtri(1.0 - alpha), side="right") / pooled.size
    # the pooled estimate's own error (~1/sqrt(runs k/2)) is allowed for: a band must be below
    # the truth minus 3 of its standard errors to count as a miss
    slack = 3.0 * np.sqrt(truth * (1 - truth) / pooled.size)
    covered = sum(bool(np.all(b <= truth + slack)) for b in bands)
    return {"covered": covered, "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    args = ap.parse_args()
    print("| d | k | μ | band covers the true curve (promise 95%) |")
    print("|---|---|---|---|")
    t0 = time.time()
    for d, k, mu in CELLS:
        res = cell(d, k, mu, runs=args.runs)
        lo, hi = clopper_pearson(res["covered"], res["runs"])
        print(
            f"| {d} | {k} | {mu:g} | {100 * res['covered'] / res['runs']:.1f}% "
            f"[{100 * lo:.1f}, {100 * hi:.1f}] |",
            flush=True,
        )
    print(f"{args.runs} releases per cell in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
