"""Issue #38's hidden check over seeds: Flower's quickstart-sklearn behind Flower's
``DifferentialPrivacyServerSideAdaptiveClipping`` (z = 1, ``clipped-count-stddev = 1``), 4 nodes,
25 rounds, ``num_canaries = "auto"``, the lines of docs/flower.md, the real ServerApp and ClientApp
on an in-process grid against the service app in process (``tests/integration/sklearn_adaptive``).
Per seed: the noise as claimed and Flower's noise at std/2 (the planted bug). Prints the design
line, each run's verdict, and the catch and false-alarm rates with Clopper-Pearson intervals.

Rerun: ``PYTHONPATH=$PWD .venv/bin/python benchmarks/sklearn_adaptive.py --seeds 6``
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fidelity._common import clopper_pearson  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--first", type=int, default=100)
    args = parser.parse_args(argv)

    from flwr.common.logger import FLOWER_LOGGER

    from flaudit.service.store import Store
    from tests.integration.sklearn_adaptive import make_app, run_once
    from tests.service.conftest import CIPHER, make_client

    for handler in FLOWER_LOGGER.handlers:
        handler.setLevel(logging.ERROR)
    started = time.monotonic()
    caught = alarms = 0
    with tempfile.TemporaryDirectory() as tmp:
        app = make_app(Path(tmp) / "app")
        store = Store(f"sqlite:///{tmp}/b.db", cipher=CIPHER)
        with make_client(store) as client:
            for seed in range(args.first, args.first + args.seeds):
                for scale in (0.5, 1.0):
                    out = run_once(
                        app,
                        client,
                        canary_seed=0x38_5EED_0000 + seed,
                        app_seed=seed,
                        noise_scale=scale,
                    )
                    v = out.verdict
                    named = v["status"] == "claim_refuted" and v.get("cause") in (
                        "noise",
                        "noise_and_weighting",
                    )
                    if scale == 0.5:
                        caught += named
                    else:
                        alarms += named
                    if seed == args.first and scale == 0.5:
                        print(out.design_line)
                    print(
                        f"seed {seed} noise x{scale}: {v['status']} / {v.get('cause') or '-'}, "
                        f"min C_noise/C_clip {out.audit.get('min_noise_clip_factor') or 1:.3f}",
                        flush=True,
                    )
        store.dispose()
    n = args.seeds
    lo, hi = clopper_pearson(caught, n)
    print(f"std/2 refuted with the noise named: {caught}/{n} [{lo:.0%}, {hi:.0%}]")
    lo, hi = clopper_pearson(alarms, n)
    print(f"correct runs refuted with the noise named: {alarms}/{n} [{lo:.0%}, {hi:.0%}]")
    print(f"wall time: {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
