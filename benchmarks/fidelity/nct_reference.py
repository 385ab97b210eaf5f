"""Arbitrary-precision reference values of the noncentral t's tails (issue #31), for
``tests/auditor/test_nct.py``.

``T = (delta + Z) / sqrt(chi2_nu / nu)``. Two routes, both in mpmath (20 digits):

* **w-route** (the stored reference): ``P(T <= r) = int Phi(r e^w - delta) f_W(w) dw`` over
  ``w = log U``, by mpmath's adaptive tanh-sinh quadrature on intervals split at the integrand's
  peak (located by a nested float64 scan, no code of flaudit's) and at the normal factor's step
  ``log(delta / r)``, at distances ``1e-8 * 2^j`` from each (coarser cuts, ``8^j``, left mpmath's
  tanh-sinh 5e-5 off with a tiny error estimate, e.g. at ``nu = 30``, ``r = -60``, ``delta = 0``,
  where the central t's closed form gives -74.56083805802331; these cuts give it to 2e-12).
* **z-route** (an independent check, ``nu <= 100``): over the normal variable instead,
  ``P(T <= r) = P(delta + Z <= r U)``, which is ``Phi(-delta) + int_{z > -delta} phi(z)
  Q(nu/2, nu (delta + z)^2 / (2 r^2)) dz`` for ``r > 0`` and ``int_{z < -delta} phi(z)
  P(nu/2, nu (delta + z)^2 / (2 r^2)) dz`` for ``r < 0`` (regularized incomplete gammas).
  ``--check`` prints the largest relative difference of the two routes.

Each grid cell ``(nu, delta)`` gets points ``r`` at normal-approximation offsets of both signs
(``-60 ... 60`` approximate standard deviations from the median), both tails (the upper tail as
the lower tail of ``-T`` at ``-delta``). Regenerate with (47 minutes at load ~15 on the shared 2-core box)::

    PYTHONPATH=. .venv/bin/python -m benchmarks.fidelity.nct_reference \\
        --out tests/auditor/data/nct_reference.json
"""

from __future__ import annotations

import argparse
import json
import math
import time

import mpmath as mp
import numpy as np
from scipy import special

NUS = (1.0, 2.0, 5.0, 30.0, 100.0, 1e3, 1e4, 1e5, 1e7)
DELTAS = (0.0, 1.0, 10.0, 100.0, 400.0, 3000.0, 1e5)
OFFSETS = (-60.0, -8.0, -1.5, 1.5, 8.0, 60.0)
mp.mp.dps = 20


