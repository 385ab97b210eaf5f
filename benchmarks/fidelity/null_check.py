"""Does the cosine null hold for orthogonal canaries on vectors adversarial to a DCT?

For a FIXED vector v (no canary inserted), an unseen canary's statistic should follow the null
N(0, 1/d) (the exact null for iid canaries is (1 + tau)/2 ~ Beta((d-1)/2, (d-1)/2), Andrew et al.
Thm 3.1). For the orthogonal family the k statistics of one audit are coordinates of
R^T v (R = S3 T S2 T S1, random signs, DCT-II), so the question is whether two sign+DCT rounds
spread every v. We take vectors a structured transform could trip on -- one-hot (first, middle),
10-sparse, constant, linear ramp, low-frequency cosine, alternating +-1, a DCT basis vector,
a real trained model's update and its weights (the built-in ``digits`` MLP, d = 85,002), with an
iid Gaussian vector as control -- and, per vector and family, pool ``sqrt(d) * statistic`` over
``--seeds`` audits (secret seeds) of ``k`` canaries each:

* KS distance to N(0, 1) and to the exact null, per audit (max over audits) and pooled,
  with the KS p-value of the pooled sample (against the exact null); both families with the
  same ``--k`` per audit, and the orthogonal family once more with every coordinate
  (``k = d``) for the tails;
* Anderson-Darling A^2 against the fully specified N(0, 1) (5% critical value 2.49), pooled;
* tails: the fraction beyond 3 and 4 null standard deviations (N(0,1): 2.7e-3 and 6.3e-5).

The statistic is what the tracker reports (:class:`flaudit.auditor.statistics.CosineTracker`): the
null-standardized cosine for orthogonal canaries, the plain cosine for iid ones.

    .venv/bin/python -m benchmarks.fidelity.null_check             # docs/estimators.md table
    .venv/bin/python -m benchmarks.fidelity.null_check --dims 4096 --seeds 3   # quick
"""

from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from scipy import fft, special, stats  # noqa: E402

from benchmarks.fidelity._common import dump  # noqa: E402
from flaudit.auditor.canaries import new_master_seed  # noqa: E402
from flaudit.auditor.estimators.null import null_cdf  # noqa: E402
from flaudit.auditor.statistics import CosineTracker  # noqa: E402

AD_CRITICAL_5 = 2.492  # A^2 of a fully specified distribution, 5% level (Stephens 1974)


