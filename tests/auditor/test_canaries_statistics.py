import numpy as np
import pytest

from flaudit.auditor.canaries import (
    CanaryFamily,
    canary_vector,
    canary_vectors,
    iter_canary_chunks,
    seen_mask,
)
from flaudit.auditor.statistics import CosineTracker

SEED = 123456789012345678901234567890
GAUSSIAN = CanaryFamily.gaussian


@pytest.mark.parametrize("family", list(CanaryFamily))
def test_canaries_unit_norm_reproducible_and_chunk_independent(family):
    d, k = 1000, 23
    bank = canary_vectors(SEED, np.arange(k), d, family=family)
    assert bank.dtype == np.float32
    assert np.allclose(np.linalg.norm(bank.astype(np.float64), axis=1), 1.0, atol=1e-5)
    assert np.allclose(canary_vector(SEED, 7, d, family=family), bank[7], atol=1e-7)
    for chunk in (1, 5, 64):
        joined = np.concatenate(
            [b for _, b in iter_canary_chunks(SEED, k, d, chunk, family=family)]
        )
        assert np.allclose(joined, bank, atol=1e-7)
    assert not np.allclose(canary_vector(SEED + 1, 0, d, family=family), bank[0], atol=1e-3)
    mask = seen_mask(SEED, 4000)
    assert 0.45 < mask.mean() < 0.55 and np.array_equal(mask, seen_mask(SEED, 4000))


def test_tracker_cached_equals_regenerated_and_hides_seed():
    d, k = 500, 40
    rng = np.random.default_rng(0)
    deltas = [rng.normal(size=d).astype(np.float32) for _ in range(3)]
    plain = CosineTracker(SEED, k, d, family=GAUSSIAN, chunk_size=7)
    cached = CosineTracker(SEED, k, d, family=GAUSSIAN, cache_bytes=k * d * 4)
    partial = CosineTracker(SEED, k, d, family=GAUSSIAN, cache_bytes=10 * d * 4, chunk_size=9)
    for delta in deltas:
        a, b, c = plain.update(delta), cached.update(delta), partial.update(delta)
        assert np.allclose(a, b, atol=1e-6) and np.allclose(a, c, atol=1e-6)
    bank = canary_vectors(SEED, np.arange(k), d, family=GAUSSIAN).astype(np.float64)
    expected = np.max([bank @ x / np.linalg.norm(x) for x in deltas], axis=0)
    assert np.allclose(plain.max_cosines, expected, atol=1e-5)
    assert str(SEED) not in repr(cached) and str(SEED) not in repr(plain.state())


def test_tracker_rejects_bad_vectors():
    t = CosineTracker(SEED, 4, 10)
    with pytest.raises(ValueError, match="vector"):
        t.update(np.ones(9, np.float32))
    with pytest.raises(ValueError, match="NaN"):
        t.update(np.full(10, np.nan, np.float32))


def test_threaded_generation_is_identical():
    d, k = 3001, 9
    serial = canary_vectors(SEED, np.arange(k), d, family=GAUSSIAN)
    assert np.array_equal(canary_vectors(SEED, np.arange(k), d, family=GAUSSIAN, workers=3), serial)
    joined = np.concatenate(
        [b for _, b in iter_canary_chunks(SEED, k, d, 4, family=GAUSSIAN, workers=2)]
    )
    assert np.array_equal(joined, serial)
    delta = np.random.default_rng(1).normal(size=d).astype(np.float32)
    a = CosineTracker(SEED, k, d, family=GAUSSIAN, chunk_size=4, workers=2).update(delta)
    b = CosineTracker(SEED, k, d, family=GAUSSIAN, cache_bytes=k * d * 4, workers=2).update(delta)
    assert np.allclose(a, b, atol=1e-6)
    with pytest.raises(ValueError, match="workers"):
        canary_vectors(SEED, [0], d, family=GAUSSIAN, workers=0)
    with pytest.raises(ValueError, match="workers"):
        CosineTracker(SEED, k, d, workers=0)


@pytest.mark.parametrize("exponent", [100, 127, -100, -140])
def test_cosines_do_not_depend_on_scale_even_near_float32_limits(exponent):
    """A finite float32 vector near 3e38 (or tiny) has the cosines of its direction."""
    rng = np.random.default_rng(3)
    direction = np.sign(rng.standard_normal(64)).astype(np.float32)
    scaled = np.ldexp(direction, exponent).astype(np.float32)
    assert np.all(np.isfinite(scaled)) and np.all(scaled != 0)
    tracker = CosineTracker(seed=11, num_canaries=8, dim=64)
    expected = tracker.all_cosines(direction)
    np.testing.assert_allclose(tracker.all_cosines(scaled), expected, rtol=1e-6, atol=1e-7)
    initial = np.zeros(64, dtype=np.float32)
    tracker.finalize(scaled, -scaled if exponent > 0 else initial)
    np.testing.assert_allclose(tracker.state().final_cosines, expected, rtol=1e-6, atol=1e-7)
