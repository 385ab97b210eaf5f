"""Nothing hangs (issue #28, item 6): many rounds' statistics on several threads, beside numpy/BLAS
matrix work on other threads of the same process, always make progress.

``flaudit run`` hung in OpenBLAS's ``exec_blas`` under ``sum_of_squares`` (an ``np.dot`` on the
audit thread) while the ServerApp thread waited on it. The audit's 1-D reductions and the gaussian
family's cosines now run without BLAS (``np.einsum`` without ``optimize``); this test drives them
as the audit threads do (orthogonal and gaussian ``CosineTracker`` rounds, the null-standardised
statistics, the claim tests' summary) while other threads run BLAS matrix products, dot products
and solves. A watchdog fails the test, with every thread's stack, as soon as a worker makes no
progress for ``STALL_S`` seconds, instead of hanging until pytest-timeout (a backstop only).
"""

from __future__ import annotations

import sys
import threading
import time
import traceback

import numpy as np
import pytest

from flaudit.auditor.canaries import CanaryFamily, seen_mask
from flaudit.auditor.claims import AuditLook, summarize
from flaudit.auditor.statistics import CosineTracker
from flaudit.auditor.transform import sum_of_squares

SEED = 0x57A11
STALL_S = 10.0  # no progress this long is a stall (a round here takes milliseconds)
RUN_S = 6.0  # the workers run at least this long, and until each has done MIN_STEPS steps
MIN_STEPS = 5
AUDIT_THREADS = 3
BLAS_THREADS = 2


class Progress:
    """Per-worker heartbeat: the time of its last completed step and how many steps it did."""

    def __init__(self, names):
        now = time.monotonic()
        self.last = dict.fromkeys(names, now)
        self.steps = dict.fromkeys(names, 0)
        self.errors: list[str] = []
        self.stop = threading.Event()

    def beat(self, name):
        self.last[name] = time.monotonic()
        self.steps[name] += 1


def _audit_worker(name, index, progress):
    """Rounds of an audit: tracker updates on both families, the claim summary every round."""
    rng = np.random.default_rng(index)
    dim, k = 60_000, 400
    orthogonal = CosineTracker(SEED + index, k, dim, family=CanaryFamily.orthogonal, workers=1)
    gaussian = CosineTracker(
        SEED + index, 16, 4_000, family=CanaryFamily.gaussian, cache_bytes=16 * 4_000 * 4
    )
    seen = seen_mask(SEED + index, k)
    try:
        while not progress.stop.is_set():
            update = rng.standard_normal(dim).astype(np.float32)
            orthogonal.update(update)
            gaussian.update(rng.standard_normal(4_000))
            total = sum_of_squares(rng.standard_normal(3 * (1 << 20) + 5))  # several chunks
            assert total > 0.0
            summarize(
                AuditLook(
                    seen=seen,
                    dim=dim,
                    delta=1e-5,
                    max_cosines=orthogonal.max_cosines,
                    final_cosines=None,
                    threat_models=["all_iterates"],
                    one_run=False,
                    num_rounds=orthogonal.num_rounds,
                    scale_dof=orthogonal.scale_dof,
                )
            )
            progress.beat(name)
    except BaseException:  # reported by the main thread
        progress.errors.append(f"{name}:\n{traceback.format_exc()}")
        raise


def _blas_worker(name, index, progress):
    """What else a training process runs: matrix products, long dot products, solves (BLAS)."""
    rng = np.random.default_rng(100 + index)
    a = rng.standard_normal((256, 256))
    b = rng.standard_normal((256, 256))
    long = rng.standard_normal(1 << 20)
    try:
        while not progress.stop.is_set():
            c = a @ b
            assert np.isfinite(float(np.dot(long, long)))
            np.linalg.solve(c + 256.0 * np.eye(256), long[:256])
            progress.beat(name)
    except BaseException:
        progress.errors.append(f"{name}:\n{traceback.format_exc()}")
        raise


def _stacks() -> str:
    names = {t.ident: t.name for t in threading.enumerate()}
    return "\n".join(
        f"--- {names.get(ident, ident)}\n{''.join(traceback.format_stack(frame))}"
        for ident, frame in sys._current_frames().items()
    )


@pytest.mark.timeout(120)  # backstop only: the watchdog below fails first
def test_audit_statistics_beside_blas_threads_never_stall():
    workers = [(f"audit-{i}", _audit_worker, i) for i in range(AUDIT_THREADS)]
    workers += [(f"blas-{i}", _blas_worker, i) for i in range(BLAS_THREADS)]
    progress = Progress([name for name, _, _ in workers])
    threads = [
        threading.Thread(target=target, args=(name, i, progress), name=name, daemon=True)
        for name, target, i in workers
    ]
    for thread in threads:
        thread.start()
    start = time.monotonic()
    stalled = None
    while (
        time.monotonic() - start < RUN_S or min(progress.steps.values()) < MIN_STEPS
    ) and not progress.errors:
        time.sleep(0.2)
        now = time.monotonic()
        late = {name: now - last for name, last in progress.last.items() if now - last > STALL_S}
        if late:
            stalled = late
            break
    progress.stop.set()
    deadline = time.monotonic() + STALL_S
    for thread in threads:  # a worker stuck in C code would never join: bounded wait
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in threads if t.is_alive()]
    if stalled or alive:
        pytest.fail(
            f"stalled workers {stalled or alive} (no progress for {STALL_S} s); "
            f"steps {progress.steps}\n{_stacks()}"
        )
    assert not progress.errors, "\n".join(progress.errors)
    # every worker ran many rounds: the test exercised what it claims to
    assert min(progress.steps.values()) >= MIN_STEPS, progress.steps
