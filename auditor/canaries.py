"""Canary clients: secret unit vectors regenerated from the audit's master seed.

Two families (:class:`CanaryFamily`), chosen per audit:

``orthogonal`` (default where ``k <= d``)
    Canary ``j`` is column ``pi(j)`` of a random orthogonal matrix
    ``R = S4 A S3 B S2 A S1``: ``S1..S4`` are diagonal matrices of random signs; ``A`` and ``B``
    are orthonormal DCT-IIs (``scipy.fft.dct(norm="ortho")``) on two blocks of coordinates,
    ``A`` on ``[0, n)`` and ``[n, d)``, ``B`` on ``[0, d - n)`` and ``[d - n, d)``, where ``n``
    is the largest 5-smooth length ``<= d`` (so every transform has a fast length whatever
    ``d``: a prime-factor length costs ~10x more in pocketfft). The shifted block boundaries
    let the small block mix with the large one from one round to the next; three rounds spread
    any fixed vector. When ``d`` is itself 5-smooth, ``A = B = T`` (the plain DCT) and two
    rounds do, ``R = S3 T S2 T S1``. ``pi`` is a keyed
    pseudo-random injection of the canary indices into ``0..d-1`` (a Feistel permutation with
    cycle walking: no table, ``O(k)`` memory for ``k`` indices). The canaries are exactly
    orthonormal, so canary ``j``'s own contribution projects only onto canary ``j`` (no
    canary-canary interference at any ``k/d``) and isotropic noise ``N(0, sigma^2 I)`` projects
    onto them as independent ``N(0, sigma^2)`` values. All ``k`` cosines of a vector ``v`` are
    ``(R^T v)[pi(0..k-1)] / ||v||``: one fast transform ``R^T`` whatever ``k`` (three DCTs,
    ``O(d log d)`` time, ``O(d)`` memory), see :class:`OrthogonalCanaries`.
``gaussian``
    Canary ``j`` is ``z_j / ||z_j||`` with ``z_j ~ N(0, I_d)`` drawn from a Philox (counter-based)
    generator keyed by ``(master seed, j)``: canaries are independent and uniform on the sphere
    (Andrew et al. 2024), nearly but not exactly orthogonal (they interfere when ``k/d`` is not
    small, Keinan et al. 2025). Scoring costs ``k d`` per vector.

Both are keyed by the secret seed through their own ``SeedSequence`` spawn keys (the seen/unseen
split stream is shared and unchanged), regenerated on demand and never stored. Each canary is
secretly *seen* (inserted into training) or *unseen* (held out) with probability 1/2.

The master seed is a secret: nothing here prints, logs or returns it (nor the signs and keys
derived from it).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from enum import Enum

import numpy as np
import scipy.fft

from .fourstep import four_step_work
from .transform import SignBits, dct_numpy, dct_torch, is_torch_tensor, resolve_backend, torch
from .validation import check_at_least, check_integer_at_least

__all__ = [
    "CanaryFamily",
    "Canaries",
    "OrthogonalCanaries",
    "new_master_seed",
    "resolve_canary_family",
    "canary_vector",
    "canary_vectors",
    "canary_sum",
    "iter_canary_chunks",
    "seen_mask",
]

_CANARY_STREAM = 0  # gaussian family: spawn key (0, j) per canary
_SPLIT_STREAM = 1  # seen/unseen split (both families)
_ORTHOGONAL_STREAM = 2  # orthogonal family: (2, 0..3) signs, (2, 4) permutation keys

_SIGN_ROUNDS = 4  # sign streams reserved: S1..S4 (a 5-smooth d uses S1..S3)
_FEISTEL_ROUNDS = 6
#: Blocks shorter than this take pocketfft's DCT-II directly in :meth:`OrthogonalCanaries.sum_of`
#: (its buffers, up to ``3 x 4N`` bytes in float32, are at most ~200 MB there); longer ones the
#: butterfly route of :func:`flaudit.auditor.transform.dct_numpy` (buffers at half length).
_DIRECT_FORWARD = 1 << 24


class CanaryFamily(str, Enum):
    """How an audit's canaries are drawn (see the module docstring)."""

    orthogonal = "orthogonal"  # columns of a random sign + DCT orthogonal transform
    gaussian = "gaussian"  # iid uniform on the sphere


