"""What a frozen audit service costs a training run: per-round wrapper time, budget off vs on.

A real ``flaudit serve`` (SQLite, loopback) and a ``CanaryAuditStrategy`` around Flower's
``DifferentialPrivacyServerSideFixedClipping(FedAvg)``, driven round by hand (3 nodes whose
"training" takes ``--train-seconds``); from round 3 the service is stopped with SIGSTOP for
``--freeze`` seconds (its port still accepts connections; nothing answers), then SIGCONT, then
three more rounds. Per round it prints the time the wrapper added (configure_train +
aggregate_train) and the round's wall time, for

* ``before``: no round budget and 60 s canary fetches (the wrapper before issue #28: each
  call waits up to 60 s, three times, and a round waits on the previous round's report), and
* ``after``: the defaults (``round_budget_seconds=5``, ``fetch_timeout=5``).

Run (docs/flower.md, "Never stall a round", has the numbers)::

    .venv/bin/python benchmarks/frozen_service.py --freeze 120
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.flower_rounds

from _service import AUTH, running_service  # noqa: E402
from flwr.app import ArrayRecord, ConfigRecord  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from tests.flower_rounds import (  # noqa: E402
    SHAPES,
    Grid3,
    attached_strategy,
    initial_arrays,
    small_steps,
)

FREEZE_AT = 3


def _strategy(
    url: str,
    http: httpx.Client,
    *,
    budget: float | None,
    fetch_timeout: float,
    num_rounds: int,
    num_canaries: int = 16,
):
    _, reporter, strategy = attached_strategy(
        http,
        url,
        AUTH,
        num_canaries=num_canaries,
        fetch_timeout=fetch_timeout,
        num_rounds=num_rounds,
        round_budget_seconds=budget,
    )
    return reporter, strategy


def one_round(strategy, t: int, arrays: ArrayRecord, rng, train_seconds: float):
    """Round ``t`` (3 nodes reply after ``train_seconds``): the new arrays and the seconds the
    wrapper took (configure_train + aggregate_train)."""
    began = time.monotonic()
    messages = list(strategy.configure_train(t, arrays, ConfigRecord({}), Grid3()))
    wrapper = time.monotonic() - began
    time.sleep(train_seconds)  # the clients train
    replies = small_steps(messages, arrays, rng)
    aggregate = time.monotonic()
    arrays, _ = strategy.aggregate_train(t, replies)
    return arrays, wrapper + time.monotonic() - aggregate


def run(
    label: str,
    url: str,
    pid: int,
    *,
    budget: float | None,
    fetch_timeout: float,
    freeze: float,
    train_seconds: float,
) -> list[tuple[int, float, float, str]]:
    """Rounds until the freeze is over and three more; ``[(t, wrapper s, wall s, state)]``."""
    http = httpx.Client(base_url=url, timeout=30)
    reporter, strategy = _strategy(
        url, http, budget=budget, fetch_timeout=fetch_timeout, num_rounds=10_000
    )
    rng = np.random.default_rng(0)
    arrays = initial_arrays(rng)
    strategy.declare(Grid3(), 10_000)  # what start() does before round 1
    strategy._report_initial(arrays)
    thawed = threading.Event()
    thaw_timer = None
    rows = []
    t, after_thaw = 0, 0
    while after_thaw < 3:
        t += 1
        if t == FREEZE_AT:
            os.kill(pid, signal.SIGSTOP)
            thaw_timer = threading.Timer(
                freeze, lambda: (os.kill(pid, signal.SIGCONT), thawed.set())
            )
            thaw_timer.start()
        state = "up" if t < FREEZE_AT else ("frozen" if not thawed.is_set() else "thawed")
        began = time.monotonic()
        arrays, wrapper = one_round(strategy, t, arrays, rng, train_seconds)
        rows.append((t, wrapper, time.monotonic() - began, state))
        print(
            f"{label:6s} round {t:3d} ({state:6s}): wrapper {wrapper:7.2f} s, round "
            f"{time.monotonic() - began:7.2f} s",
            flush=True,
        )
        if thawed.is_set():
            after_thaw += 1
    if thaw_timer is not None:
        thaw_timer.join()
    reporter.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--freeze", type=float, default=120.0, help="SIGSTOP seconds")
    parser.add_argument(
        "--train-seconds", type=float, default=2.0, help="the clients' training time per round"
    )
    parser.add_argument("--only", choices=("before", "after"))
    args = parser.parse_args()
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    results = {}
    with running_service() as (url, _tmp, service):
        # a first audit loads the service's estimators (seconds): not what is measured
        http = httpx.Client(base_url=url, timeout=60)
        reporter, strategy = _strategy(
            url, http, budget=None, fetch_timeout=60, num_rounds=2, num_canaries=4
        )
        arrays = ArrayRecord([np.zeros(s, np.float32) for s in SHAPES])
        for t in (1, 2):  # the last round sends the final model
            arrays, _ = one_round(strategy, t, arrays, np.random.default_rng(t), 0.0)
        reporter.close()
        for label, budget, fetch in (("before", None, 60.0), ("after", 5.0, 5.0)):
            if args.only not in (None, label):
                continue
            results[label] = run(
                label,
                url,
                service.pid,
                budget=budget,
                fetch_timeout=fetch,
                freeze=args.freeze,
                train_seconds=args.train_seconds,
            )
    print(
        f"\nfreeze {args.freeze:g} s from round {FREEZE_AT}, clients train "
        f"{args.train_seconds:g} s per round"
    )
    for label, rows in results.items():
        up = [w for _, w, _, s in rows if s == "up"]
        frozen = [w for _, w, _, s in rows if s != "up"]
        print(
            f"{label:6s}: wrapper per round with the service up: median "
            f"{statistics.median(up):.2f} s; from the freeze on: max {max(frozen):.2f} s, "
            f"median {statistics.median(frozen):.2f} s over {len(frozen)} rounds"
        )


if __name__ == "__main__":
    main()
