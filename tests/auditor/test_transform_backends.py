"""The orthogonal canary transform's back ends (numpy/scipy and torch on the CPU) agree with each
other and with a dense float64 reference, and an audit's cosines and estimates do not depend on
which one ran (issue #23)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.fft

from flaudit.auditor import transform
from flaudit.auditor.canaries import OrthogonalCanaries, seen_mask
from flaudit.auditor.statistics import CosineTracker
from flaudit.server.simulated_audit import FedAvgSimulation, audit_epsilons, simulate_dpfedavg_audit

torch = pytest.importorskip("torch")

SEED = 0x5EED_CAFE


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 7 elements: every chunk boundary case of the chunked passes is exercised."""
    monkeypatch.setattr(transform, "CHUNK", 7)


@pytest.mark.parametrize("n", [2, 4, 6, 10, 30, 97, 1000, 3072])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_dct_back_ends_match_scipy(n, dtype, small_chunks):
    x = np.random.default_rng(n).standard_normal(n).astype(dtype)
    tol = 1e-12 if dtype == np.float64 else 2e-6
    for inverse, reference in ((False, scipy.fft.dct), (True, scipy.fft.idct)):
        want = reference(x.astype(np.float64), type=2, norm="ortho")
        got_numpy = transform.dct_numpy(x.copy(), inverse=inverse, workers=1)
        got_torch = transform.dct_torch(
            [torch.from_numpy(x.copy())], inverse=inverse, workers=1
        ).numpy()
        assert got_numpy.dtype == dtype and got_torch.dtype == dtype
        np.testing.assert_allclose(got_numpy, want, atol=tol * np.sqrt(n), rtol=0)
        np.testing.assert_allclose(got_torch, want, atol=tol * np.sqrt(n), rtol=0)


def dense_reference(family: OrthogonalCanaries, vector: np.ndarray) -> np.ndarray:
    """``R^T v`` in float64 from dense signs and scipy's DCTs (the family's definition)."""
    signs = [bits.dense(np.float64) for bits in family._sign_bits]
    x = vector.astype(np.float64) * signs[family._rounds]
    for r in range(family._rounds, 0, -1):
        cut = family._split if r % 2 == 1 else family.dim - family._split
        for part in (slice(0, cut), slice(cut, family.dim)):
            if part.stop > part.start:
                x[part] = scipy.fft.idct(x[part], type=2, norm="ortho")
        x *= signs[r - 1]
    return x


# 5-smooth (two sign rounds, one block), two blocks of even lengths, an odd remainder block
@pytest.mark.parametrize("dim", [4000, 4098, 4099, 2 * 3**7])
def test_transpose_apply_numpy_and_torch_agree(dim, small_chunks):
    family = OrthogonalCanaries(SEED, dim)
    v = np.random.default_rng(dim).standard_normal(dim).astype(np.float32)
    want = dense_reference(family, v)
    got_numpy = family.transpose_apply(v, backend="numpy")
    got_torch = family.transpose_apply(v, backend="torch")
    tensor_in = family.transpose_apply(torch.from_numpy(v), backend="auto")
    assert isinstance(got_torch, np.ndarray) and torch.is_tensor(tensor_in)
    null_sd = np.linalg.norm(v) / np.sqrt(dim)  # a coordinate's scale under the null
    for got in (got_numpy, got_torch, tensor_in.numpy()):
        assert got.dtype == np.float32
        assert np.max(np.abs(got - want)) < 1e-5 * null_sd
    np.testing.assert_array_equal(np.asarray(v), v)  # the input is left alone
    # consume=True transforms in place with the same numbers
    owned = v.copy()
    np.testing.assert_array_equal(
        family.transpose_apply(owned, backend="numpy", consume=True), got_numpy
    )


def test_canaries_are_columns_of_the_transform(small_chunks):
    """R^T c_j puts 1 at pi(j) (orthonormal canaries), on both back ends."""
    dim = 4099
    family = OrthogonalCanaries(SEED, dim)
    indices = np.arange(5)
    rows = family.vectors(indices)
    positions = family.positions(indices)
    np.testing.assert_allclose(rows @ rows.T, np.eye(5), atol=1e-5)
    for backend in ("numpy", "torch"):
        projected = np.stack([family.transpose_apply(r, backend=backend) for r in rows])
        np.testing.assert_allclose(projected[:, positions], np.eye(5), atol=1e-5)
    total = family.sum_of(indices)
    np.testing.assert_allclose(total, rows.astype(np.float64).sum(axis=0), atol=1e-6)
    np.testing.assert_allclose(family.sum_of(indices, dtype=np.float32), total, atol=1e-6)


def test_sign_bits_flip_matches_multiply(small_chunks):
    dim = 1001
    bits = OrthogonalCanaries(SEED, dim)._sign_bits[1]
    dense = bits.dense(np.float32)
    assert set(np.unique(dense)) == {-1.0, 1.0}
    x = np.random.default_rng(1).standard_normal(dim).astype(np.float32)
    for offset in (0, 3, 13):
        part = x[offset:].copy()
        np.testing.assert_array_equal(bits.flip(part.copy(), offset), part * dense[offset:])
        np.testing.assert_array_equal(
            bits.flip_torch(torch.from_numpy(part.copy()), offset).numpy(), part * dense[offset:]
        )
    assert "bits" not in repr(bits).lower().replace("signbits", "")


def test_tracker_cosines_agree_across_back_ends(small_chunks):
    dim, k = 6000, 300
    numpy_tracker = CosineTracker(SEED, k, dim, family="orthogonal", backend="numpy")
    torch_tracker = CosineTracker(SEED, k, dim, family="orthogonal", backend="torch")
    rng = np.random.default_rng(3)
    seen = seen_mask(SEED, k)
    for _ in range(3):
        delta = rng.standard_normal(dim).astype(np.float32)
        delta += 3.0 * numpy_tracker._orthogonal.vectors(np.flatnonzero(seen)[:10]).sum(axis=0)
        a = numpy_tracker.update(delta)
        b = torch_tracker.update(torch.from_numpy(delta))
        assert np.max(np.abs(a - b)) * np.sqrt(dim) < 1e-4  # in null standard deviations
    np.testing.assert_allclose(
        numpy_tracker.max_cosines, torch_tracker.max_cosines, atol=1e-4 / np.sqrt(dim)
    )


def test_small_audit_estimates_do_not_depend_on_the_back_end(monkeypatch):
    config = FedAvgSimulation(
        dim=4000,
        num_clients=200,
        clients_per_round=20,
        num_rounds=4,
        num_canaries=200,
        noise_multiplier=0.6,
    )
    results = {}
    for backend in ("numpy", "torch"):
        monkeypatch.setattr(transform, "_CPU_DEFAULT", backend)
        result = simulate_dpfedavg_audit(config, seed=11)
        results[backend] = (result, audit_epsilons(result, delta=config.delta))
    (a, eps_a), (b, eps_b) = results["numpy"], results["torch"]
    np.testing.assert_allclose(a.max_cosines, b.max_cosines, atol=1e-5 / np.sqrt(config.dim))
    np.testing.assert_allclose(a.final_cosines, b.final_cosines, atol=1e-5 / np.sqrt(config.dim))
    assert eps_a.keys() == eps_b.keys() and eps_a
    for name in eps_a:
        assert eps_a[name] == pytest.approx(eps_b[name], rel=1e-4, abs=1e-6), name
