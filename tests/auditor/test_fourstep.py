"""The four-step DCT-III (auditor/fourstep.py) equals scipy's orthonormal DCT-III, whatever the
factorisation, chunking and thread count, and the canary transform built on it equals the dense
definition (issue #31: d = 10^9 on every core)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.fft

from flaudit.auditor import fourstep, transform
from flaudit.auditor.canaries import OrthogonalCanaries
from flaudit.auditor.statistics import CosineTracker
from tests.auditor.test_transform_backends import dense_reference


@pytest.fixture
def tiny_four_step(monkeypatch):
    """The four-step path for every length it can factor, with chunks that split every pass."""
    monkeypatch.setattr(fourstep, "FOUR_STEP_MIN", 8)
    monkeypatch.setattr(fourstep, "_MIN_FACTOR", 2)
    monkeypatch.setattr(fourstep, "_PRE_CHUNK", 7)
    monkeypatch.setattr(fourstep, "_ROW_TABLE", 3)
    monkeypatch.setattr(fourstep, "_ROW_BLOCK", 2)
    monkeypatch.setattr(transform, "CHUNK", 7)


def test_plan_factors_half_the_length():
    for n in (1 << 22, 10**8, 10**9, 2 * 3**12 * 4):
        m1, m2 = fourstep.four_step_plan(n)
        assert m1 * m2 == n // 2 and m2 % 2 == 0 and m1 <= m2
        assert min(m1, m2) >= fourstep._MIN_FACTOR
    assert fourstep.four_step_plan(1 << 10) is None  # short: pocketfft's 1-D transforms
    assert fourstep.four_step_plan(1_200_000) is None  # pocketfft is faster there (issue #41)
    assert fourstep.four_step_plan((1 << 22) + 2) is None  # n / 2 odd
    assert fourstep.four_step_plan(8 * 1_000_003) is None  # n / 2 = 4 x prime: no factors


@pytest.mark.parametrize("n", [8, 24, 40, 96, 200, 1000, 3072, 8748])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("workers", [1, 3])
def test_four_step_equals_scipy_dct3(n, dtype, workers, tiny_four_step):
    plan = fourstep.four_step_plan(n)
    assert plan is not None
    x = np.random.default_rng(n).standard_normal(n).astype(dtype)
    want = scipy.fft.idct(x.astype(np.float64), type=2, norm="ortho")
    got = fourstep.dct3_four_step(x.copy(), plan, workers=workers)
    tol = 1e-12 if dtype == np.float64 else 2e-6
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want, atol=tol * np.sqrt(n), rtol=0)
    # through dct_numpy, which routes long inverse transforms here
    np.testing.assert_allclose(
        transform.dct_numpy(x.copy(), inverse=True, workers=workers),
        want,
        atol=tol * np.sqrt(n),
        rtol=0,
    )


@pytest.mark.parametrize("row_block", [1, 3, 16])
def test_fused_row_pass_and_a_shared_work_buffer(row_block, tiny_four_step, monkeypatch):
    """Row blocks of any size, with their mirrors (odd ``M1``: the middle row once), and one
    buffer reused by transforms of different lengths give scipy's DCT-III."""
    monkeypatch.setattr(fourstep, "_ROW_BLOCK", row_block)
    lengths = [1000, 24, 8748, 200]
    work = fourstep.four_step_work(lengths, np.float32)
    assert work.dtype == np.complex64 and work.shape == (8748 // 2,)
    assert fourstep.four_step_plan(24)[0] % 2 == 1  # M1 = 3: a middle row without a mirror
    for n in lengths:
        x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
        want = scipy.fft.idct(x.astype(np.float64), type=2, norm="ortho")
        work[:] = np.nan  # what an earlier transform left there must not matter
        got = fourstep.dct3_four_step(x, fourstep.four_step_plan(n), workers=2, work=work)
        np.testing.assert_allclose(got, want, atol=2e-6 * np.sqrt(n), rtol=0)
    assert fourstep.four_step_work([10, 30], np.float64) is None  # no length has a plan
    with pytest.raises(ValueError, match="work must be a contiguous 1-D complex128"):
        fourstep.dct3_four_step(
            np.zeros(1000),
            fourstep.four_step_plan(1000),
            workers=1,
            work=np.empty(10, np.complex128),
        )


@pytest.mark.parametrize("dim", [4000, 4098, 2 * 3**7])
def test_canary_transform_on_the_four_step_path_matches_the_dense_definition(dim, tiny_four_step):
    family = OrthogonalCanaries(0x5EED, dim, workers=2)
    v = np.random.default_rng(dim).standard_normal(dim).astype(np.float32)
    want = dense_reference(family, v)
    got = family.transpose_apply(v, backend="numpy")
    np.testing.assert_allclose(got, want, atol=2e-6 * np.sqrt(dim), rtol=0)
    np.testing.assert_array_equal(
        family.transpose_apply(v.copy(), backend="numpy", consume=True), got
    )


def test_tracker_statistics_do_not_depend_on_the_path(monkeypatch):
    dim, k = 6000, 50
    v = np.random.default_rng(1).standard_normal(dim).astype(np.float32)
    plain = CosineTracker(7, k, dim, family="orthogonal", backend="numpy").all_cosines(v)
    monkeypatch.setattr(fourstep, "FOUR_STEP_MIN", 8)
    monkeypatch.setattr(fourstep, "_MIN_FACTOR", 2)
    four = CosineTracker(7, k, dim, family="orthogonal", backend="numpy", workers=2).all_cosines(v)
    np.testing.assert_allclose(four, plain, atol=1e-5 / np.sqrt(dim))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_chunked_passes_do_not_depend_on_workers(dtype, monkeypatch):
    monkeypatch.setattr(transform, "CHUNK", 7)
    x = np.random.default_rng(2).standard_normal(1000).astype(dtype)
    one = transform.sum_of_squares(x, workers=1)
    assert transform.sum_of_squares(x, workers=3) == one  # bit for bit: chunk sums added in order
    assert one == pytest.approx(float(np.sum(x.astype(np.float64) ** 2)), rel=1e-12)
    bits = OrthogonalCanaries(3, 1000)._sign_bits[0]
    want = x * bits.dense(dtype)
    np.testing.assert_array_equal(bits.flip(x.copy(), 0, workers=3), want)
    np.testing.assert_array_equal(bits.flip(x.copy(), 0, workers=1), want)
