"""Orthonormal DCT-III of a long vector on every core, in ``4 N`` bytes beyond it (float32).

:func:`flaudit.auditor.transform.dct_numpy` runs one pocketfft transform per half of the
vector; pocketfft runs a 1-D transform on one thread whatever ``workers`` says and takes about
``2-3 x 4 N`` bytes of buffers and twiddles for it. Here the DCT-III (the transpose of the
orthonormal DCT-II, which :meth:`~flaudit.auditor.canaries.OrthogonalCanaries.transpose_apply`
runs two or three times a round) goes through Makhoul's complex FFT of length ``M = N / 2``,
computed as a four-step FFT (``M = M1 M2``) whose short FFTs are batched over rows and columns
of an ``(M1, M2)`` array, so that pocketfft spreads them over ``workers`` threads and keeps only
per-line buffers:

1. ``Z_k`` from the coefficients ``C`` (as :func:`flaudit.auditor.transform.dct3_torch`):
   ``Y_k = C_k - i C_{N-k}`` (``Y_0 = sqrt2 C_0``), ``V_k = e^{i pi k / 2N} Y_k``,
   ``Vc_k = conj(V_{M-k})``,
   ``Z_k = (V_k + Vc_k + i (V_k - Vc_k) e^{2 pi i k / N}) sqrt(N / 2) / 2``,
   written in natural order into one complex buffer of ``M`` values (``4 N`` bytes in float32);
2. ``z = IFFT_M(Z)`` in place: inverse FFTs of length ``M1`` down the columns, the twiddles
   ``e^{2 pi i k1 n2 / M}``, inverse FFTs of length ``M2`` along the rows; the result is left
   transposed, ``z[k1 + M1 k2]`` at row ``k1``, column ``k2``;
3. the real view of ``z`` interleaves ``v_even, v_odd`` of Makhoul's reordering; the output
   ``x_{2n} = v_n``, ``x_{2n+1} = v_{N-1-n}`` is written back into the input's memory block by
   block of rows (each block a short strided transpose).

The row half of step 2 and step 3 are one pass: a block of rows is twiddled, transformed and
written out while it is in cache, paired with its mirror block so that each output cache line
is written whole (two passes over ``4 N`` bytes fewer than running them one after the other).
Steps 1 and 3 and the twiddles run on ``workers`` threads too, chunk by chunk (numpy releases
the GIL on long operations); every chunk writes its own part of the output. A caller running
several transforms in a row passes one complex buffer (:func:`four_step_work`) instead of
allocating ``4 N`` fresh bytes, and page-faulting them in, for each. Twiddles are
products of a short table and one exact exponential per chunk or row, computed in float64.
Results agree with scipy's DCT-III to the working precision (float32: ~1e-7 relative).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.fft

from .threads import run_groups

__all__ = ["four_step_plan", "four_step_work", "dct3_four_step", "FOUR_STEP_MIN"]

FOUR_STEP_MIN = 1 << 22  # shorter vectors take pocketfft's 1-D transforms (faster below ~3.5M on 2
# cores, and their ~2 x 4N bytes of scratch are small there; benchmarks/ingest.py, docs/benchmarks.md)
_MIN_FACTOR = 16  # M1 and M2 at least this long, else pocketfft's 1-D transforms
_PRE_CHUNK = 1 << 16  # elements of k per chunk of step 1 (fewer, longer numpy calls: 2 threads
# hold the GIL less; 1<<14 took 0.27 s at N = 10^8 on 2 threads, 1<<16 0.18 s)
_ROW_TABLE = 256  # twiddle table length along a row of step 2
_ROW_BLOCK = 16  # rows per block of the fused row pass (a multiple of 4: whole cache lines of
# output; at N = 10^9 on 2 threads 8 to 64 rows took 7.9-8.3 s a transform, 1 row far longer)


def four_step_plan(n: int) -> tuple[int, int] | None:
    """``(M1, M2)`` with ``M1 M2 = n / 2``, ``M2`` even and both at least ``_MIN_FACTOR``, ``M1``
    the largest such divisor ``<= sqrt(n / 2)``; ``None`` when ``n`` is shorter than
    ``FOUR_STEP_MIN``, odd, or has no such factorisation (then the caller uses pocketfft's 1-D
    transforms)."""
    if n < FOUR_STEP_MIN or n % 4:
        return None
    m = n // 2
    for m1 in range(math.isqrt(m), _MIN_FACTOR - 1, -1):
        if m % m1 == 0 and (m // m1) % 2 == 0:
            return m1, m // m1
    return None


def four_step_work(lengths, dtype) -> np.ndarray | None:
    """One complex buffer for the four-step DCT-IIIs of vectors of these ``lengths`` and real
    ``dtype`` run one after another (``work=`` of :func:`dct3_four_step`): ``max(n) / 2`` values
    over the lengths with a :func:`four_step_plan`, ``None`` when none has one."""
    halves = [int(n) // 2 for n in lengths if four_step_plan(int(n)) is not None]
    if not halves:
        return None
    ctype = np.complex64 if np.dtype(dtype) == np.float32 else np.complex128
    return np.empty(max(halves), dtype=ctype)


def _exp_i(angles: np.ndarray) -> np.ndarray:
    """``e^{i angles}`` in complex128."""
    return np.cos(angles) + 1j * np.sin(angles)


def _run(workers: int, fn, items) -> None:
    """``fn(group)`` for ``workers`` contiguous groups of ``items``, one thread each (the shared
    pool, :mod:`flaudit.auditor.threads`; each group allocates its scratch once)."""
    items = list(items)
    groups = (
        [items]
        if workers <= 1 or len(items) < 2
        else [part.tolist() for part in np.array_split(np.asarray(items), min(workers, len(items)))]
    )
    run_groups(fn, groups)  # the shared threads; re-raises a worker's exception


def _pre_twiddled(
    coef: np.ndarray, z: np.ndarray, starts: list[int], table1: np.ndarray, table5: np.ndarray
) -> None:
    """Step 1 for the chunks of ``k`` starting at ``starts``: ``Z_k`` into ``z``.

    With ``t = e^{i pi k / 2N}``, ``P = conj(Y_{M-k}) e^{-i pi / 4}`` and ``h = sqrt(N / 2) / 2``:
    ``Z = h t (Y + P) + i h t^5 (Y - P)``; ``t`` and ``t^5`` are a table times one exponential
    per chunk."""
    n = coef.shape[0]
    m = n // 2
    ctype = z.dtype.type
    size = table1.shape[0]
    y = np.empty(size, dtype=z.dtype)
    p = np.empty(size, dtype=z.dtype)
    u = np.empty(size, dtype=z.dtype)
    theta = math.pi / (2 * n)
    h = 0.5 * math.sqrt(n / 2.0)
    eighth = ctype(complex(math.cos(math.pi / 4), -math.sin(math.pi / 4)))
    for a in starts:
        b = min(a + size, m)
        y_, p_, u_ = y[: b - a], p[: b - a], u[: b - a]
        y_.real = coef[a:b]  # Y_k = C_k - i C_{N-k}, C_{N-0} = 0 and Y_0 = sqrt2 C_0
        if a == 0:
            y_.imag[0] = 0.0
            y_.imag[1:] = coef[n - b + 1 : n][::-1]
        else:
            y_.imag = coef[n - b + 1 : n - a + 1][::-1]
        np.negative(y_.imag, out=y_.imag)
        if a == 0:
            y_[0] *= math.sqrt(2.0)
        p_.real = coef[m - b + 1 : m - a + 1][::-1]  # conj(Y_{M-k}) = C_{M-k} + i C_{M+k}
        p_.imag = coef[m + a : m + b]
        p_ *= eighth
        np.add(y_, p_, out=u_)
        y_ -= p_
        u_ *= table1[: b - a]
        u_ *= ctype(h * complex(math.cos(theta * a), math.sin(theta * a)))
        y_ *= table5[: b - a]
        y_ *= ctype(1j * h * complex(math.cos(5 * theta * a), math.sin(5 * theta * a)))
        np.add(u_, y_, out=z[a:b])


def _row_twiddles(z2: np.ndarray, r0: int, r1: int) -> None:
    """Step 2 on rows ``k1`` in ``[r0, r1)``: ``z2[k1, n2] *= e^{2 pi i k1 n2 / M}``."""
    m1, m2 = z2.shape
    m = m1 * m2
    step = _ROW_TABLE
    blocks = -(-m2 // step)
    low = np.arange(step, dtype=np.int64)
    high = np.arange(blocks, dtype=np.int64) * step
    scale = 2.0 * math.pi / m
    for k1 in range(r0, r1):
        if k1 == 0:
            continue
        w = np.multiply.outer(
            _exp_i(((k1 * high) % m) * scale).astype(z2.dtype),
            _exp_i(((k1 * low) % m) * scale).astype(z2.dtype),
        )
        z2[k1] *= w.reshape(-1)[:m2]


def _unreorder(z2: np.ndarray, x: np.ndarray, r0: int, r1: int) -> None:
    """Step 3 for rows ``k1`` in ``[r0, r1)`` of the transposed ``z``: the real view ``v``;
    ``x_{2n} = v_n``, ``x_{2n+1} = v_{N-1-n}``."""
    m1, m2 = z2.shape
    half = m2 // 2
    real = z2.view(x.dtype).reshape(m1, m2, 2)
    wide = x.reshape(half, 4 * m1)  # x[4 m] with m = k1 + M1 k2 at row k2, column 4 k1
    rev = wide[::-1, ::-1]  # x[2N-1-4m] for m >= M / 2 at row k2 - M2/2, column 4 k1
    cols = slice(4 * r0, 4 * r1, 4)
    cols2 = slice(4 * r0 + 2, 4 * r1 + 2, 4)
    wide[:, cols] = real[r0:r1, :half, 0].T
    wide[:, cols2] = real[r0:r1, :half, 1].T
    rev[:, cols] = real[r0:r1, half:, 0].T
    rev[:, cols2] = real[r0:r1, half:, 1].T


def _rows_out(z2: np.ndarray, x: np.ndarray, starts: list[int], rows: int) -> None:
    """Steps 2b and 3 fused, for the row blocks ``[a, a + rows)`` (``a`` in ``starts``, all
    below the middle row) and their mirrors ``[M1 - a - rows, M1 - a)``: twiddles, the length
    ``M2`` inverse FFTs and the un-reordering of each block while it is in cache. A block and
    its mirror write the four interleaved columns ``4 k1 .. 4 k1 + 3`` of every output row
    between them (``x_{4m}, x_{4m+2}`` from row ``k1``, ``x_{4m+3}, x_{4m+1}`` from its mirror),
    so each output cache line is written whole by one thread."""
    m1 = z2.shape[0]
    middle = (m1 + 1) // 2
    for a in starts:
        b = min(a + rows, middle)
        for r0, r1 in ((a, b), (max(m1 - b, b), m1 - a)):
            if r1 <= r0:
                continue
            _row_twiddles(z2, r0, r1)
            out = scipy.fft.ifft(z2[r0:r1], axis=1, overwrite_x=True, workers=1)
            if not np.shares_memory(out, z2):  # pragma: no cover - pocketfft works in place
                z2[r0:r1] = out
            _unreorder(z2, x, r0, r1)


def dct3_four_step(
    x: np.ndarray, plan: tuple[int, int], *, workers: int, work: np.ndarray | None = None
) -> np.ndarray:
    """Orthonormal DCT-III of the contiguous 1-D float32/float64 ``x`` in place (module
    docstring), for a ``plan`` from :func:`four_step_plan`. Peak memory beyond ``x``: one complex
    buffer of ``len(x) / 2`` values plus per-thread chunks and pocketfft's line buffers.

    ``work``: a contiguous complex buffer of at least ``len(x) / 2`` values of ``x``'s
    precision to use as that buffer (a caller running several transforms in a row allocates it
    once: a fresh ``4 N`` bytes costs a page fault per page each time)."""
    n = x.shape[0]
    m1, m2 = plan
    m = n // 2
    ctype = np.complex64 if x.dtype == np.float32 else np.complex128
    if work is None:
        z = np.empty(m, dtype=ctype)
    else:
        if (
            work.dtype != ctype
            or work.ndim != 1
            or work.shape[0] < m
            or not work.flags.c_contiguous
        ):
            raise ValueError(
                f"work must be a contiguous 1-D {np.dtype(ctype).name} buffer of "
                f"at least {m} values"
            )
        z = work[:m]
    theta = math.pi / (2 * n)
    j = np.arange(min(_PRE_CHUNK, m), dtype=np.float64)
    table1, table5 = _exp_i(theta * j).astype(ctype), _exp_i(5 * theta * j).astype(ctype)
    _run(
        workers, lambda starts: _pre_twiddled(x, z, starts, table1, table5), range(0, m, _PRE_CHUNK)
    )
    z2 = z.reshape(m1, m2)
    out = scipy.fft.ifft(z2, axis=0, overwrite_x=True, workers=workers)
    if not np.shares_memory(out, z2):  # pragma: no cover - pocketfft works in place here
        z2[...] = out
    del out
    rows = _ROW_BLOCK
    _run(workers, lambda starts: _rows_out(z2, x, starts, rows), range(0, (m1 + 1) // 2, rows))
    return x
