"""Four-step against pocketfft DCT-III: CPU seconds per transform at each length (issue #41).

Picks ``auditor.fourstep.FOUR_STEP_MIN``: the length above which the four-step transform is
faster. The two paths alternate in one process, so a busy machine slows both alike.
Results and the load they were measured at: docs/benchmarks.md.

Run::

    PYTHONPATH=. .venv/bin/python benchmarks/dct_threshold.py 1200000 2000000 3000000 4000000
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from flaudit.auditor import fourstep
from flaudit.auditor.transform import dct_numpy

_ALWAYS, _NEVER = 8, 1 << 62  # FOUR_STEP_MIN that sends every length one way


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lengths", type=int, nargs="+")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    shipped = fourstep.FOUR_STEP_MIN
    try:
        for n in args.lengths:
            x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
            cpu: dict[str, list[float]] = {"four-step": [], "pocketfft": []}
            for _ in range(args.reps):
                for name, minimum in (("four-step", _ALWAYS), ("pocketfft", _NEVER)):
                    fourstep.FOUR_STEP_MIN = minimum
                    y = x.copy()
                    start = time.process_time()
                    dct_numpy(y, inverse=True, workers=2)
                    cpu[name].append(time.process_time() - start)
            medians = {name: float(np.median(v)) for name, v in cpu.items()}
            print(
                f"N = {n:>11,}: " + ", ".join(f"{k} {v:.4f} s" for k, v in medians.items()),
                flush=True,
            )
    finally:
        fourstep.FOUR_STEP_MIN = shipped


if __name__ == "__main__":
    main()