def _log_f(w, r, delta, nu):
    """float64 log-integrand of the w-route, for locating its peak only."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        out = special.log_ndtr(r * np.exp(w) - delta) + nu * w - nu * np.exp(2 * w) / 2
    return np.where(np.isnan(out), -np.inf, out)


def _peak(r, delta, nu):
    lo, hi = -90.0, 12.0
    for _ in range(8):  # nested scans: each keeps the two cells around the best sample
        grid = np.linspace(lo, hi, 4001)
        i = int(np.argmax(_log_f(grid, r, delta, nu)))
        lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    return 0.5 * (lo + hi)


def w_route(r, delta, nu) -> mp.mpf:
    """``P(T <= r)`` by the w-route (module docstring)."""
    r, delta, nu = mp.mpf(r), mp.mpf(delta), mp.mpf(nu)
    log_norm = mp.log(2) + nu / 2 * mp.log(nu / 2) - mp.loggamma(nu / 2)

    def f(w):
        return mp.ncdf(r * mp.exp(w) - delta) * mp.exp(log_norm + nu * w - nu * mp.exp(2 * w) / 2)

    peak = _peak(float(r), float(delta), float(nu))
    centres = [peak]
    if r != 0 and delta / r > 0:
        centres.append(float(mp.log(delta / r)))
    cuts = {-200.0, 15.0}
    for c in centres:
        for j in range(35):
            for sign in (-1, 1):
                x = c + sign * 1e-8 * 2.0**j
                if -200.0 < x < 15.0:
                    cuts.add(x)
        if -200.0 < c < 15.0:
            cuts.add(c)
    return mp.quad(f, sorted(cuts))


def z_route(r, delta, nu, log_p) -> mp.mpf:
    """``P(T <= r)`` by the z-route (module docstring); ``log_p``, a rough log of the answer,
    bounds where its mass can lie (``phi(z) >= p``)."""
    r, delta, nu = mp.mpf(r), mp.mpf(delta), mp.mpf(nu)
    if r == 0:
        return mp.ncdf(-delta)
    a = nu / 2

    def f(z):
        x = nu * (delta + z) ** 2 / (2 * r * r)
        if r > 0:
            return mp.npdf(z) * mp.gammainc(a, x, mp.inf, regularized=True)
        return mp.npdf(z) * mp.gammainc(a, 0, x, regularized=True)

    reach = math.sqrt(2 * abs(log_p) + 20) + 10
    if r > 0:
        lo, hi = max(-float(delta), -reach), reach
    else:
        lo, hi = -reach, min(-float(delta), reach)
    if not lo < hi:
        return mp.ncdf(-delta) if r > 0 else mp.mpf(0)
    grid = np.linspace(lo, hi, 201)
    vals = [f(mp.mpf(z)) for z in grid]
    best = float(grid[int(np.argmax([float(mp.log(v)) if v > 0 else -math.inf for v in vals]))])
    cuts = {lo, hi}
    for c in (-float(delta), float(r) - float(delta), 0.0, best):
        for j in range(-20, 8, 2):
            for sign in (-1, 1):
                x = c + sign * 2.0**j
                if lo < x < hi:
                    cuts.add(x)
    value = mp.quad(f, sorted(cuts))
    return value + (mp.ncdf(-delta) if r > 0 else 0)


def grid_points():
    """``(r, nu, delta)`` of the grid: lower-tail points of ``T`` and of ``-T``."""
    for nu in NUS:
        for delta in DELTAS:
            median = delta * (1 - 1 / (4 * nu))
            sd = math.sqrt(1 + delta * delta / (2 * nu))
            for k in OFFSETS:
                r = median + k * sd
                yield r, nu, delta  # P(T <= r)
                yield -r, nu, -delta  # P(-T <= -r) = P(T >= r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/auditor/data/nct_reference.json")
    ap.add_argument(
        "--check",
        action="store_true",
        help="instead: compare the two routes on the cells nu in {1, 5, 30}, "
        "delta in {0, 10, 400} (about 10 minutes) and write nothing",
    )
    args = ap.parse_args()
    t0 = time.time()
    if args.check:
        worst, count = 0.0, 0
        for r, nu, delta in grid_points():
            if nu not in (1.0, 5.0, 30.0) or abs(delta) not in (0.0, 10.0, 400.0):
                continue
            p = w_route(r, delta, nu)
            if not p > mp.mpf("1e-300"):
                continue
            q = z_route(r, delta, nu, float(mp.log(p)))
            rel = float(abs(q - p) / p)
            worst, count = max(worst, rel), count + 1
            if rel > 1e-6:
                print(
                    f"routes differ: r={r} nu={nu} delta={delta} w={mp.nstr(p, 12)} "
                    f"z={mp.nstr(q, 12)} rel={rel:.2e}"
                )
        print(
            f"{count} points in {time.time() - t0:.0f} s; largest relative difference of "
            f"the two routes: {worst:.2e}"
        )
        return
    rows = []
    for i, (r, nu, delta) in enumerate(grid_points()):
        p = w_route(r, delta, nu)
        rows.append([r, nu, delta, float(mp.log(p)) if p > 0 else -math.inf])
        if i % 50 == 0:
            print(f"{i} points, {time.time() - t0:.0f} s", flush=True)
    with open(args.out, "w") as fh:
        json.dump(
            {
                "generated_by": "benchmarks/fidelity/nct_reference.py",
                "columns": ["r", "dof", "delta", "log_cdf"],
                "rows": rows,
            },
            fh,
            indent=0,
        )
    print(f"{len(rows)} reference values in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
