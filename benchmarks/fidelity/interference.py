"""Interference (Keinan et al. 2025): epsilon-estimate bias as k/d grows, per canary family.

All k canaries are inserted into one release rho = sum_j c_j + N(0, sigma^2 I_d) (Andrew et al.
Alg. 1, exact projected simulation flaudit.auditor.claims.gaussian.gaussian_mechanism_cosines); the estimate is
the final-model two-Gaussian epsilon with variance 1/d (Table 2's) and with the fitted variance.
Bias = mean estimate / analytic epsilon - 1. The "predicted" column is the closed-form route:
the audit measures the effective noise sigma_eff = sqrt(sigma^2 + k/d)
(flaudit.auditor.estimators.interference), so the predicted bias is eps(sigma_eff) / eps(sigma) - 1
for iid (gaussian) canaries and 0 for the orthogonal family (exactly orthonormal canaries,
null-standardized statistic).

``--simulator`` adds the same question through the DP-FedAvg simulator
(flaudit.server.simulated_audit.simulate_dpfedavg_audit): one round, every seen canary inserted, silent real
clients (zero updates), noise multiplier z: each seen canary faces the Gaussian mechanism at
sigma = z, so the final-model estimate (null variance) should be eps(z).

    .venv/bin/python -m benchmarks.fidelity.interference --reps 50
    .venv/bin/python -m benchmarks.fidelity.interference --epsilons 10 --dims 20000 \
        --ratios 0.001 0.05 0.5 --families gaussian orthogonal --max-k 10000 --simulator --reps 20
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

import numpy as np  # noqa: E402

from benchmarks.fidelity._common import dump  # noqa: E402
from flaudit.auditor.claims.gaussian import gaussian_mechanism_cosines  # noqa: E402
from flaudit.auditor.estimators import final_model_epsilon  # noqa: E402
from flaudit.auditor.estimators.analytic import (
    gaussian_epsilon_for_sigma,
    gaussian_sigma_for_epsilon,
)
from flaudit.auditor.estimators.interference import effective_noise_multiplier, interference_warning
from flaudit.auditor.results import VarianceTreatment  # noqa: E402

RATIOS = (0.001, 0.003, 0.01, 0.03, 0.1)


def measure(
    sigma: float, d: int, k: int, delta: float, reps: int, seed: int, family: str = "gaussian"
) -> dict:
    """Mean/sem of both estimates over ``reps`` simulated audits."""
    null_var, fitted = [], []
    for r in range(reps):
        g = gaussian_mechanism_cosines(sigma, d, k, seed=seed + r, family=family)
        null_var.append(final_model_epsilon(g, d, delta, variance=VarianceTreatment.null).epsilon)
        fitted.append(final_model_epsilon(g, d, delta, variance=VarianceTreatment.fitted).epsilon)
    a, b = np.asarray(null_var), np.asarray(fitted)
    return {
        "null_mean": float(a.mean()),
        "null_sem": float(a.std(ddof=1) / np.sqrt(reps)),
        "fitted_mean": float(b.mean()),
        "fitted_sem": float(b.std(ddof=1) / np.sqrt(reps)),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 3.0, 10.0, 30.0])
    p.add_argument("--dims", type=int, nargs="+", default=[20_000, 100_000])
    p.add_argument("--ratios", type=float, nargs="+", default=list(RATIOS))
    p.add_argument(
        "--max-k", type=int, default=3000, help="skip cells with more canaries (memory k^2)"
    )
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=2025)
    p.add_argument(
        "--families", nargs="+", default=["gaussian"], choices=["gaussian", "orthogonal"]
    )
    p.add_argument(
        "--simulator",
        action="store_true",
        help="also measure through the DP-FedAvg simulator (one round, see above)",
    )
    args = p.parse_args(argv)
    rows = []
    print(
        f"{'family':>10} {'eps':>5} {'d':>7} {'k':>5} {'k/d':>6} | {'eps_est(1/d)':>16} {'bias':>7} | "
        f"{'eps_est(fit)':>16} {'bias':>7} | {'predicted':>9} | warning",
        flush=True,
    )
    for i, sigma, analytic, d, k, family in _cells(args):
        t0 = time.perf_counter()
        m = measure(sigma, d, k, args.delta, args.reps, args.seed * 10**6 + i * 10**5 + k, family)
        z_eff = effective_noise_multiplier(k, d, noise_multiplier=sigma, family=family)
        predicted = gaussian_epsilon_for_sigma(z_eff, args.delta) / analytic - 1
        warn = interference_warning(k, d, noise_multiplier=sigma, family=family)
        warn_plain = interference_warning(k, d, family=family)
        row = {
            "family": family,
            "analytic_epsilon": analytic,
            "sigma": sigma,
            "d": d,
            "k": k,
            "ratio": k / d,
            **m,
            "bias_null": m["null_mean"] / analytic - 1,
            "bias_fitted": m["fitted_mean"] / analytic - 1,
            "predicted_bias": predicted,
            "warns_with_noise": warn is not None,
            "warns_without_noise": warn_plain is not None,
            "seconds": time.perf_counter() - t0,
        }
        rows.append(row)
        print(
            f"{family:>10} {analytic:>5.1f} {d:>7} {k:>5} {k / d:>6.3f} | {m['null_mean']:>8.3f} +- "
            f"{m['null_sem']:<5.3f} {row['bias_null']:>+7.1%} | {m['fitted_mean']:>8.3f} +- "
            f"{m['fitted_sem']:<5.3f} {row['bias_fitted']:>+7.1%} | {predicted:>+9.1%} | "
            f"{'z-aware' if warn else '-'}/{'k/d' if warn_plain else '-'}",
            flush=True,
        )
    sim_rows = simulator_rows(args) if args.simulator else []
    print(dump({"delta": args.delta, "reps": args.reps, "rows": rows, "simulator": sim_rows}))
    return 0


def _cells(args):
    """(index of epsilon, sigma, analytic epsilon, d, k, family) of each cell measured: k >= 10
    canaries, Gaussian canaries up to ``--max-k``."""
    for i, eps in enumerate(args.epsilons):
        sigma = gaussian_sigma_for_epsilon(eps, args.delta)
        analytic = gaussian_epsilon_for_sigma(sigma, args.delta)
        for d in args.dims:
            for ratio, family in ((r, f) for r in args.ratios for f in args.families):
                k = int(round(ratio * d))
                if k < 10 or (k > args.max_k and family == "gaussian"):
                    continue
                yield i, sigma, analytic, d, k, family


def simulator_rows(args) -> list[dict]:
    """One-round DP-FedAvg simulator runs: final-model estimate (null variance) vs eps(z)."""
    from flaudit.server.simulated_audit import FedAvgSimulation, simulate_dpfedavg_audit

    print(
        f"\nDP-FedAvg simulator, one round, all seen canaries inserted, silent real clients:\n"
        f"{'family':>10} {'eps':>5} {'d':>7} {'k':>5} {'k/d':>6} | {'eps_est(1/d)':>16} {'bias':>7}",
        flush=True,
    )
    rows = []
    for i, sigma, analytic, d, k, family in _cells(args):
        config = FedAvgSimulation(
            dim=d,
            num_clients=1000,
            clients_per_round=50,
            num_rounds=1,
            num_canaries=k,
            canary_repeats=1,
            noise_multiplier=sigma,
            client_signal=0.0,
            client_noise=0.0,
            delta=args.delta,
            canary_family=family,
        )
        estimates = []
        for r in range(args.reps):
            res = simulate_dpfedavg_audit(config, seed=args.seed * 10**6 + i * 10**5 + k + r)
            estimates.append(
                final_model_epsilon(
                    res.final_cosines[res.seen],
                    d,
                    args.delta,
                    variance=VarianceTreatment.null,
                ).epsilon
            )
        e = np.asarray(estimates)
        row = {
            "family": family,
            "analytic_epsilon": analytic,
            "d": d,
            "k": k,
            "ratio": k / d,
            "mean": float(e.mean()),
            "sem": float(e.std(ddof=1) / np.sqrt(e.size)),
            "bias": float(e.mean() / analytic - 1),
        }
        rows.append(row)
        print(
            f"{family:>10} {analytic:>5.1f} {d:>7} {k:>5} {k / d:>6.3f} | {row['mean']:>8.3f} +- "
            f"{row['sem']:<5.3f} {row['bias']:>+7.1%}",
            flush=True,
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
