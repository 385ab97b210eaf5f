"""The record-level simulation checked once against real Opacus (issue #37).

A small model (``Linear(64, 32)``, d = 2080) trained by Opacus 1.6's ``PrivacyEngine`` (Poisson
sampling, flat clipping, CPU) with :func:`flaudit.clients.record_canaries.add_record_canaries`:
each release (one round of one epoch) uses its own canary family (a fresh seed) and fair-coin
seen mask; the update's cosines go through the shipped scoring and claim test. Printed, for
plain SGD and momentum 0.9: the claim test's rejections on correct runs and with the noise
halved (``noise_multiplier = z/2`` given to Opacus, ``z`` claimed), and the included canaries'
standardised residuals ``t_j - lam_j`` (``N(0, 1)`` in the noise-only model; the data gradients
pull the mean below 0 and never above), beside the numpy simulation of the same shape.

Rerun::

    PYTHONPATH=. python -m benchmarks.fidelity.record_level --part opacus --runs 40
"""

from __future__ import annotations

import warnings

import numpy as np

from flaudit.auditor.canaries import OrthogonalCanaries
from flaudit.auditor.claims.record_level import record_level_scores

from ._common import clopper_pearson

__all__ = ["opacus_check", "opacus_release"]

FEATURES, CLASSES, N, BATCH, C, LR, Z, K = 64, 32, 400, 20, 1.0, 0.05, 1.0, 200
RELEASES = 4


def opacus_release(rng, *, momentum: float, noise_multiplier: float):
    """One client-round with real Opacus: ``(seen, scores, inclusions)`` of its ``K`` canaries."""
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    from flaudit.auditor.estimators.record_level import SeededRecordCanaries
    from flaudit.clients.record_canaries import add_record_canaries, flat_parameters

    warnings.simplefilter("ignore")  # Opacus: secure RNG off, full backward hooks
    seed = int(rng.integers(1, 2**62))
    torch.manual_seed(int(rng.integers(0, 2**31)))
    model = torch.nn.Linear(FEATURES, CLASSES)
    data = TensorDataset(torch.randn(N, FEATURES), torch.randint(0, CLASSES, (N,)))
    engine = PrivacyEngine()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, loader = engine.make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=LR, momentum=momentum),
            data_loader=DataLoader(data, batch_size=BATCH),
            noise_multiplier=noise_multiplier,
            max_grad_norm=C,
            poisson_sampling=True,
            noise_generator=torch.Generator().manual_seed(int(rng.integers(0, 2**31))),
        )
    seen = rng.random(K) < 0.5
    source = SeededRecordCanaries(seed, seen, sample_rate=BATCH / N)
    opt = add_record_canaries(opt, source)
    before = flat_parameters(opt)
    loss_fn = torch.nn.CrossEntropyLoss()
    for x, y in loader:
        opt.zero_grad()  # batches of 20 expected out of 400: P(empty) = 0.95^400, never seen
        loss_fn(model(x), y).backward()
        opt.step()
    delta = flat_parameters(opt) - before
    dim = delta.size
    family = OrthogonalCanaries(seed, dim)
    cos = family.dots(-delta, family.positions(np.arange(K))) / np.linalg.norm(delta)
    inc = np.zeros((K, opt.canary_step), dtype=bool)
    for t in range(opt.canary_step):
        inc[source.sampled(t), t] = True
    return seen, record_level_scores(cos, dim), inc


def opacus_check(runs: int, seed: int) -> None:
    from .record_level import Setting, claim_test, simulate_run

    print(
        f"# real Opacus, Linear({FEATURES},{CLASSES}) d=2080, {K} canaries/release (fresh family), "
        f"q={BATCH / N:g}, T={N // BATCH} steps/round, z={Z:g}, C={C:g}, lr={LR:g}; "
        f"{RELEASES} releases per audit, {runs} audits per row; claim z={Z:g}, level 5%"
    )
    print(
        "| optimizer | Opacus noise | rejected (95% CI) | included t - lam: mean, sd "
        "| numpy simulation, same shape: rejected, mean, sd |"
    )
    print("|---|---|---|---|---|")
    for momentum in (0.0, 0.9):
        for scale in (1.0, 0.5):
            rng = np.random.default_rng([seed, int(momentum * 10), int(scale * 10)])
            hits, resid = 0, []
            for _ in range(runs):
                run = [
                    opacus_release(rng, momentum=momentum, noise_multiplier=Z * scale)
                    for _ in range(RELEASES)
                ]
                setting = Setting(
                    dim=FEATURES * CLASSES + CLASSES,
                    canaries=K,
                    steps=run[0][2].shape[1],
                    sample_rate=BATCH / N,
                    noise_multiplier=Z,
                    momentum=momentum,
                    releases=RELEASES,
                )
                test, signals = claim_test(setting, run)
                hits += test.p_value < 0.05
                for (seen, scores, _), lam in zip(run, signals, strict=True):
                    included = lam > 0
                    resid.extend(scores[seen][included] - lam[included])
            sim_hits, sim_resid = 0, []
            for _ in range(runs):
                run = simulate_run(rng, setting, noise_scale=scale)
                test, signals = claim_test(setting, run)
                sim_hits += test.p_value < 0.05
                for (seen, scores, _), lam in zip(run, signals, strict=True):
                    included = lam > 0
                    sim_resid.extend(scores[seen][included] - lam[included])
            lo, hi = clopper_pearson(hits, runs)
            slo, shi = clopper_pearson(sim_hits, runs)
            r, sr = np.asarray(resid), np.asarray(sim_resid)
            name = "SGD" if momentum == 0 else f"momentum {momentum:g}"
            print(
                f"| {name} | z x {scale:g} | {hits}/{runs} ({lo:.0%}-{hi:.0%}) | "
                f"{r.mean():+.3f}, {r.std():.3f} (n={r.size}) | {sim_hits}/{runs} "
                f"({slo:.0%}-{shi:.0%}), {sr.mean():+.3f}, {sr.std():.3f} |"
            )