def synthetic_vectors(d: int) -> dict[str, np.ndarray]:
    i = np.arange(d, dtype=np.float64)
    sparse = np.zeros(d)
    sparse[np.random.default_rng(1).choice(d, 10, replace=False)] = 1.0
    basis = np.zeros(d)
    basis[5] = 1.0
    return {
        "one-hot e_0": np.eye(1, d, 0).ravel(),
        "one-hot e_d/2": np.eye(1, d, d // 2).ravel(),
        "10-sparse": sparse,
        "constant": np.ones(d),
        "ramp": i,
        "low-frequency cosine": np.cos(2 * math.pi * 3 * i / d),
        "alternating +-1": (-1.0) ** i,
        "DCT basis vector 5": fft.idct(basis, norm="ortho"),
        "iid N(0,1) (control)": np.random.default_rng(2).standard_normal(d),
    }


def digits_vectors() -> dict[str, np.ndarray]:
    """A client's local update and the trained weights of the built-in digits MLP."""
    import torch

    from flaudit.clients.tasks import load_task, model_vector

    torch.set_num_threads(1)
    task = load_task("digits", num_partitions=5, seed=0)
    model = task.build_model()
    theta0 = model_vector(model)
    task.train_fn(model, task.partition(0), epochs=5, learning_rate=0.1, batch_size=32, seed=0)
    theta = model_vector(model)
    return {
        "digits: client update": (theta - theta0).astype(np.float64),
        "digits: trained weights": theta.astype(np.float64),
    }


def _ad(z: np.ndarray) -> float:
    """A^2 of ``z`` against the fully specified N(0, 1)."""
    x = np.sort(z)
    n = x.size
    i = np.arange(1, n + 1)
    return float(-n - np.mean((2 * i - 1) * (special.log_ndtr(x) + special.log_ndtr(-x[::-1]))))


def summarize_cell(stats_per_seed: list[np.ndarray], d: int) -> dict:
    """KS, A^2 and tails of one (vector, family) cell from its per-audit statistics."""
    zs = [stat * math.sqrt(d) for stat in stats_per_seed]
    z = np.concatenate(zs)
    pooled = stats.kstest(z / math.sqrt(d), lambda t: null_cdf(t, d))
    return {
        "n": int(z.size),
        "ks_normal_max": float(max(stats.kstest(x, "norm").statistic for x in zs)),
        "ks_exact_max": float(
            max(stats.kstest(x / math.sqrt(d), lambda t: null_cdf(t, d)).statistic for x in zs)
        ),
        "ks_exact_pooled": float(pooled.statistic),
        "ks_exact_pooled_p": float(pooled.pvalue),
        "ad_pooled": _ad(z),
        "tail3": float(np.mean(np.abs(z) > 3)),
        "tail4": float(np.mean(np.abs(z) > 4)),
        "mean": float(z.mean()),
        "std": float(z.std()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--dims", type=int, nargs="+", default=[131_072, 100_003])
    p.add_argument("--seeds", type=int, default=10, help="audits (secret seeds) per cell")
    p.add_argument(
        "--k",
        type=int,
        default=1000,
        help="canaries per audit for both families (same sample size per audit)",
    )
    p.add_argument("--no-digits", action="store_true")
    args = p.parse_args(argv)
    seeds = [new_master_seed() for _ in range(args.seeds)]
    cases = [(d, name, v) for d in args.dims for name, v in synthetic_vectors(d).items()]
    if not args.no_digits:
        cases += [(v.size, name, v) for name, v in digits_vectors().items()]
    print(
        f"{'d':>7} {'vector':<24} {'family':<14} | {'KS N(0,1) max':>13} {'KS exact max':>12} "
        f"{'KS pooled (p)':>18} | {'A^2':>6} | {'>3sd':>8} {'>4sd':>8} | {'sd':>6}",
        flush=True,
    )
    by_dim: dict[int, dict[str, np.ndarray]] = {}
    for d, name, v in cases:
        by_dim.setdefault(d, {})[name] = v.astype(np.float32)
    rows = []
    for d, vectors in by_dim.items():
        # "orthogonal k=d": every coordinate of R^T v, for the tails (d samples per audit)
        for label, family, k in (
            ("orthogonal", "orthogonal", args.k),
            ("gaussian", "gaussian", args.k),
            ("orthogonal k=d", "orthogonal", d),
        ):
            per_vector: dict[str, list[np.ndarray]] = {name: [] for name in vectors}
            for seed in seeds:  # one tracker (one audit) at a time: the iid bank is k d 4 bytes
                cache = min(k, d) * d * 4 if family == "gaussian" else 0
                tracker = CosineTracker(
                    seed, min(k, d), d, family=family, cache_bytes=cache, workers=2
                )
                for name, v in vectors.items():
                    per_vector[name].append(tracker.all_cosines(v))
                del tracker
            for name, values in per_vector.items():
                m = summarize_cell(values, d)
                rows.append({"d": d, "vector": name, "family": label, "k": min(k, d), **m})
                print(
                    f"{d:>7} {name:<24} {label:<14} | {m['ks_normal_max']:>13.4f} "
                    f"{m['ks_exact_max']:>12.4f} {m['ks_exact_pooled']:>8.4f} "
                    f"({m['ks_exact_pooled_p']:.2f}) | {m['ad_pooled']:>6.2f} | "
                    f"{m['tail3']:>8.2e} {m['tail4']:>8.2e} | {m['std']:>6.4f}",
                    flush=True,
                )
    print(
        f"n per cell: {args.seeds} audits x k = {args.k} (orthogonal k=d: {args.seeds} x d); "
        f"N(0,1) tails: >3sd 2.70e-03, >4sd 6.33e-05; A^2 5% critical value {AD_CRITICAL_5}"
    )
    print(dump({"seeds": args.seeds, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
