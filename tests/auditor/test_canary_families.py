"""The two canary families: orthonormality, the fast cosine route, keying, the default rule."""

import numpy as np
import pytest
from scipy import stats

from flaudit.auditor.canaries import (
    CanaryFamily,
    OrthogonalCanaries,
    canary_sum,
    canary_vector,
    canary_vectors,
    resolve_canary_family,
    seen_mask,
)
from flaudit.auditor.spec import AuditSpec
from flaudit.auditor.statistics import CosineTracker
from tests.canary_reference import expected_statistics

SEED = 987654321098765432109876543210
ORTHOGONAL = CanaryFamily.orthogonal


@pytest.mark.parametrize("d", [2, 3, 5, 7, 11, 97, 128, 257, 1000])
def test_orthogonal_columns_are_orthonormal_for_any_length(d):
    vectors = canary_vectors(SEED, np.arange(d), d, family=ORTHOGONAL).astype(np.float64)
    assert np.abs(vectors @ vectors.T - np.eye(d)).max() < 2e-6
    positions = OrthogonalCanaries(SEED, d).positions(np.arange(d))
    assert np.array_equal(np.sort(positions), np.arange(d))  # pi is a permutation of 0..d-1


def test_positions_do_not_depend_on_how_many_canaries():
    family = OrthogonalCanaries(SEED, 10_007)
    all_positions = family.positions(np.arange(5000))
    assert np.array_equal(family.positions([17, 4999, 3]), all_positions[[17, 4999, 3]])
    assert np.unique(all_positions).size == 5000
    with pytest.raises(ValueError, match="< d"):
        family.positions([10_007])


@pytest.mark.parametrize("family", list(CanaryFamily))
@pytest.mark.parametrize("d", [101, 4096])
def test_tracker_cosines_equal_explicit_dot_products(family, d):
    k = 60
    rng = np.random.default_rng(3)
    vectors = canary_vectors(SEED, np.arange(k), d, family=family).astype(np.float64)
    tracker = CosineTracker(SEED, k, d, family=family)
    assert tracker.family is CanaryFamily(family)
    signal = vectors[seen_mask(SEED, k)].sum(axis=0)  # seen canaries inside the update
    for v in (
        rng.normal(size=d),
        np.ones(d),
        np.eye(d)[5],
        np.cos(np.arange(d) * 0.01),
        rng.normal(size=d) + 0.5 * np.sqrt(d) * signal,
    ):
        v32 = v.astype(np.float32)
        expected = expected_statistics(SEED, k, v32, family=family, vectors=vectors)
        assert np.allclose(tracker.all_cosines(v32), expected, atol=2e-6)
    assert np.array_equal(tracker.all_cosines(np.zeros(d, np.float32)), np.zeros(k))


def test_families_share_the_tracker_api():
    d, k = 300, 20
    rng = np.random.default_rng(4)
    deltas = [rng.normal(size=d).astype(np.float32) for _ in range(3)]
    theta0 = rng.normal(size=d).astype(np.float32)
    for family in CanaryFamily:
        tracker = CosineTracker(SEED, k, d, family=family)
        vectors = canary_vectors(SEED, np.arange(k), d, family=family).astype(np.float64)
        for delta in deltas:
            tracker.update(delta)
        expected = np.max(
            [expected_statistics(SEED, k, x, family=family, vectors=vectors) for x in deltas],
            axis=0,
        )
        assert np.allclose(tracker.max_cosines, expected, atol=2e-6)
        theta_t = theta0 + sum(deltas)
        tracker.finalize(theta_t, theta0)
        state = tracker.state()
        assert state.num_rounds == 3 and state.final_cosines.shape == (k,)
        resumed = CosineTracker(SEED, k, d, family=family, state=state)
        assert np.array_equal(resumed.max_cosines, tracker.max_cosines)


@pytest.mark.parametrize("family", list(CanaryFamily))
def test_keyed_by_seed(family):
    d = 513
    a = canary_vectors(SEED, [0, 1, 2], d, family=family)
    assert np.array_equal(a, canary_vectors(SEED, [0, 1, 2], d, family=family))
    b = canary_vectors(SEED + 1, [0, 1, 2], d, family=family)
    assert np.abs(a - b).max() > 0.01
    assert np.allclose(canary_vector(SEED, 2, d, family=family), a[2], atol=1e-7)


def test_families_differ_and_split_is_shared():
    d = 400
    gaussian = canary_vectors(SEED, [0], d, family="gaussian")[0]
    orthogonal = canary_vectors(SEED, [0], d, family="orthogonal")[0]
    assert abs(float(gaussian @ orthogonal)) < 0.3  # independent streams, not the same vector


def test_default_family_rule():
    assert resolve_canary_family(None, num_canaries=10, dim=10) is CanaryFamily.orthogonal
    assert resolve_canary_family(None, num_canaries=11, dim=10) is CanaryFamily.gaussian
    assert resolve_canary_family("gaussian", num_canaries=5, dim=10) is CanaryFamily.gaussian
    with pytest.raises(ValueError, match="canary_family"):
        resolve_canary_family("orthogonal", num_canaries=11, dim=10)
    with pytest.raises(ValueError, match="canary_family"):
        resolve_canary_family("hadamard", num_canaries=5, dim=10)
    assert CosineTracker(SEED, 11, 10).family is CanaryFamily.gaussian
    assert AuditSpec().canary_family is None
    assert AuditSpec(canary_family="orthogonal").canary_family is CanaryFamily.orthogonal
    with pytest.raises(ValueError, match="canary_family"):
        AuditSpec(canary_family="hadamard")


