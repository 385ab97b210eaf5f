"""The audit design's promise when the noise scale has few degrees of freedom (issue #31).

For a spec and a model size d, the design's ``s*`` with ``dim=d`` (``nu = d - k``) and without
(the scale taken as known), each checked by simulating the exact known-rounds test there:
``T`` rounds of ``c = N / T`` seen participations, ``R_t = (sqrt(c)/s + N(0, 1)) /
sqrt(chi2_nu / nu)``, each mapped to its exact normal score under the claim (``z = 1``) and
summed, rejecting above ``z_{1-a}`` at the design's final level. Printed: how often each ``s*``
is caught (the promise: 95%). Rerun (seconds)::

    PYTHONPATH=. .venv/bin/python -m benchmarks.fidelity.design_dof --runs 4000
"""

from __future__ import annotations

import argparse
import math
from types import SimpleNamespace

import numpy as np
from scipy import special

from flaudit.auditor.claims import audit_design
from flaudit.auditor.claims.alarm import look_level
from flaudit.auditor.claims.nct import nct_normal_score
from flaudit.auditor.claims.tiers import AlarmTest

CELLS = [(900, 1000, 1), (900, 1000, 4), (400, 1000, 1), (1000, 10_000, 10)]  # (k, d, T)


def caught(
    s: float, *, nu: float, per_round: float, rounds: int, crit: float, runs: int, rng
) -> float:
    r = (math.sqrt(per_round) / s + rng.standard_normal((runs, rounds))) / np.sqrt(
        rng.chisquare(nu, (runs, rounds)) / nu
    )
    y = nct_normal_score(r, nu, math.sqrt(per_round))
    return float(np.mean(y.sum(axis=1) / math.sqrt(rounds) > crit))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4000)
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    print("| k | d | T | s* with d | caught | s* (scale known) | caught |")
    print("|---|---|---|---|---|---|---|")
    for k, d, rounds in CELLS:
        spec = SimpleNamespace(
            num_canaries=k,
            accounted_noise_multiplier=1.0,
            canary_repeats=1,
            num_rounds=rounds,
            delta=1e-6,
        )
        new, old = audit_design(spec, dim=d), audit_design(spec)
        per_round = new.expected_seen_participations / rounds
        crit = float(
            special.ndtri(
                1 - look_level(AlarmTest.known_rounds_normal_scores, rounds + 1, rounds + 1)
            )
        )
        kw = dict(nu=d - k, per_round=per_round, rounds=rounds, crit=crit, runs=args.runs, rng=rng)
        a = caught(new.detectable_noise_scale, **kw)
        b = caught(old.detectable_noise_scale, **kw)
        print(
            f"| {k} | {d} | {rounds} | {new.detectable_noise_scale:.3f} | {100 * a:.1f}% "
            f"| {old.detectable_noise_scale:.3f} | {100 * b:.1f}% |",
            flush=True,
        )


if __name__ == "__main__":
    main()
