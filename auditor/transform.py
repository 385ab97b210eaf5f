"""Back ends of the orthogonal canary transform ``R^T v`` (numpy/scipy and torch).

:class:`flaudit.auditor.canaries.OrthogonalCanaries` keeps the seed-derived parts (sign bits, block
boundaries); this module runs the sign flips and the orthonormal DCT-II / DCT-III blocks on one
of two back ends, chosen per call (:func:`resolve_backend`):

``torch``
    A DCT of even length ``N`` as Makhoul's reordering plus one complex FFT of length ``N/2``
    (the real input viewed as complex), with the pre- and post-twiddles done in chunks. It runs
    wherever the vector lives: on CUDA without a host copy when the update is a CUDA tensor, on
    the GPU when one is available (one host-to-device copy of the update), on the CPU otherwise.
    Peak memory of one DCT: the reordered input, the FFT's output and its one work buffer, i.e.
    ``3 x 4N`` bytes for float32, nothing kept between calls but ``d / 8`` bytes of sign bits per
    sign round (per device). On the CPU a long DCT-III runs the numpy four-step path below in
    the tensor's own memory.
``numpy``
    ``scipy.fft.dct`` / ``idct`` in place (pocketfft): the reference, and the fall-back without
    torch; a DCT-III of a length :func:`flaudit.auditor.fourstep.four_step_plan` accepts (from
    ``2^18``, the rounds' transforms ``R^T``) goes through :mod:`flaudit.auditor.fourstep`:
    batched short FFTs on ``workers`` threads, ``4N`` bytes beyond the vector.

Odd block lengths (a ``d`` whose 5-smooth block is odd, or an odd remainder block) go through
scipy on the CPU in both back ends.

Signs are stored as packed bits (``numpy.packbits`` order, bit set = ``-1``) and applied by
flipping the IEEE sign bit chunk by chunk (chunks on ``workers`` threads, :func:`map_chunks`):
exact, and ``d / 8`` bytes per sign round instead of ``4 d``. Nothing here sees the seed; the
sign bits are secret all the same (never printed).
"""

from __future__ import annotations

import importlib
import math
import os
import sys
import threading

import numpy as np
import scipy.fft

from .fourstep import dct3_four_step, four_step_plan
from .threads import run_groups


class _LazyTorch:
    """``torch``, imported on first use: the numpy path (every CPU-only service, the CLI) never
    pays torch's import (seconds, hundreds of MB). Falsy when torch cannot be imported."""

    _module = None
    _tried = False

    def _load(self):
        if not self._tried:
            type(self)._tried = True
            try:
                type(self)._module = importlib.import_module("torch")
            except ImportError:  # pragma: no cover - only where torch is missing
                type(self)._module = None
        return self._module

    def __bool__(self) -> bool:
        return self._load() is not None

    def __getattr__(self, name):
        module = self._load()
        if module is None:
            raise AttributeError(f"torch is not installed ({name})")
        return getattr(module, name)


torch = _LazyTorch()

__all__ = [
    "BACKENDS",
    "release_plans",
    "resolve_backend",
    "is_torch_tensor",
    "cuda_available",
    "SignBits",
    "sum_of_squares",
    "CHUNK",
]

BACKENDS = ("auto", "numpy", "torch")
CHUNK = 1 << 20  # elements per chunk of sign flips and twiddles (CPU); GPU chunks are 16x
_CPU_DEFAULT = os.environ.get("FLAUDIT_CPU_BACKEND", "numpy")  # measured: docs/benchmarks.md


def is_torch_tensor(value) -> bool:
    # a torch tensor exists only once something imported torch
    return "torch" in sys.modules and bool(torch) and isinstance(value, torch.Tensor)


def cuda_available() -> bool:
    # no NVIDIA driver, no CUDA: then torch is not imported just to ask
    return (
        os.path.exists("/proc/driver/nvidia/version") and bool(torch) and torch.cuda.is_available()
    )


