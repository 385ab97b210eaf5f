"""One process-wide pool of threads for the auditor's chunked numpy work (issue #41).

:func:`flaudit.auditor.transform.map_chunks` and the four-step DCT-III
(:mod:`flaudit.auditor.fourstep`) split a vector into contiguous groups of chunks and run each
group on its own thread (numpy and pocketfft release the GIL on long operations). They used to
start a fresh ``ThreadPoolExecutor`` per call, about ten a round: thread starts and joins that
cost ~1 ms of CPU per call at d = 1.2M, a third of a sign flip's own work, and far more wall
time on a loaded machine. Here the threads are started once and kept.

:func:`run_groups` runs the first group on the calling thread and the others on the pool, so
a call with two groups hands one group over and never waits on a queue for its own share. A
group that itself calls :func:`run_groups` (from a pool thread) runs its groups inline: no
pool thread ever waits for another, so the pool cannot deadlock however many audits share it.
After ``fork`` the child starts a new pool (the parent's threads do not exist there).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["run_groups"]

_LOCK = threading.Lock()
_STATE: dict = {"pool": None, "size": 0}
_IN_POOL = threading.local()


def _reset_after_fork() -> None:
    global _LOCK
    _LOCK = threading.Lock()  # another thread may have held it at the fork
    _STATE.update(pool=None, size=0)


if hasattr(os, "register_at_fork"):  # pragma: no branch - every POSIX Python has it
    os.register_at_fork(after_in_child=_reset_after_fork)


def _mark_pool_thread() -> None:
    _IN_POOL.active = True


def _pool(threads: int) -> ThreadPoolExecutor:
    """The shared pool, with room for at least ``threads`` threads (grown, never shrunk)."""
    with _LOCK:
        pool = _STATE["pool"]
        if pool is None or _STATE["size"] < threads:
            size = max(threads, os.cpu_count() or 1)
            pool = ThreadPoolExecutor(
                max_workers=size, thread_name_prefix="flaudit-chunks", initializer=_mark_pool_thread
            )
            old = _STATE["pool"]
            _STATE.update(pool=pool, size=size)
            if old is not None:  # its queued work still runs; its threads exit when idle
                old.shutdown(wait=False)
        return pool


def run_groups(fn, groups: list) -> list:
    """``[fn(group) for group in groups]``, in order: the first group on the calling thread, the
    others on the shared pool's threads. Every group has finished when this returns, also when
    one raised (the first exception is re-raised)."""
    if len(groups) < 2 or getattr(_IN_POOL, "active", False):
        return [fn(group) for group in groups]
    pool = _pool(len(groups) - 1)
    futures = [pool.submit(fn, group) for group in groups[1:]]
    error: BaseException | None = None
    try:
        first = fn(groups[0])
    except BaseException as exc:  # wait for the others: they write into the caller's arrays
        error = exc
    results = []
    for future in futures:
        try:
            results.append(future.result())
        except BaseException as exc:
            error = error or exc
    if error is not None:
        raise error
    return [first, *results]