def test_isotropic_noise_projects_to_independent_gaussians():
    """Monte Carlo: <c_j, sigma xi> over many xi ~ N(0, I) is N(0, sigma^2) iid across j."""
    d, k, n, sigma = 64, 16, 6000, 0.7
    family = OrthogonalCanaries(SEED, d, workers=1)
    positions = family.positions(np.arange(k))
    noise = sigma * np.random.default_rng(5).standard_normal((n, d))
    projections = np.stack([family.dots(x.astype(np.float32), positions) for x in noise])
    cov = np.cov(projections, rowvar=False)
    tolerance = 6 * sigma**2 * np.sqrt(2 / n)  # ~6 standard errors of a covariance entry
    assert np.abs(cov - sigma**2 * np.eye(k)).max() < tolerance
    assert stats.kstest(projections[:, 0] / sigma, "norm").pvalue > 1e-4


def test_standardization_removes_the_normalisation_bias():
    """Seen canaries + noise: the orthogonal statistic's seen mean is 1/(sigma sqrt d) (exact
    signal-to-noise), the plain cosine's is 1/sqrt(k_seen + sigma^2 d) (effective noise)."""
    d, k, sigma = 2000, 1000, 0.5
    vectors = canary_vectors(SEED, np.arange(k), d, family=ORTHOGONAL).astype(np.float64)
    seen = seen_mask(SEED, k)
    rng = np.random.default_rng(6)
    rho = vectors[seen].sum(axis=0) + sigma * rng.standard_normal(d)
    stat = CosineTracker(SEED, k, d, family=ORTHOGONAL).all_cosines(rho.astype(np.float32))
    z_seen = stat[seen] * np.sqrt(d) * sigma  # ~ N(1, sigma^2) per canary
    assert abs(z_seen.mean() - 1) < 4 * sigma / np.sqrt(seen.sum())
    z_unseen = stat[~seen] * np.sqrt(d)  # ~ N(0, 1)
    assert abs(z_unseen.std() - 1) < 0.1 and abs(z_unseen.mean()) < 0.15
    plain = vectors @ rho / np.linalg.norm(rho)
    assert plain[seen].mean() * np.sqrt(d) * sigma < 0.75  # shrunk by sqrt(sigma^2/(sigma^2+k/2d))


def test_seed_never_in_repr():
    tracker = CosineTracker(SEED, 10, 50, family=ORTHOGONAL)
    family = OrthogonalCanaries(SEED, 50)
    for text in (repr(tracker), repr(tracker.state()), repr(family), str(family)):
        assert str(SEED) not in text and hex(SEED)[2:] not in text


@pytest.mark.parametrize("family", list(CanaryFamily))
def test_canary_sum_is_the_sum_of_the_vectors(family):
    d, indices = 777, [3, 50, 9, 700]
    vectors = canary_vectors(SEED, indices, d, family=family).astype(np.float64)
    total = canary_sum(SEED, indices, d, family=family)
    assert total.dtype == np.float64
    assert np.allclose(total, vectors.sum(axis=0), atol=1e-6)
    assert np.array_equal(canary_sum(SEED, [], d, family=family), np.zeros(d))
    assert np.allclose(canary_sum(SEED, [3, 3], d, family=family), 2 * vectors[0], atol=1e-6)
    if family is ORTHOGONAL:  # each canary enters with norm 1 to float64 precision
        one = canary_sum(SEED, [50], d, family=family)
        assert abs(np.linalg.norm(one) - 1) < 1e-12


def test_gaussian_mechanism_exact_simulation_matches_the_transform():
    """Orthogonal family: the O(k) simulation and real canaries through the transform agree."""
    from flaudit.auditor.claims.gaussian import gaussian_mechanism_cosines

    sigma, d, k = 0.5, 2000, 400
    runs = {
        method: np.concatenate(
            [
                gaussian_mechanism_cosines(sigma, d, k, seed=s, method=method, family=ORTHOGONAL)
                for s in range(8)
            ]
        )
        * np.sqrt(d)
        * sigma
        for method in ("projected", "canaries")
    }
    for z in runs.values():  # seen statistic ~ N(1, sigma^2) in these units
        assert abs(z.mean() - 1) < 4 * sigma / np.sqrt(z.size)
        assert abs(z.std() / sigma - 1) < 0.08
    assert stats.ks_2samp(runs["projected"], runs["canaries"]).pvalue > 1e-3


@pytest.mark.parametrize("family", list(CanaryFamily))
def test_one_canaries_object_serves_every_round(family):
    """``Canaries`` derives the seed's material once; its rows and sums are the functions'."""
    from flaudit.auditor.canaries import Canaries

    d = 501
    canaries = Canaries(SEED, d, family=family)
    for indices in ([0, 7], [499], [3, 3, 100]):
        assert np.array_equal(
            canaries.vectors(indices), canary_vectors(SEED, indices, d, family=family)
        )
        assert np.array_equal(canaries.sum_of(indices), canary_sum(SEED, indices, d, family=family))
    for text in (repr(canaries), str(canaries)):
        assert str(SEED) not in text and hex(SEED)[2:] not in text and family.value in text
    with pytest.raises(ValueError, match="indices must be >= 0"):
        canaries.sum_of([-1])