def resolve_backend(backend: str, vector=None) -> tuple[str, str]:
    """``(backend, device)`` for one call: ``"torch"`` on the tensor's device for a torch tensor
    (``backend="numpy"`` moves it to the CPU); with ``"auto"``, torch on ``cuda`` when a GPU is
    available, else the CPU back end measured faster here (``FLAUDIT_CPU_BACKEND``, default
    numpy: at d = 10^9 on 2 cores it scores the service's round body in place, 1.10 x 4d
    extra, where torch copies it, 2.20 x 4d; docs/benchmarks.md)."""
    if backend not in BACKENDS:
        raise ValueError(
            f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}"
        )
    if backend == "numpy":
        return "numpy", "cpu"
    if backend == "torch" and not torch:
        raise ValueError("backend 'torch' needs torch installed")
    if is_torch_tensor(vector):
        return "torch", str(vector.device)
    if backend == "torch":
        return "torch", "cuda" if cuda_available() else "cpu"
    if cuda_available():
        return "torch", "cuda"
    return ("torch", "cpu") if _CPU_DEFAULT == "torch" and torch else ("numpy", "cpu")


def _chunk(device) -> int:
    return CHUNK * 16 if str(device).startswith("cuda") else CHUNK


_MIN_CHUNKS_PER_GROUP = 2  # fewer chunks than this per thread run on the calling thread: at d =
# 1.2M (two chunks, 1M + 0.2M) a second thread saved at most a sixth of a pass of ~1 ms and cost
# more CPU than that in hand-over and cache traffic (issue #41, docs/benchmarks.md)