def resolve_canary_family(
    family: CanaryFamily | str | None, *, num_canaries: int, dim: int
) -> CanaryFamily:
    """The canary family an audit uses: ``family``, or the default rule when it is ``None``.

    The default is ``orthogonal`` where ``num_canaries <= dim`` (an orthonormal set of ``k``
    vectors needs ``k <= d``), else ``gaussian``. The ServerApp and the auditor both call this
    with the spec's ``canary_family``, ``k`` and the model's ``d``, so they agree.

    Raises
    ------
    ValueError
        Naming ``canary_family`` for an unknown family, or ``orthogonal`` with ``k > d``.
    """
    check_at_least(num_canaries, "num_canaries", 1)
    check_at_least(dim, "dim", 1)
    if family is None:
        return CanaryFamily.orthogonal if num_canaries <= dim else CanaryFamily.gaussian
    try:
        family = CanaryFamily(family)
    except ValueError:
        choices = ", ".join(repr(f.value) for f in CanaryFamily)
        raise ValueError(f"canary_family must be one of {choices}, got {family!r}") from None
    if family is CanaryFamily.orthogonal and num_canaries > dim:
        raise ValueError(
            f"canary_family: 'orthogonal' needs num_canaries <= d, got {num_canaries} canaries "
            f"for d={dim}; use 'gaussian' or fewer canaries"
        )
    return family


def new_master_seed() -> int:
    """Draw a fresh 128-bit secret master seed from the OS entropy pool."""
    return secrets.randbits(128)


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError("seed must be an integer")
    if seed < 0:
        raise ValueError("seed must be non-negative")
    return int(seed)


def _check_dim(dim: int) -> int:
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 2:
        raise ValueError(f"dim must be an integer >= 2, got {dim!r}")
    return int(dim)


def _check_family(family: CanaryFamily | str) -> CanaryFamily:
    try:
        return CanaryFamily(family)
    except ValueError:
        choices = ", ".join(repr(f.value) for f in CanaryFamily)
        raise ValueError(f"family must be one of {choices}, got {family!r}") from None


def _check_indices(indices: Sequence[int] | np.ndarray) -> np.ndarray:
    indices = np.asarray(indices, dtype=np.int64).reshape(-1)
    if indices.size and indices.min() < 0:
        raise ValueError("indices must be >= 0")
    return indices


