"""DP-FedAvg aggregation math: invariants and independent routes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flaudit.auditor.canaries import canary_sum, canary_vectors
from flaudit.protocol.vectors import flatten, unflatten
from flaudit.server.dpfedavg import (
    AdaptiveClipNorm,
    ServerOptimizer,
    aggregate_round,
    canary_update,
    clip_update,
)


@settings(max_examples=40, deadline=None)
@given(clip=st.floats(1e-3, 1e3), index=st.integers(0, 10_000), dim=st.integers(2, 5000))
def test_canary_update_has_norm_exactly_clip_norm(clip, index, dim):
    direction = canary_vectors(12345, [index], dim, family="gaussian")[0]
    update = canary_update(direction, clip)
    assert np.linalg.norm(update) == pytest.approx(clip, rel=1e-12)
    # same direction as the canary
    cos = update @ direction / (np.linalg.norm(update) * np.linalg.norm(direction))
    assert cos == pytest.approx(1.0, abs=1e-6)


@settings(max_examples=40, deadline=None)
@given(scale=st.floats(1e-3, 1e3), clip=st.floats(1e-2, 10), seed=st.integers(0, 999))
def test_clip_update_bounds_norm_and_keeps_direction(scale, clip, seed):
    update = np.random.default_rng(seed).standard_normal(50) * scale
    clipped, norm = clip_update(update, clip)
    assert norm == pytest.approx(np.linalg.norm(update))
    assert np.linalg.norm(clipped) <= clip * (1 + 1e-12)
    if norm <= clip:
        assert np.array_equal(clipped, update)
    else:
        assert np.linalg.norm(clipped) == pytest.approx(clip, rel=1e-12)
        assert np.allclose(clipped / np.linalg.norm(clipped), update / norm)


@pytest.mark.parametrize("family", ["orthogonal", "gaussian"])
def test_zero_noise_no_clients_aggregate_is_sum_of_scheduled_canaries(family):
    dim, clip, m = 300, 0.7, 5
    directions = canary_vectors(99, [3, 8, 21], dim, family=family)
    result = aggregate_round(
        client_updates=[],
        canary_directions=directions,
        clip_norm=clip,
        noise_multiplier=0.0,
        expected_cohort_size=m,
        dim=dim,
        rng=np.random.default_rng(0),
    )
    expected = clip * directions.astype(np.float64).sum(axis=0)
    assert np.allclose(result.clipped_sum, expected, atol=1e-6)
    assert np.allclose(result.update, expected / m, atol=1e-7)
    summed = aggregate_round(
        client_updates=[],
        canary_directions=[],
        clip_norm=clip,
        noise_multiplier=0.0,
        expected_cohort_size=m,
        dim=dim,
        rng=np.random.default_rng(0),
        canary_sum=canary_sum(99, [3, 8, 21], dim, family=family),
        num_summed_canaries=3,
    )
    assert summed.num_canaries == 3 and np.allclose(summed.clipped_sum, expected, atol=1e-6)
    assert result.num_canaries == 3 and result.num_clients == 0 and result.noise_stddev == 0.0


def test_clients_are_clipped_and_uniformly_weighted():
    dim = 4
    big = np.array([3.0, 4.0, 0.0, 0.0])  # norm 5 -> clipped to 1
    small = np.array([0.0, 0.0, 0.5, 0.0])  # kept
    result = aggregate_round(
        client_updates=[big, small],
        canary_directions=np.empty((0, dim)),
        clip_norm=1.0,
        noise_multiplier=0.0,
        expected_cohort_size=4,
        dim=dim,
        rng=np.random.default_rng(0),
    )
    assert np.allclose(result.clipped_sum, [0.6, 0.8, 0.5, 0.0])
    assert np.allclose(result.update, np.array([0.6, 0.8, 0.5, 0.0]) / 4)
    assert result.num_clipped == 1 and result.clipped_fraction == 0.5


def _noise_only(dim, clip, z, m, **options):
    """One round with no client and no canary: the update is the DP noise alone."""
    return aggregate_round(
        client_updates=[],
        canary_directions=np.empty((0, dim)),
        clip_norm=clip,
        noise_multiplier=z,
        expected_cohort_size=m,
        dim=dim,
        rng=np.random.default_rng(7),
        **options,
    )


def test_noise_has_stddev_z_times_clip_over_m_monte_carlo():
    dim, clip, z, m = 200_000, 0.5, 1.3, 10
    result = _noise_only(dim, clip, z, m)
    sample_std = result.update.std()
    assert sample_std == pytest.approx(z * clip / m, rel=0.01)  # se of std ~ 1/sqrt(2d) = 0.16%
    assert abs(result.update.mean()) < 5 * z * clip / m / np.sqrt(dim)
    assert result.noise_stddev == pytest.approx(z * clip)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(clip_norm=0.0), "clip_norm"),
        (dict(noise_multiplier=-1.0), "noise_multiplier"),
        (dict(expected_cohort_size=0), "expected_cohort_size"),
        (dict(client_updates=[np.ones(3)]), r"client_updates\[0\]"),
        (dict(client_updates=[np.full(4, np.nan)]), r"client_updates\[0\]"),
    ],
)
def test_bad_arguments_are_named(kwargs, name):
    options = dict(
        client_updates=[],
        canary_directions=np.empty((0, 4)),
        clip_norm=1.0,
        noise_multiplier=1.0,
        expected_cohort_size=2,
        dim=4,
        rng=np.random.default_rng(0),
    )
    options.update(kwargs)
    with pytest.raises(ValueError, match=name):
        aggregate_round(**options)


def test_server_momentum_matches_geometric_series():
    eta, beta, u = 0.5, 0.9, np.array([1.0, -2.0], dtype=np.float64)
    opt = ServerOptimizer(learning_rate=eta, momentum=beta)
    model = np.zeros(2, dtype=np.float32)
    for t in range(1, 6):
        new_model, delta = opt.step(model, u)
        assert np.allclose(delta, eta * u * sum(beta**k for k in range(t)), rtol=1e-6)
        assert np.array_equal(new_model, model + delta)
        model = new_model
    with pytest.raises(ValueError, match="momentum"):
        ServerOptimizer(momentum=1.0)


def test_adaptive_clip_norm_tracks_target_quantile_without_noise():
    rng = np.random.default_rng(0)
    norms = rng.lognormal(mean=0.0, sigma=0.5, size=100_000)
    clip = AdaptiveClipNorm(initial_clip_norm=0.05, target_quantile=0.3, learning_rate=0.2)
    for _ in range(400):
        batch = rng.choice(norms, size=200)
        clip.update(num_unclipped=int(np.sum(batch <= clip.clip_norm)), expected_count=200, rng=rng)
    assert clip.clip_norm == pytest.approx(np.quantile(norms, 0.3), rel=0.1)


def test_flatten_unflatten_roundtrip():
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([7.0], dtype=np.float32)]
    vector = flatten(arrays)
    assert vector.dtype == np.float32 and vector.shape == (7,)
    back = unflatten(vector, [a.shape for a in arrays])
    assert all(np.array_equal(a, b) for a, b in zip(arrays, back))
    with pytest.raises(ValueError, match="shapes"):
        unflatten(vector, [(2, 2)])


@pytest.mark.parametrize(
    "bug, factor, noise_ratio",
    [
        ("no_noise", None, 0.0),
        ("noise_scale", 0.5, 0.5),
        ("noise_scale", 3.0, 3.0),
        ("noise_divided_twice", None, 0.1),
    ],
)
def test_injected_noise_bugs_change_the_noise_actually_added(bug, factor, noise_ratio):
    from flaudit.auditor.bugs import InjectedBug

    dim, clip, z, m = 200_000, 0.5, 1.3, 10
    result = _noise_only(dim, clip, z, m, bug=InjectedBug(kind=bug, factor=factor))
    assert result.update.std() == pytest.approx(noise_ratio * z * clip / m, rel=0.01, abs=1e-12)
    assert result.noise_stddev == pytest.approx(z * clip)  # what the implementation claims


def test_injected_no_clipping_keeps_client_norms_and_sends_large_canaries():
    from flaudit.auditor.bugs import InjectedBug

    dim = 4
    big = np.array([3.0, 4.0, 0.0, 0.0])
    canary = np.array([[0.0, 0.0, 0.0, 2.0]])
    result = aggregate_round(
        client_updates=[big],
        canary_directions=canary,
        clip_norm=1.0,
        noise_multiplier=0.0,
        expected_cohort_size=2,
        dim=dim,
        rng=np.random.default_rng(0),
        bug=InjectedBug(kind="no_clipping", factor=4),
    )
    assert np.allclose(result.clipped_sum, [3.0, 4.0, 0.0, 4.0])
    assert result.num_clipped == 1  # still counted as over the clip norm