def map_chunks(length: int, fn, *, workers: int = 1) -> list:
    """``[fn(a, b) for each CHUNK-long range [a, b) of [0, length)]``, in order, the ranges split
    into ``workers`` contiguous groups of at least two chunks run on the shared threads of
    :func:`flaudit.auditor.threads.run_groups` (numpy releases the GIL on long operations).
    The chunk boundaries do not depend on ``workers``, so neither do the results."""
    starts = list(range(0, length, CHUNK))

    def run(group):
        return [fn(a, min(a + CHUNK, length)) for a in group]

    count = min(workers, len(starts) // _MIN_CHUNKS_PER_GROUP)
    if count < 2:
        return run(starts)
    size = -(-len(starts) // count)
    groups = [starts[i : i + size] for i in range(0, len(starts), size)]
    return [value for part in run_groups(run, groups) for value in part]


# -- signs as bits ---------------------------------------------------------------------------------
class SignBits:
    """Random signs of one sign round, packed 8 per byte (bit set = ``-1``)."""

    def __init__(self, packed: np.ndarray, dim: int) -> None:
        self._packed = packed  # uint8, (dim + 7) // 8
        self.dim = dim
        self._on_device: dict[str, object] = {}

    def __repr__(self) -> str:  # never show the bits
        return f"SignBits(dim={self.dim})"

    def bits(self, start: int, stop: int) -> np.ndarray:
        """The bits of coordinates ``[start, stop)`` as a uint8 0/1 array."""
        first = start // 8
        raw = np.unpackbits(self._packed[first : (stop + 7) // 8])
        return raw[start - 8 * first : stop - 8 * first]

    def dense(self, dtype=np.float32) -> np.ndarray:
        """``+-1`` as a dense vector (for small ``d`` and tests)."""
        out = np.ones(self.dim, dtype=dtype)
        self.flip(out, 0)
        return out

    def flip(self, x: np.ndarray, offset: int, *, workers: int = 1) -> np.ndarray:
        """Multiply ``x`` (coordinates ``[offset, offset + len(x))``) by the signs, in place
        (chunks on ``workers`` threads)."""
        uint, shift = (np.uint32, 31) if x.dtype == np.float32 else (np.uint64, 63)
        raw = x.view(uint)

        def flip_chunk(a, b):
            raw[..., a:b] ^= self.bits(offset + a, offset + b).astype(uint) << uint(shift)

        map_chunks(x.shape[-1], flip_chunk, workers=workers if x.ndim == 1 else 1)
        return x

    # torch: the packed bytes go to the device once
    def _device_bytes(self, device):
        key = str(device)
        if key not in self._on_device:
            self._on_device[key] = torch.from_numpy(self._packed.copy()).to(device)
        return self._on_device[key]

    def flip_torch(self, x, offset: int):
        """Torch version of :meth:`flip` (``x`` a 1-D float32/float64 tensor on any device)."""
        packed = self._device_bytes(x.device)
        itype, shift = (torch.int32, 31) if x.dtype == torch.float32 else (torch.int64, 63)
        raw = x.view(itype)
        shifts = torch.arange(7, -1, -1, device=x.device, dtype=torch.uint8)
        step = _chunk(x.device)
        for a in range(0, x.shape[0], step):
            b = min(a + step, x.shape[0])
            first = (offset + a) // 8
            block = packed[first : (offset + b + 7) // 8]
            bits = ((block.unsqueeze(1) >> shifts) & 1).reshape(-1)
            lo = offset + a - 8 * first
            bits = bits[lo : lo + b - a].to(itype) << shift
            raw[a:b] ^= bits
        return x


def sum_of_squares(x, *, workers: int = 1) -> float:
    """``sum x_i^2`` accumulated in float64 chunk by chunk (no float64 copy of ``x``); the
    chunks' sums are added in order, so the result does not depend on ``workers`` (threads).

    No BLAS: each chunk is cast into a float64 buffer and reduced by ``np.einsum`` (its own
    loops, as ``optimize`` is off), so the audit's threads never enter OpenBLAS's thread pool
    (issue #28: ``np.dot`` here hung in ``exec_blas``). Torch tensors reduce by
    ``square().sum()`` (no BLAS either).
    """
    total = 0.0
    if is_torch_tensor(x):
        step = _chunk(x.device)
        for a in range(0, x.shape[0], step):
            total += float(x[a : a + step].double().square().sum())
        return total
    buffers = threading.local()

    def chunk_sum(a, b):
        c = x[a:b]
        if c.dtype != np.float64:
            if getattr(buffers, "f64", None) is None:
                buffers.f64 = np.empty(CHUNK, dtype=np.float64)
            c = np.copyto(buffers.f64[: b - a], c) or buffers.f64[: b - a]
        return float(np.einsum("i,i->", c, c))

    for value in map_chunks(x.shape[0], chunk_sum, workers=workers):
        total += value
    return total


# -- numpy back end ----------------------------------------------------------------------------------
_HALF = np.sqrt(0.5)
_BIG = 1 << 20  # plans of transforms this long or longer are not kept. A kept plan holds about
# 8L bytes (float32: 5 MiB at L = 600,000, measured); pocketfft keeps at most 16 per kind and dtype.
# Rebuilding the four plans of a d = 1.2M round cost ~7 ms CPU of its ~58 ms (issue #41), so
# plans below a half-length of 2^20 (d < 2.1M) are kept: at most 2 x 16 x 8 MiB per dtype.


_SPLIT_MIN = 1 << 18  # butterflies and (de)interleaves at least this long run on two threads


def _butterfly(x: np.ndarray, workers: int = 1) -> None:
    """In place on pairs ``(n, N-1-n)``: ``((a + b) / sqrt2, (a - b) / sqrt2)`` (symmetric and
    orthogonal; the middle element of an odd ``N`` is left alone). With ``workers >= 2`` and
    ``N >= _SPLIT_MIN`` the pairs are split in two halves run on two threads (disjoint pairs:
    the same result)."""
    n = x.shape[0]
    half = n // 2

    def pairs(span) -> None:
        for a in range(span[0], span[1], CHUNK):
            b = min(a + CHUNK, span[1])
            low = x[a:b].copy()
            high = x[n - b : n - a][::-1]  # x[N-1-j] for j in [a, b)
            x[a:b] += high
            x[a:b] *= _HALF
            low -= high
            low *= _HALF
            x[n - b : n - a] = low[::-1]

    if workers >= 2 and n >= _SPLIT_MIN:
        run_groups(pairs, [(0, half // 2), (half // 2, half)])
    else:
        pairs((0, half))


def _interleave(x: np.ndarray, out: np.ndarray) -> None:
    """``out[0::2] = x[:L]``, ``out[1::2] = (-1)^j x[L + j]`` (the DST-IV's sign folded in)."""
    half = x.shape[0] // 2
    out[0::2] = x[:half]
    odd = out[1::2]
    odd[...] = x[half:]
    odd[1::2] *= -1


def _deinterleave(x: np.ndarray, out: np.ndarray, workers: int = 1) -> None:
    """The transpose of :func:`_interleave` (its two halves on two threads when ``workers >= 2``
    and ``N >= _SPLIT_MIN``)."""
    half = x.shape[0] // 2

    def part(which: int) -> None:
        if which == 0:
            out[:half] = x[0::2]
        else:
            out[half:] = x[1::2]
            out[half + 1 :: 2] *= -1

    if workers >= 2 and x.shape[0] >= _SPLIT_MIN:
        run_groups(part, [0, 1])
    else:
        part(0)
        part(1)


_PLAN_CACHE = 16  # pocketfft keeps the 16 latest plans per transform kind and dtype


def release_plans(dtype) -> None:
    """Evict pocketfft's cached DCT-II/III and DST-IV plans of ``dtype``.

    A cached plan of length ``L`` holds about ``2L`` values of twiddles (``4d`` bytes for the
    half-length plans of a ``d``-vector), kept for the life of the process: in the service, a
    plan per model size ever audited. Sixteen tiny transforms push them out (the cache is LRU);
    rebuilding them costs a small fraction of the transform.
    """
    for n in range(2, 2 + _PLAN_CACHE):
        tiny = np.ones(n, dtype=dtype)
        scipy.fft.dct(tiny, type=2)
        scipy.fft.dst(tiny, type=4)


def _half_transforms(x: np.ndarray, *, inverse: bool, workers: int) -> None:
    """In place: DCT-II (DCT-III when ``inverse``) on the first half, DST-IV on the second.

    Halves of ``_BIG`` or more: one after the other, each transform's cached plan released
    before the next (one plan alive at a time). Shorter halves keep their plans and, with
    ``workers >= 2``, run at the same time on two threads (pocketfft runs a 1-D transform on
    one thread and releases the GIL): about half the wall time on two idle cores, the same CPU."""
    half = x.shape[0] // 2
    first = scipy.fft.idct if inverse else scipy.fft.dct

    def run(job) -> None:
        fn, part, kind = job
        out = fn(part, type=kind, norm="ortho", workers=workers, overwrite_x=True)
        if not np.shares_memory(out, part):
            part[...] = out
        del out
        if half >= _BIG:
            release_plans(x.dtype)

    jobs = [(first, x[:half], 2), (scipy.fft.dst, x[half:], 4)]
    if half < _BIG and workers >= 2:
        run_groups(run, jobs)
    else:
        for job in jobs:
            run(job)


def dct_numpy(
    x: np.ndarray, *, inverse: bool, workers: int, work: np.ndarray | None = None
) -> np.ndarray:
    """Orthonormal DCT-II of the 1-D ``x`` (DCT-III, its transpose, when ``inverse``) in place.

    Even ``N = 2L``: ``T_N = P diag(T_L, D S4_L) B`` -- the butterfly ``B`` of ``x_n`` with
    ``x_{N-1-n}``, a DCT-II and a DST-IV of length ``L`` in place on the halves (``S4`` of the
    reversed difference is ``D T4`` with ``D = diag((-1)^j)``), and the interleave ``P``. Peak
    memory beyond ``x``: pocketfft's buffers for half the length, or the interleaved copy
    (``4N`` bytes in float32), instead of ``3 x 4N`` for one length-``N`` pocketfft DCT.
    Odd ``N``: that one DCT in place. ``work``: the four-step transform's complex buffer
    (:func:`flaudit.auditor.fourstep.dct3_four_step`), when the caller holds one.
    """
    n = x.shape[0]
    plan = four_step_plan(n) if inverse and x.flags.c_contiguous else None
    if plan is not None:  # long vectors: a four-step FFT on every core, 4N bytes beyond x
        return dct3_four_step(x, plan, workers=workers, work=work)
    if n % 2 or n < 2:
        out = (scipy.fft.idct if inverse else scipy.fft.dct)(
            x, type=2, norm="ortho", workers=workers, overwrite_x=True
        )
        if not np.shares_memory(out, x):
            x[...] = out
        del out
        if n >= _BIG:
            release_plans(x.dtype)
        return x
    scratch = np.empty_like(x)  # the (de)interleave is out of place; x keeps the result
    if inverse:  # T^T = B diag(T_L^T, S4 D) P^T
        _deinterleave(x, scratch, workers)
        x[...] = scratch
        del scratch
        _half_transforms(x, inverse=True, workers=workers)
        _butterfly(x, workers)
        return x
    del scratch  # allocated again below, after pocketfft's buffers are gone
    _butterfly(x, workers)
    _half_transforms(x, inverse=False, workers=workers)
    scratch = np.empty_like(x)
    _interleave(x, scratch)
    x[...] = scratch
    return x


# -- torch back end -------------------------------------------------------------------------------------
def _twiddle(a: int, b: int, numerator: float, denominator: int, dtype, device):
    """``exp(i pi numerator k / denominator)`` for ``k = a..b-1`` (angles in ``dtype``: float32
    angles are exact to ~1e-7 rad, float32 precision)."""
    angle = torch.arange(a, b, device=device, dtype=dtype) * (math.pi * numerator / denominator)
    return torch.complex(torch.cos(angle), torch.sin(angle))


def _complex_of(dtype):
    return torch.complex64 if dtype == torch.float32 else torch.complex128


def _reversed(t, lo: int, hi: int):
    """``t[j]`` for ``j = hi-1, hi-2, ..., lo`` (a flipped slice)."""
    return t[lo:hi].flip(0)


def dct2_torch(box: list):
    """Orthonormal DCT-II of the 1-D tensor ``box.pop()`` (even length; consumed), a new tensor.

    Makhoul: ``v = (x_0, x_2, ..., x_3, x_1)``; ``Z = FFT_{N/2}(v_even + i v_odd)``; the real FFT
    ``V_k`` of ``v`` from ``Z_k`` and ``conj(Z_{N/2-k})``; ``X_k = Re(e^{-i pi k / 2N} V_k)`` and
    ``X_{N-k} = -Im(...)``, scaled to the orthonormal DCT. Pre- and post-processing run on
    slices of ``CHUNK`` elements: peak memory is ``v``, ``Z`` and the FFT's work buffer.
    """
    x = box.pop()
    n, dtype, device = x.shape[0], x.dtype, x.device
    m = n // 2
    step = _chunk(device)
    w = torch.empty_like(x)
    w[:m] = x[0::2]
    for a in range(0, m, step):  # w[m:] = reversed odd samples, in chunks (flip copies)
        b = min(a + step, m)
        w[n - b : n - a] = x[2 * a + 1 : 2 * b : 2].flip(0)
    del x
    z = torch.fft.fft(w.view(_complex_of(dtype)))
    del w
    out = torch.empty(n, dtype=dtype, device=device)
    root_half = math.sqrt(2.0 / n)
    for a in range(0, m, step):  # k in [a, b), 0 <= k < M
        b = min(a + step, m)
        zk = z[a:b]
        if a == 0:  # Z_{M-0} = Z_0
            zc = torch.cat((z[0:1], _reversed(z, m - b + 1, m))).conj()
        else:
            zc = _reversed(z, m - b + 1, m - a + 1).conj()
        even = (zk + zc) * 0.5
        odd = (zk - zc) * (-0.5j)
        del zk, zc
        y = even + _twiddle(a, b, -2.0, n, dtype, device) * odd
        del even, odd
        y *= _twiddle(a, b, -1.0, 2 * n, dtype, device)
        out[a:b] = y.real * root_half
        lo = max(a, 1)  # X_{N-k} for 1 <= k < M
        if b > lo:
            out[n - b + 1 : n - lo + 1] = (y.imag[lo - a :] * -root_half).flip(0)
        del y
    out[0] *= math.sqrt(0.5)
    z0 = z[0]
    out[m] = (z0.real - z0.imag) * math.cos(math.pi / 4) * root_half  # k = M: V_M real
    return out


def dct3_torch(box: list):
    """Orthonormal DCT-III (the transpose of :func:`dct2_torch`) of ``box.pop()`` (consumed).

    ``Y_k = C_k - i C_{N-k}`` from the coefficients, ``V_k = e^{i pi k / 2N} Y_k``, then the
    half-length spectrum ``Z_k = E_k + i O_k`` with ``E_k = (V_k + conj V_{M-k}) / 2`` and
    ``O_k = (V_k - conj V_{M-k}) e^{2 pi i k / N} / 2``; ``z = IFFT_M(Z)`` interleaves
    ``v_even, v_odd``, and ``x`` un-reorders ``v``.
    """
    coef = box.pop()
    n, dtype, device = coef.shape[0], coef.dtype, coef.device
    m = n // 2
    step = _chunk(device)
    up = math.sqrt(n / 2.0)
    z = torch.empty(m, dtype=_complex_of(dtype), device=device)
    for a in range(0, m, step):  # k in [a, b), 0 <= k < M
        b = min(a + step, m)
        if a == 0:  # -C_{N-k}: none for k = 0
            imag = torch.cat((coef.new_zeros(1), _reversed(coef, n - b + 1, n)))
        else:
            imag = _reversed(coef, n - b + 1, n - a + 1)
        yk = torch.complex(coef[a:b], -imag)
        del imag
        if a == 0:
            yk[0] = yk[0] * math.sqrt(2.0)
        # Y_{M-k} = C_{M-k} - i C_{M+k}  (M - k >= 1 here)
        ym = torch.complex(_reversed(coef, m - b + 1, m - a + 1), -coef[m + a : m + b])
        t = _twiddle(a, b, 1.0, 2 * n, dtype, device)  # e^{i pi k / 2N}
        vk = yk * t
        del yk
        # e^{i pi (M-k) / 2N} = e^{i pi / 4} conj(t)
        vc = (ym * t.conj() * complex(math.cos(math.pi / 4), math.sin(math.pi / 4))).conj()
        del ym, t
        odd = (vk - vc) * _twiddle(a, b, 2.0, n, dtype, device)
        vk += vc
        del vc
        z[a:b] = (vk + 1j * odd) * (0.5 * up)
        del vk, odd
    del coef
    z = torch.fft.ifft(z)
    v = torch.view_as_real(z).reshape(n)
    out = torch.empty(n, dtype=dtype, device=device)
    out[0::2] = v[:m]
    for a in range(0, m, step):
        b = min(a + step, m)
        out[2 * a + 1 : 2 * b : 2] = v[n - b : n - a].flip(0)
    return out


def dct_torch(box: list, *, inverse: bool, workers: int, work: np.ndarray | None = None):
    """DCT-II / DCT-III of the tensor ``box.pop()``; odd lengths through scipy on the CPU.

    A long DCT-III of a CPU tensor runs the numpy four-step transform in the tensor's own
    memory (:mod:`flaudit.auditor.fourstep`; ``4N`` bytes beyond it, on ``workers`` threads)
    instead of torch's FFT (the reordered input, the FFT's output and its work buffer)."""
    x = box[0]
    plan = four_step_plan(x.shape[0]) if inverse and x.device.type == "cpu" else None
    if plan is not None and x.is_contiguous() and x.dtype in (torch.float32, torch.float64):
        x = box.pop()
        dct3_four_step(
            x.numpy(), plan, workers=workers, work=work
        )  # in place: x and its view share memory
        return x
    if box[0].shape[0] % 2 == 0:
        return dct3_torch(box) if inverse else dct2_torch(box)
    x = box.pop()
    host = x.cpu().numpy()
    host = dct_numpy(host, inverse=inverse, workers=workers)
    return torch.from_numpy(host).to(x.device) if x.device.type != "cpu" else torch.from_numpy(host)
