"""Record canaries in Opacus's DP-SGD (clients/record_canaries.py) with the real PrivacyEngine:
the canary sum lands exactly in the step's gradient, canaries are sampled at the examples' rate,
an included canary's footprint in the update is -lr C/B c_j (scaled by the momentum sum), seen
canaries score above unseen ones under noise, unsupported optimizers are refused, and the
optimizer only ever asks for sums (O(d), never k x d)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping, DPPerLayerOptimizer
from scipy import stats
from torch.utils.data import DataLoader, TensorDataset

from flaudit.auditor.canaries import OrthogonalCanaries, seen_mask
from flaudit.auditor.estimators.record_level import (
    SeededRecordCanaries,
    record_canary_cosines,
    record_level_epsilon,
)
from flaudit.clients.record_canaries import (
    CANARY_PRECLIP_FACTOR,
    RecordCanaryDPOptimizer,
    UnsupportedOptimizerError,
    add_record_canaries,
    flat_parameters,
    opacus_epsilon,
)

SEED = 20260537
C = 1.5  # max_grad_norm


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus warns about secure_mode and hooks
        yield


def _private(
    *,
    z,
    n=60,
    batch=6,
    features=16,
    classes=4,
    lr=0.1,
    momentum=0.0,
    seed=0,
    optimizer=torch.optim.SGD,
):
    """A tiny linear model made private by Opacus's PrivacyEngine (Poisson sampling, CPU)."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(features, classes)
    data = TensorDataset(torch.randn(n, features), torch.randint(0, classes, (n,)))
    kwargs = {"lr": lr}
    if optimizer is torch.optim.SGD:
        kwargs["momentum"] = momentum
    engine = PrivacyEngine()
    model, opt, loader = engine.make_private(
        module=model,
        optimizer=optimizer(model.parameters(), **kwargs),
        data_loader=DataLoader(data, batch_size=batch),
        noise_multiplier=z,
        max_grad_norm=C,
        poisson_sampling=True,
        noise_generator=torch.Generator().manual_seed(seed + 1),
    )
    return model, opt, loader


def _dim(opt) -> int:
    return sum(p.numel() for p in opt.params)


def _flat_grad(opt) -> np.ndarray:
    return torch.cat([p.grad.detach().reshape(-1).double() for p in opt.params]).numpy()