def _default_fft_workers() -> int:
    """The cores this process is given (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _largest_fast_length(dim: int) -> int:
    """The largest ``2^a 3^b 5^c <= dim`` (pocketfft's fast real lengths)."""
    best, p2 = 1, 1
    while p2 <= dim:
        p3 = p2
        while p3 <= dim:
            p5 = p3
            while p5 <= dim:
                best = max(best, p5)
                p5 *= 5
            p3 *= 3
        p2 *= 2
    return best


def _generator(seed: int, stream: int, index: int = 0) -> np.random.Generator:
    sequence = np.random.SeedSequence(entropy=seed, spawn_key=(stream, index))
    return np.random.Generator(np.random.Philox(sequence))


# -- orthogonal family --------------------------------------------------------------------------
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _mix64(x: np.ndarray, key: np.uint64) -> np.ndarray:
    """SplitMix64's finaliser of ``x + key`` (uint64, wrapping): the Feistel round function."""
    with np.errstate(over="ignore"):
        z = x + key
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


class OrthogonalCanaries:
    """The orthogonal canary family of one audit at dimension ``d``.

    Holds only what is derived from the seed (three or four sign rounds as packed bits, six
    64-bit permutation keys): memory ``3 d / 8`` or ``d / 2`` bytes. Canary ``j`` is ``R e_{pi(j)}`` with
    ``R = S4 A S3 B S2 A S1``, or ``S3 T S2 T S1`` when ``d`` is 5-smooth (module docstring).

    Parameters
    ----------
    seed : int
        The audit's secret master seed (not kept).
    dim : int
        Model dimension ``d >= 2``.
    workers : int, optional
        Threads of ``scipy.fft``; results do not depend on it. Default: 2 (or 1 on one core).
    """

    def __init__(
        self, seed: int, dim: int, *, workers: int | None = None, backend: str = "auto"
    ) -> None:
        seed = _check_seed(seed)
        self.dim = _check_dim(dim)
        if workers is None:
            workers = _default_fft_workers()
        check_integer_at_least(workers, "workers", 1)
        self.workers = int(workers)
        resolve_backend(backend)  # validates the name
        self.backend = backend
        nbytes = (self.dim + 7) // 8
        self._split = _largest_fast_length(self.dim)  # A: [0, n) + [n, d); B: [0, d-n) + [d-n, d)
        # two rounds spread any vector when A = B = T (d 5-smooth), three with two blocks
        self._rounds = 2 if self._split == self.dim else 3
        # packed bits (bit set = -1), d / 8 bytes per sign round; applied by flipping sign bits
        self._sign_bits = [
            SignBits(
                np.frombuffer(_generator(seed, _ORTHOGONAL_STREAM, r).bytes(nbytes), np.uint8),
                self.dim,
            )
            for r in range(self._rounds + 1)
        ]
        self._keys = _generator(seed, _ORTHOGONAL_STREAM, _SIGN_ROUNDS).integers(
            0, 2**64, size=_FEISTEL_ROUNDS, dtype=np.uint64, endpoint=False
        )
        half_bits = max(1, (int(self.dim - 1).bit_length() + 1) // 2)
        self._half_bits = np.uint64(half_bits)
        self._half_mask = np.uint64((1 << half_bits) - 1)

    def __repr__(self) -> str:  # never show the seed, signs or keys
        return f"OrthogonalCanaries(dim={self.dim})"

    # -- the injection pi ---------------------------------------------------------------------
    def _feistel(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._half_bits, x & self._half_mask
        for key in self._keys:
            left, right = right, left ^ (_mix64(right, key) & self._half_mask)
        return (left << self._half_bits) | right

    def positions(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """``pi(indices)``: the coordinates of ``R^T v`` holding those canaries' cosines.

        ``pi`` is a keyed permutation of ``0..d-1`` (Feistel network on the smallest even
        power of two ``>= d``, cycle-walked into ``[0, d)``): injective, ``O(len(indices))``
        memory, and canary ``j``'s position does not depend on how many canaries there are.

        Raises
        ------
        ValueError
            If an index is negative or ``>= d`` (the family has only ``d`` canaries).
        """
        indices = _check_indices(indices)
        if indices.size and indices.max() >= self.dim:
            raise ValueError(
                f"indices must be < d={self.dim}: the orthogonal family has at most d canaries"
            )
        out = self._feistel(indices.astype(np.uint64))
        outside = np.flatnonzero(out >= np.uint64(self.dim))
        while outside.size:  # cycle walking: expected < 4 passes, as the domain is < 4 d
            out[outside] = self._feistel(out[outside])
            outside = outside[out[outside] >= np.uint64(self.dim)]
        return out.astype(np.int64)

    # -- the transform R and its transpose ---------------------------------------------------
    def _cuts(self, first: bool) -> list[tuple[int, int]]:
        cut = self._split if first else self.dim - self._split
        return [(a, b) for a, b in ((0, cut), (cut, self.dim)) if b > a]

    def _blocks(
        self, x: np.ndarray, *, first: bool, inverse: bool, work: np.ndarray | None = None
    ) -> np.ndarray:
        """``A`` (``first``) or ``B`` applied along the last axis in place, or their transposes
        (``work``: the four-step transforms' buffer, :func:`flaudit.auditor.fourstep.four_step_work`)."""
        for a, b in self._cuts(first):
            if x.ndim == 1 and not inverse and b - a < _DIRECT_FORWARD:
                # R's forward DCT-II (sum_of): pocketfft's in place, ~30% less time than the
                # butterfly route below (which keeps pocketfft's buffers at half length, for
                # long vectors); the same orthonormal transform
                block = x[a:b]
                out = scipy.fft.dct(
                    block, type=2, norm="ortho", workers=self.workers, overwrite_x=True
                )
                if not np.shares_memory(out, block):
                    block[...] = out
                del out
            elif x.ndim == 1:
                dct_numpy(x[a:b], inverse=inverse, workers=self.workers, work=work)
            else:  # rows: scipy copies the strided block
                x[..., a:b] = (
                    scipy.fft.dct(x[..., a:b], type=2, norm="ortho", axis=-1, workers=self.workers)
                    if not inverse
                    else scipy.fft.idct(
                        x[..., a:b], type=2, norm="ortho", axis=-1, workers=self.workers
                    )
                )
        return x

    def _blocks_torch(
        self, pieces: list, *, first: bool, inverse: bool, work: np.ndarray | None = None
    ) -> list:
        """Torch: the working vector as its blocks (consumed); returns the transformed blocks."""
        cuts = self._cuts(first)
        if [p.shape[0] for p in pieces] != [b - a for a, b in cuts]:  # re-split (non-5-smooth d)
            whole = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
            pieces.clear()
            pieces.extend(whole[a:b].clone() for a, b in cuts)
            del whole
        out = []
        while pieces:
            box = [pieces.pop(0)]
            out.append(dct_torch(box, inverse=inverse, workers=self.workers, work=work))
        return out

    def transpose_apply(self, vector, *, backend: str | None = None, consume: bool = False):
        """``R^T v = S1 A^T S2 B^T S3 A^T S4 v`` (``S1 T^T S2 T^T S3 v`` for a 5-smooth ``d``),
        ``v`` unchanged. float32 out (float64 for a float64 ``v``).

        ``backend`` (default: this object's, ``"auto"``) picks numpy/scipy or torch per call
        (:func:`flaudit.auditor.transform.resolve_backend`): a torch tensor is transformed on its
        own device and a torch tensor comes back; a numpy array comes back as numpy. Costs two or
        three fast transforms; ``(R^T v)[pi(j)] = <c_j, v>``. Peak memory beyond ``v``: the working
        copy plus ``4d`` bytes (the four-step DCT-III's complex buffer, long blocks whose half
        length factors, :mod:`flaudit.auditor.fourstep`), at most ``3 x 4d`` otherwise (even
        block lengths); ``consume=True`` lets the numpy back end transform a
        writable float32/float64 ``v`` in place (no working copy: the service's round body,
        read once and scored once), so ``v`` is then overwritten.
        """
        kind, device = resolve_backend(backend or self.backend, vector)
        if kind == "numpy":
            if is_torch_tensor(vector):
                vector = vector.detach().cpu().numpy()
            dtype = np.float64 if np.asarray(vector).dtype == np.float64 else np.float32
            in_place = (
                consume
                and isinstance(vector, np.ndarray)
                and vector.dtype == dtype
                and vector.ndim == 1
                and vector.flags.c_contiguous
                and vector.flags.writeable
            )
            x = vector if in_place else np.array(vector, dtype=dtype, copy=True)
            # one buffer for the two or three transforms: a fresh 4d bytes each time would cost
            # a page fault per page (~0.3 s a transform at d = 10^8)
            work = four_step_work(
                {b - a for first in (True, False) for a, b in self._cuts(first)}, dtype
            )
            self._sign_bits[self._rounds].flip(x, 0, workers=self.workers)
            for r in range(self._rounds, 0, -1):
                self._blocks(x, first=r % 2 == 1, inverse=True, work=work)
                self._sign_bits[r - 1].flip(x, 0, workers=self.workers)
            return x
        back_to_numpy = not is_torch_tensor(vector)
        if back_to_numpy:
            source = torch.from_numpy(np.ascontiguousarray(vector))
        else:
            source = vector.detach()
        dtype = torch.float64 if source.dtype == torch.float64 else torch.float32
        pieces = [source.to(device=device, dtype=dtype, copy=True)]
        del source
        # on the CPU, one four-step buffer for both transforms where d is 5-smooth (one block:
        # with two, re-splitting the blocks between transforms would hold a third 4d bytes)
        work = (
            four_step_work([self.dim], np.float64 if dtype == torch.float64 else np.float32)
            if device == "cpu" and self._split == self.dim
            else None
        )
        self._sign_bits[self._rounds].flip_torch(pieces[0], 0)
        for r in range(self._rounds, 0, -1):
            pieces = self._blocks_torch(pieces, first=r % 2 == 1, inverse=True, work=work)
            offset = 0
            for piece in pieces:
                self._sign_bits[r - 1].flip_torch(piece, offset)
                offset += piece.shape[0]
        y = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        del pieces
        return y.cpu().numpy() if back_to_numpy else y

    def _apply(self, x: np.ndarray) -> np.ndarray:
        """``R x`` along the last axis in place (numpy), ``x`` already carrying ``S1``."""
        for r in range(1, self._rounds + 1):
            x = self._blocks(x, first=r % 2 == 1, inverse=False)
            self._sign_bits[r].flip(x, 0)
        return x

    def dots(self, vector, positions: np.ndarray, *, backend: str | None = None) -> np.ndarray:
        """``<c_j, v>`` for the canaries at ``positions`` (from :meth:`positions`), float64."""
        y = self.transpose_apply(vector, backend=backend)
        if is_torch_tensor(y):
            return y[torch.as_tensor(positions, device=y.device)].double().cpu().numpy()
        return y[positions].astype(np.float64)

    def sum_of(self, indices: Sequence[int] | np.ndarray, *, dtype=np.float64) -> np.ndarray:
        """``sum_j c_j`` over ``indices``: ``R (sum_j s1 e_{pi(j)})``, float64 by default.

        One transform ``R`` whatever the number of canaries (``O(d log d)``); each canary enters
        with norm 1 to ``dtype``'s precision (float32: ``4 d`` bytes out, for serving the sum).
        """
        positions = self.positions(indices)
        x = np.zeros(self.dim, dtype=dtype)
        np.add.at(x, positions, self._sign_value(positions, dtype))  # repeats count twice
        return self._apply(x) if positions.size else x

    def _sign_value(self, positions: np.ndarray, dtype) -> np.ndarray:
        """``S1`` at ``positions`` as ``+-1`` of ``dtype``."""
        packed = self._sign_bits[0]._packed
        bits = (packed[positions // 8] >> (7 - positions % 8).astype(np.uint8)) & 1
        return (1 - 2 * bits.astype(np.int8)).astype(dtype)

    def vectors(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """Canaries ``indices`` as rows, float32 ``(len(indices), d)``: ``R e_{pi(j)}``."""
        positions = self.positions(indices)
        out = np.zeros((positions.size, self.dim), dtype=np.float32)
        rows = np.arange(positions.size)
        out[rows, positions] = self._sign_value(positions, np.float32)
        return self._apply(out) if positions.size else out


# -- gaussian family ----------------------------------------------------------------------------
def _fill_gaussian(seed: int, index: int, out: np.ndarray) -> None:
    """Write gaussian canary ``index`` into the float32 vector ``out`` (no validation, no copy)."""
    _generator(seed, _CANARY_STREAM, index).standard_normal(out.shape[0], dtype=np.float32, out=out)
    norm = np.sqrt(np.sum(np.square(out), dtype=np.float64))
    out /= np.float32(norm)


def _gaussian_vectors(seed: int, indices: np.ndarray, dim: int, workers: int) -> np.ndarray:
    out = np.empty((indices.size, dim), dtype=np.float32)

    def fill(row: int) -> None:
        _fill_gaussian(seed, int(indices[row]), out[row])

    if workers == 1 or indices.size < 2:
        for row in range(indices.size):
            fill(row)
    else:
        with ThreadPoolExecutor(max_workers=min(workers, indices.size)) as pool:
            list(pool.map(fill, range(indices.size)))
    return out


# -- one interface for both -----------------------------------------------------------------------
class Canaries:
    """One audit's canaries of one family at dimension ``d``, regenerated round after round.

    Derives what the seed determines once (the orthogonal family's signs and permutation keys,
    ``3 d / 8``-``d / 2`` bytes of sign bits; the gaussian family needs only the seed) so that a loop calling
    :meth:`sum_of` or :meth:`vectors` every round does not redo it (0.02 s at d = 1.2M). Never
    shows the seed or anything derived from it.

    Parameters
    ----------
    seed : int
        The audit's secret master seed.
    dim : int
        Model dimension ``d >= 2``.
    family : CanaryFamily or str
        The audit's family, from :func:`resolve_canary_family`.
    workers : int, optional
        Threads generating gaussian rows (numpy's generators release the GIL while filling) or
        running the orthogonal family's transforms; results do not depend on it. Default 1.
    """

    def __init__(
        self, seed: int, dim: int, *, family: CanaryFamily | str, workers: int = 1
    ) -> None:
        seed = _check_seed(seed)
        self.dim = _check_dim(dim)
        self.family = _check_family(family)
        check_integer_at_least(workers, "workers", 1)
        self.workers = int(workers)
        self._orthogonal = None
        self._seed = None
        if self.family is CanaryFamily.orthogonal:
            self._orthogonal = OrthogonalCanaries(seed, self.dim, workers=self.workers)
        else:
            self._seed = seed

    def __repr__(self) -> str:  # never show the seed, signs or keys
        return f"Canaries(dim={self.dim}, family={self.family.value})"

    def vectors(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """Canaries ``indices`` stacked as float32 ``(len(indices), d)``, unit norm each."""
        indices = _check_indices(indices)
        if self._orthogonal is not None:
            return self._orthogonal.vectors(indices)
        return _gaussian_vectors(self._seed, indices, self.dim, self.workers)

    def sum_of(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """``sum_j c_j`` over ``indices`` (a repeated index counts as often as it appears),
        float64 ``(d,)``; each canary enters with norm 1 to float64 precision.

        What a round adds for its scheduled seen canaries (times the clip norm): one fast
        transform for the orthogonal family whatever their number; the gaussian family
        generates each canary (in chunks of 64) and renormalises it in float64.
        """
        indices = _check_indices(indices)
        if self._orthogonal is not None:
            return self._orthogonal.sum_of(indices)
        total = np.zeros(self.dim, dtype=np.float64)
        for start in range(0, indices.size, 64):
            block = _gaussian_vectors(
                self._seed, indices[start : start + 64], self.dim, self.workers
            )
            for row in block.astype(np.float64):
                total += row / np.sqrt(np.einsum("i,i->", row, row))  # no BLAS (issue #28)
        return total


def canary_vector(seed: int, index: int, dim: int, *, family: CanaryFamily | str) -> np.ndarray:
    """Return canary ``index`` of ``family`` as a float32 unit vector of length ``dim``.

    Parameters
    ----------
    seed : int
        The audit's secret master seed.
    index : int
        Canary index ``j >= 0`` (``j < d`` for the orthogonal family).
    dim : int
        Model dimension ``d >= 2``.
    family : CanaryFamily or str
        The audit's family, from :func:`resolve_canary_family`.

    Returns
    -------
    numpy.ndarray
        Shape ``(dim,)``, dtype float32, Euclidean norm 1 (to float32 precision).
    """
    check_at_least(index, "index", 0)
    return canary_vectors(seed, [int(index)], dim, family=family)[0]


def canary_vectors(
    seed: int,
    indices: Sequence[int] | np.ndarray,
    dim: int,
    *,
    family: CanaryFamily | str,
    workers: int = 1,
) -> np.ndarray:
    """Return the canaries ``indices`` of ``family`` stacked as float32 ``(len(indices), dim)``.

    One call of :meth:`Canaries.vectors` (a loop over rounds should keep one :class:`Canaries`).
    ``workers`` as there; memory is that of the output.
    """
    return Canaries(seed, dim, family=family, workers=workers).vectors(indices)


def canary_sum(
    seed: int,
    indices: Sequence[int] | np.ndarray,
    dim: int,
    *,
    family: CanaryFamily | str,
    workers: int = 1,
) -> np.ndarray:
    """``sum_j c_j`` over the canaries ``indices`` of ``family``, float64 ``(dim,)``.

    One call of :meth:`Canaries.sum_of` (a loop over rounds should keep one :class:`Canaries`).
    """
    return Canaries(seed, dim, family=family, workers=workers).sum_of(indices)


def iter_canary_chunks(
    seed: int,
    num_canaries: int,
    dim: int,
    chunk_size: int = 64,
    *,
    family: CanaryFamily | str,
    workers: int = 1,
) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(start, block)`` with ``block = canaries[start:start + chunk_size]``.

    Memory is ``O(chunk_size * dim)``; the blocks concatenate to the same array whatever the
    chunk size.
    """
    if chunk_size < 1:
        raise ValueError("chunk_size must be >= 1")
    family = _check_family(family)
    for start in range(0, num_canaries, chunk_size):
        stop = min(start + chunk_size, num_canaries)
        yield (
            start,
            canary_vectors(seed, np.arange(start, stop), dim, family=family, workers=workers),
        )


def seen_mask(seed: int, num_canaries: int) -> np.ndarray:
    """Return the secret seen/unseen split: ``True`` where canary ``j`` is seen (inserted).

    Each canary is seen independently with probability 1/2 (the same split for both families).
    """
    seed = _check_seed(seed)
    if num_canaries < 0:
        raise ValueError("num_canaries must be >= 0")
    return _generator(seed, _SPLIT_STREAM).random(num_canaries) < 0.5
