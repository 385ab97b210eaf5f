"""Fidelity benchmarks: reproductions, validity of lower bounds, DP-bug injection, interference.

Each module runs as ``.venv/bin/python -m benchmarks.fidelity.<name> --help``; results are
written down in ``docs/fidelity.md``.
"""

import os as _os

# One BLAS thread per process: the machine is shared, and oversubscribed BLAS threads make
# small dot products 4x slower here.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    _os.environ.setdefault(_var, "1")
