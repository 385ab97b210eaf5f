"""Validity of the sequential (MMD betting) lower bound at a size CI cannot afford.

Binary randomized response is exactly eps-DP and tight (eps = 1 here); the lower bound over the
grid 0.5, 1, 1.5, 2 (Bonferroni over the grid) exceeds eps = 1 only by a family-wise error, so a
valid 95% bound does so in at most 5% of runs. ``--runs 1400``: the verdict is the binomial limit
(<= 96) that a correct bound exceeds with probability 9.7e-4 and one that exceeds the truth in 8%
of runs with probability 0.94 (tests/auditor/test_sequential.py keeps a 30-run smoke check of
the same setting, and checks the test's type-I error at 1400 runs).

    PYTHONPATH=. python -m benchmarks.fidelity.sequential_validity --runs 1400
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from flaudit.auditor.estimators.sequential import sequential_epsilon_lower_bound

from ._common import binomial_limit, clopper_pearson


def randomized_response(eps: float, n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Outputs of binary randomized response on neighbours 1 and 0 (exactly eps-DP, tight)."""
    p = math.exp(eps) / (1.0 + math.exp(eps))
    return (rng.random(n) < p).astype(float), (rng.random(n) < 1.0 - p).astype(float)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1400)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1010)
    args = ap.parse_args(argv)
    check = binomial_limit(args.runs, 0.05, false_fail=1e-3, against=0.08)
    rng = np.random.default_rng(args.seed)
    start, over = time.time(), 0
    for _ in range(args.runs):
        x, y = randomized_response(1.0, args.steps, rng)
        res = sequential_epsilon_lower_bound(
            x, y, delta=1e-5, grid=[0.5, 1.0, 1.5, 2.0], bandwidth=0.1, max_terms=100
        )
        over += res.epsilon > 1.0
    lo, hi = clopper_pearson(over, args.runs)
    print(
        f"sequential lower bound above eps = 1: {over} of {args.runs} ({over / args.runs:.1%}, "
        f"95% CI {lo:.1%}-{hi:.1%}); check {check}: {'pass' if check.passes(over) else 'FAIL'}; "
        f"{time.time() - start:.0f} s"
    )
    return 0 if check.passes(over) else 1


if __name__ == "__main__":
    raise SystemExit(main())
