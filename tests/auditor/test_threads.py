"""The auditor's shared worker threads (issue #41): started once, not per call; results in
order; every group finished before an error is re-raised; nested calls never deadlock."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from flaudit.auditor.threads import run_groups
from flaudit.auditor.transform import CHUNK, SignBits, map_chunks, sum_of_squares


def test_results_in_order_and_the_first_group_on_the_calling_thread():
    names = run_groups(lambda g: (g, threading.current_thread().name), [0, 1, 2, 3])
    assert [g for g, _ in names] == [0, 1, 2, 3]
    assert names[0][1] == threading.current_thread().name
    assert all(name.startswith("flaudit-chunks") for _, name in names[1:])


def test_threads_are_reused_across_calls():
    run_groups(lambda g: g, [0, 1])  # the pool exists from here on
    before = threading.active_count()
    seen = set()
    for _ in range(200):
        seen.update(run_groups(lambda g: threading.get_ident(), [0, 1, 2]))
    assert threading.active_count() == before
    assert len(seen) <= 1 + 2  # the caller and at most two pool threads, not 400 fresh ones


def test_every_group_finishes_before_an_error_is_raised():
    done = []

    def work(g):
        if g == 0:
            raise ValueError("first group failed")
        time.sleep(0.05)
        done.append(g)
        return g

    with pytest.raises(ValueError, match="first group failed"):
        run_groups(work, [0, 1, 2])
    assert sorted(done) == [1, 2]  # the others had finished writing when it raised
    with pytest.raises(KeyError):
        run_groups(lambda g: {}[g] if g == 2 else g, [0, 1, 2])


def test_nested_calls_run_inline_and_never_deadlock():
    def outer(g):
        return sum(run_groups(lambda h: h * g, [1, 2, 3]))

    finished = []
    worker = threading.Thread(target=lambda: finished.append(run_groups(outer, list(range(8)))))
    worker.start()
    worker.join(timeout=30)
    assert finished == [[6 * g for g in range(8)]]


def test_map_chunks_results_do_not_depend_on_workers():
    n = 5 * CHUNK + 12345  # long enough that two workers run on two threads
    x = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    assert sum_of_squares(x, workers=1) == sum_of_squares(x, workers=2)
    threads = map_chunks(n, lambda a, b: threading.get_ident(), workers=2)
    assert len(set(threads)) == 2
    short = map_chunks(2 * CHUNK, lambda a, b: threading.get_ident(), workers=2)
    assert set(short) == {threading.get_ident()}  # two chunks: not worth a second thread
    packed = np.packbits(np.random.default_rng(4).integers(0, 2, n).astype(np.uint8))
    signs = SignBits(packed, n)
    one, two = x.copy(), x.copy()
    signs.flip(one, 0, workers=1)
    signs.flip(two, 0, workers=2)
    assert np.array_equal(one.view(np.uint32), two.view(np.uint32))


@pytest.mark.parametrize("inverse", [True, False])
def test_the_split_butterflies_and_half_transforms_change_no_bit(inverse):
    import scipy.fft

    from flaudit.auditor.transform import dct_numpy

    n = 600_000  # even, below the four-step threshold: butterfly, (de)interleave, two halves
    x = np.random.default_rng(5).standard_normal(n).astype(np.float32)
    one = dct_numpy(x.copy(), inverse=inverse, workers=1)
    two = dct_numpy(x.copy(), inverse=inverse, workers=2)
    assert np.array_equal(one.view(np.uint32), two.view(np.uint32))
    fn = scipy.fft.idct if inverse else scipy.fft.dct
    reference = fn(x.astype(np.float64), type=2, norm="ortho")
    assert np.max(np.abs(two - reference)) < 1e-4


def test_a_forked_child_starts_its_own_pool():
    import os

    run_groups(lambda g: g, [0, 1])  # the parent's pool exists
    pid = os.fork()
    if pid == 0:  # the child: the parent's threads do not exist here
        import signal

        signal.alarm(30)  # a child stuck on the parent's dead pool dies, and the test fails
        try:
            ok = run_groups(lambda g: g * 2, [1, 2, 3]) == [2, 4, 6]
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