def test_the_canary_sum_is_added_exactly_before_scaling():
    """z = 0: the step's gradient with canaries minus without = C sum_sampled c_j / B."""
    model_a, plain, loader = _private(z=0.0)
    model_b, canaried, _ = _private(z=0.0)
    d = _dim(plain)
    source = SeededRecordCanaries(SEED, seen_mask(SEED, 40), sample_rate=loader.sample_rate)
    add_record_canaries(canaried, source, sample_rate=loader.sample_rate)
    x, y = next(iter(DataLoader(loader.dataset, batch_size=7)))
    nonempty = 0
    for step in range(6):
        for model, opt in ((model_a, plain), (model_b, canaried)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            assert opt.pre_step()
        expected = C * source.step_canary_sum(step, d) / plain.expected_batch_size
        np.testing.assert_allclose(_flat_grad(canaried) - _flat_grad(plain), expected, atol=1e-6)
        nonempty += source.sampled(step).size > 0
    assert canaried.canary_step == 6
    assert nonempty >= 2  # the comparison saw canaries, not only empty draws


def _unclipped_clip_and_accumulate(self):
    """A broken app's per-example clipping: the per-sample gradients summed unclipped."""
    for p in self.params:
        grad = self._get_flat_grad_sample(p).to(p.dtype).sum(dim=0)
        p.summed_grad = grad if p.summed_grad is None else p.summed_grad + grad


def _summed(opt) -> np.ndarray:
    return torch.cat([p.summed_grad.detach().reshape(-1).double() for p in opt.params]).numpy()


def _canary_contributions(monkeypatch, *, bypass: bool, z: float):
    """Per step with canaries: (what the canaries added to summed_grad, to the noised grad, s).
    Two optimizers on the same batches and the same noise stream, one with canaries."""
    if bypass:  # the class's method, as a monkeypatched Opacus would have it
        monkeypatch.setattr(DPOptimizer, "clip_and_accumulate", _unclipped_clip_and_accumulate)
    model_a, plain, loader = _private(z=z)
    model_b, canaried, _ = _private(z=z)
    d = _dim(plain)
    source = SeededRecordCanaries(SEED, np.ones(40, dtype=bool), sample_rate=0.2)
    add_record_canaries(canaried, source)
    x, y = next(iter(DataLoader(loader.dataset, batch_size=7)))
    x = x * 50.0  # large examples: real per-sample norms well above C
    out = []
    for step in range(8):
        captured = {}
        for name, model, opt in (("plain", model_a, plain), ("canaried", model_b, canaried)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            assert opt.pre_step()  # clip, (canaries), noise, scale: what step() does
            captured[name] = (_summed(opt), _flat_grad(opt))
        s = source.step_canary_sum(step, d).astype(np.float64)
        if np.any(s):
            out.append(
                (
                    captured["canaried"][0] - captured["plain"][0],
                    (captured["canaried"][1] - captured["plain"][1]) * plain.expected_batch_size,
                    s,
                )
            )
    assert len(out) >= 3  # steps with canaries were compared
    return out


@pytest.mark.parametrize("z", [0.0, 1.0])
def test_under_correct_clipping_a_canary_adds_exactly_c_times_its_direction(monkeypatch, z):
    for summed, noised, s in _canary_contributions(monkeypatch, bypass=False, z=z):
        # Opacus's clip factor C / (K C + 1e-6): relative error < 1e-6 / (K C)
        np.testing.assert_allclose(summed, C * s, rtol=0, atol=2e-5)
        np.testing.assert_allclose(noised, C * s, rtol=0, atol=2e-4)
        assert np.linalg.norm(summed) == pytest.approx(C * np.linalg.norm(s), rel=1e-5)


@pytest.mark.parametrize("z", [0.0, 1.0])
def test_with_clipping_bypassed_the_canaries_reach_the_noised_gradient_k_times(monkeypatch, z):
    """A DPOptimizer whose clip_and_accumulate sums unclipped per-sample gradients lets the
    canaries through at their pre-clip norm K C: K C s, not C s, in the noised gradient."""
    K = CANARY_PRECLIP_FACTOR
    assert K > 1
    for summed, noised, s in _canary_contributions(monkeypatch, bypass=True, z=z):
        np.testing.assert_allclose(summed, K * C * s, rtol=0, atol=1e-4)
        np.testing.assert_allclose(noised, K * C * s, rtol=0, atol=1e-3)


def _small_private_linear(*, noise_multiplier: float):
    """A seeded ``Linear(16, 4)`` on 60 random examples through Opacus's real ``PrivacyEngine``
    (RDP accountant, Poisson batches of expected size 6, ``max_grad_norm`` C): the engine, the
    private model, its optimizer and its data loader."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    data = TensorDataset(torch.randn(60, 16), torch.randint(0, 4, (60,)))
    engine = PrivacyEngine(accountant="rdp")
    model, opt, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=6),
        noise_multiplier=noise_multiplier,
        max_grad_norm=C,
        poisson_sampling=True,
    )
    return engine, model, opt, loader


def test_the_canaries_leave_opacus_accounting_and_the_real_batch_alone(monkeypatch):
    """Opacus's accountant steps once per real step (the canaries' clipping is no step), and the
    real batch's grad_sample and clipped sum are what they were before the canaries."""
    results = {}
    for with_canaries in (False, True):
        engine, model, opt, loader = _small_private_linear(noise_multiplier=1.0)
        if with_canaries:
            add_record_canaries(opt, SeededRecordCanaries(SEED, np.ones(30, bool), sample_rate=0.5))
        clips = []
        original = type(opt).clip_and_accumulate

        def counting(self, original=original, clips=clips):
            clips.append(1)
            return original(self)

        monkeypatch.setattr(type(opt), "clip_and_accumulate", counting)
        _train(model, opt, loader, epochs=2)
        results[with_canaries] = (list(engine.accountant.history), len(clips))
        monkeypatch.undo()
    assert results[True][0] == results[False][0]  # same (z, q, steps) history
    assert sum(n for _, _, n in results[True][0]) == 2 * len(loader)
    assert results[False][1] == 2 * len(loader)
    assert 2 * len(loader) < results[True][1] <= 4 * len(loader)  # + one per step with canaries

    model, opt, loader = _private(z=1.0)
    add_record_canaries(opt, SeededRecordCanaries(SEED, np.ones(40, bool), sample_rate=1.0))
    x, y = next(iter(loader))
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.clip_and_accumulate()
    before = [(p.grad_sample, p.summed_grad.clone()) for p in opt.params]
    opt.add_canaries()
    for p, (grad_sample, _) in zip(opt.params, before):
        assert p.grad_sample is grad_sample  # the real batch's per-sample gradients, untouched
    assert opt.accumulated_iterations == 1


def test_the_preclip_factor_must_exceed_one():
    _, opt, loader = _private(z=1.0)
    source = SeededRecordCanaries(SEED, np.ones(4, bool), sample_rate=loader.sample_rate)
    for bad in (1.0, 0.5, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="preclip_factor"):
            add_record_canaries(opt, source, preclip_factor=bad)
    assert type(opt) is DPOptimizer  # refused before anything changed


def test_canaries_are_sampled_at_the_examples_rate():
    q, steps = 0.1, 3000
    mask = seen_mask(SEED, 64)
    source = SeededRecordCanaries(SEED, mask, sample_rate=q)
    counts = np.zeros(64, dtype=np.int64)
    for t in range(steps):
        counts[source.sampled(t)] += 1
    assert counts[~mask].sum() == 0  # unseen canaries are never included
    n = steps * int(mask.sum())
    assert abs(counts.sum() - n * q) < 5 * np.sqrt(n * q * (1 - q))  # binomial limit
    per_canary = counts[mask]  # each seen canary: Binomial(steps, q)
    spread = np.sum((per_canary - steps * q) ** 2) / (steps * q * (1 - q))  # ~ chi2(m)
    assert stats.chi2(per_canary.size).sf(spread) > 1e-4
    assert stats.chi2(per_canary.size).cdf(spread) > 1e-4
    np.testing.assert_array_equal(source.sampled(17), source.sampled(17))  # from the seed


def _train(model, opt, loader, epochs):
    for _ in range(epochs):
        for x, _ in loader:
            opt.zero_grad()
            (model(x) * 0.0).sum().backward()  # zero data gradients: only canaries and noise
            opt.step()


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_an_inclusion_moves_the_update_by_minus_lr_c_over_b_times_the_momentum_sum(momentum):
    """No data gradient, z = 0: <-Delta, c_j> = lr C / B sum_{t: j in S_t} (1 - mu^(T-t))/(1 - mu)
    exactly (the orthogonal canaries are orthonormal)."""
    lr = 0.1
    model, opt, loader = _private(z=0.0, lr=lr, momentum=momentum)
    k = 60
    mask = seen_mask(SEED, k)
    source = SeededRecordCanaries(SEED, mask, sample_rate=loader.sample_rate)
    add_record_canaries(opt, source)
    before = flat_parameters(opt)
    _train(model, opt, loader, epochs=3)
    delta = flat_parameters(opt) - before
    steps = opt.canary_step
    assert steps == 3 * len(loader)
    weight = np.zeros(k)
    for t in range(steps):
        left = steps - t
        weight[source.sampled(t)] += 1 if momentum == 0 else (1 - momentum**left) / (1 - momentum)
    expected = lr * C / opt.expected_batch_size * weight
    family = OrthogonalCanaries(SEED, _dim(opt))
    dots = record_canary_cosines(delta, family, np.arange(k)) * np.linalg.norm(delta)
    np.testing.assert_allclose(dots, expected, atol=1e-5)
    assert np.all(dots[~mask] == pytest.approx(0, abs=1e-5))
    assert np.count_nonzero(weight[mask]) > mask.sum() / 2  # most seen canaries went in


def test_under_noise_the_canary_projection_is_inclusions_plus_gaussian_noise():
    """No data gradient, plain SGD, z = 1: (B / lr C) <-Delta, c_j> - n_j ~ N(0, z^2 T) i.i.d."""
    lr, z = 0.05, 1.0
    model, opt, loader = _private(z=z, lr=lr, features=32, classes=8, seed=3)
    k = 200
    mask = seen_mask(SEED, k)
    source = SeededRecordCanaries(SEED, mask, sample_rate=loader.sample_rate)
    add_record_canaries(opt, source)
    before = flat_parameters(opt)
    _train(model, opt, loader, epochs=4)
    delta = flat_parameters(opt) - before
    steps = opt.canary_step
    inclusions = np.zeros(k)
    for t in range(steps):
        inclusions[source.sampled(t)] += 1
    family = OrthogonalCanaries(SEED, _dim(opt))
    x = record_canary_cosines(delta, family, np.arange(k)) * np.linalg.norm(delta)
    residual = x * opt.expected_batch_size / (lr * C) - inclusions
    assert abs(residual.mean()) < 4 * z * np.sqrt(steps / k)
    assert stats.chi2(k).sf(np.sum(residual**2) / (z**2 * steps)) > 1e-4
    assert stats.chi2(k).cdf(np.sum(residual**2) / (z**2 * steps)) > 1e-4


def test_with_real_data_and_noise_seen_canaries_score_above_unseen():
    lr = 0.05
    model, opt, loader = _private(
        z=1.0, lr=lr, momentum=0.5, features=32, classes=8, n=100, batch=10, seed=5
    )
    k = 200
    mask = seen_mask(SEED, k)
    add_record_canaries(opt, SeededRecordCanaries(SEED, mask, sample_rate=loader.sample_rate))
    before = flat_parameters(opt)
    for _ in range(8):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    cosines = record_canary_cosines(
        flat_parameters(opt) - before, OrthogonalCanaries(SEED, _dim(opt)), np.arange(k)
    )
    assert cosines[mask].mean() > cosines[~mask].mean()
    assert stats.mannwhitneyu(cosines[mask], cosines[~mask], alternative="greater").pvalue < 1e-3


def _sgd(**kwargs):
    return torch.optim.SGD(torch.nn.Linear(3, 2).parameters(), lr=0.1, **kwargs)


@pytest.mark.parametrize(
    "make",
    [
        lambda: _private(z=1.0, optimizer=torch.optim.Adam)[1],
        lambda: _private(z=1.0, optimizer=torch.optim.AdamW)[1],
        lambda: DPOptimizerFastGradientClipping(
            _sgd(), noise_multiplier=1.0, max_grad_norm=C, expected_batch_size=4
        ),
        lambda: DPPerLayerOptimizer(
            _sgd(), noise_multiplier=1.0, max_grad_norm=[C, C], expected_batch_size=4
        ),
        lambda: DPOptimizer(
            _sgd(maximize=True), noise_multiplier=1.0, max_grad_norm=C, expected_batch_size=4
        ),
        lambda: _sgd(),  # a bare torch optimizer: not made private
    ],
    ids=["adam", "adamw", "ghost", "per-layer", "maximize", "not-private"],
)
def test_unsupported_optimizers_are_refused_naming_what_is_supported(make):
    with pytest.raises(UnsupportedOptimizerError) as info:
        add_record_canaries(make(), SeededRecordCanaries(SEED, [True] * 4, sample_rate=0.1))
    assert "DPOptimizer with flat clipping" in str(info.value)
    assert "torch.optim.SGD, with or without momentum" in str(info.value)


def test_supported_optimizers_and_misuse():
    for kwargs in ({}, {"momentum": 0.9, "nesterov": True, "weight_decay": 1e-4}):
        opt = DPOptimizer(
            _sgd(**kwargs), noise_multiplier=1.0, max_grad_norm=C, expected_batch_size=4
        )
        out = add_record_canaries(opt, SeededRecordCanaries(SEED, [True] * 4, sample_rate=0.1))
        assert out is opt and isinstance(opt, RecordCanaryDPOptimizer)
    with pytest.raises(ValueError, match="already adds record canaries"):
        add_record_canaries(opt, SeededRecordCanaries(SEED, [True] * 4, sample_rate=0.1))
    fresh = DPOptimizer(_sgd(), noise_multiplier=1.0, max_grad_norm=C, expected_batch_size=4)
    with pytest.raises(ValueError, match="must be equal"):
        add_record_canaries(
            fresh, SeededRecordCanaries(SEED, [True] * 4, sample_rate=0.1), sample_rate=0.2
        )
    with pytest.raises(TypeError, match="step_canary_sum"):
        add_record_canaries(fresh, object())


class _Recording:
    """A canary source that records what the optimizer asks for."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def step_canary_sum(self, step, dim):
        out = self.inner.step_canary_sum(step, dim)
        self.calls.append((step, dim, out.shape))
        return out


def test_the_optimizer_only_asks_for_sums_never_k_by_d(monkeypatch):
    def no_matrix(*args, **kwargs):
        raise AssertionError("a k x d matrix of canaries was built")

    monkeypatch.setattr(OrthogonalCanaries, "vectors", no_matrix)
    model, opt, loader = _private(z=1.0)
    source = _Recording(
        SeededRecordCanaries(SEED, np.ones(60, dtype=bool), sample_rate=loader.sample_rate)
    )
    add_record_canaries(opt, source)
    d = _dim(opt)
    _train(model, opt, loader, epochs=2)
    assert [c[0] for c in source.calls] == list(range(2 * len(loader)))  # one sum per step
    assert all(c[1] == d and c[2] == (d,) for c in source.calls)


def test_opacus_accountant_beside_dp_accounting():
    """Opacus's RDP accountant and dp-accounting's agree on the Poisson-subsampled Gaussian."""
    z, q, s, rounds, delta = 1.1, 0.05, 40, 5, 1e-5
    ours = {
        r.details["accountant"]: r.epsilon
        for r in record_level_epsilon(z, q, s, delta, rounds_trained=rounds)
    }
    theirs = opacus_epsilon(z, q, s * rounds, delta)
    assert theirs == pytest.approx(ours["rdp"], rel=0.05)
    assert ours["pld"] <= theirs  # PLD is the tighter accounting


def test_an_empty_poisson_batch_still_carries_its_canaries_and_the_accountant_still_counts():
    """Poisson sampling can draw an empty batch: the step's canaries still go in (an empty
    batch is a step like any other), and Opacus's accountant hook keeps counting the steps."""
    engine, model, opt, loader = _small_private_linear(noise_multiplier=0.0)
    source = SeededRecordCanaries(SEED, np.ones(30, dtype=bool), sample_rate=0.5)
    add_record_canaries(opt, source)
    d = _dim(opt)
    step = next(t for t in range(100) if source.sampled(t).size)
    for _ in range(step):  # advance to a step with canaries, on a real batch
        x, y = next(iter(loader))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    opt.zero_grad()
    empty_x, empty_y = torch.zeros(0, 16), torch.zeros(0, dtype=torch.long)
    torch.nn.functional.cross_entropy(model(empty_x), empty_y, reduction="sum").backward()
    assert opt.pre_step()
    np.testing.assert_allclose(
        _flat_grad(opt), C * source.step_canary_sum(step, d) / opt.expected_batch_size, atol=1e-6
    )
    assert opt.canary_step == step + 1
    assert sum(n for _, _, n in engine.accountant.history) == step + 1
