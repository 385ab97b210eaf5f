"""Record canaries in a client's DP-SGD: white-box gradient canaries added to Opacus's
``DPOptimizer`` (issue #37, first slice). Needs the ``record`` extra (``opacus==1.6.0``).

A Flower + Opacus client adds one line after ``PrivacyEngine.make_private``::

    model, optimizer, train_loader = privacy_engine.make_private(
        module=model, optimizer=optimizer, data_loader=train_loader,
        noise_multiplier=z, max_grad_norm=C, poisson_sampling=True)
    optimizer = add_record_canaries(optimizer, canaries)   # flaudit

At every DP-SGD step (every ``add_noise`` Opacus makes: skipped accumulation steps do not count)
it asks ``canaries.step_canary_sum(step, d)`` for ``s = sum_{j sampled at step} c_j`` (``k``
orthonormal unit directions, so ``||s|| = sqrt(k)``; ``d`` = the optimizer's trainable parameters
flattened in ``optimizer.params`` order) and sends it through the optimizer's **own** per-example
clipping *before* Opacus adds its noise: after Opacus has clipped and summed the real batch, the
canaries go in as one extra per-sample gradient row ``K C s / ||s||`` (pre-clip norm ``K C``,
``K =`` :data:`CANARY_PRECLIP_FACTOR` ``= 4``) given to ``self.clip_and_accumulate()`` on its own,
and what the clipping makes of it is added to ``p.summed_grad`` times ``||s||``. Under correct
flat clipping the row comes out as ``C s / ||s||`` (Opacus's factor ``C / (K C + 1e-6)``, relative
error ``< 10^-6 / (K C)``), so the step's canaries add ``C s``: each sampled canary enters exactly
like a real example whose clipped gradient is ``C c_j`` (Steinke et al. 2023). With clipping
bypassed they add ``K C s``, as ``k`` unclipped examples of norm ``K C`` would, and the audit
measures a shift of ``K`` and names clipping. Opacus then adds ``N(0, (z C)^2)`` and divides by
``expected_batch_size`` (``scale_grad``), so an inclusion moves ``p.grad`` by ``C c_j / B``.

One row scaled by ``||s||`` is exact for every per-example clipping whose factor depends only on
the example's own norm (all ``k`` canaries have the same pre-clip norm ``K C``, so ``k`` rows
``K C c_j`` would be scaled alike and sum to the same vector); its cost is one clipping of one row
(``O(d)``), not ``k``. What it catches and what not: docs/record-level.md "Clipping".

``canaries`` is any object with ``step_canary_sum(step, dim) -> np.ndarray`` (the per-step
Poisson draw and the seen/unseen split stay with whoever holds the seed;
:class:`flaudit.auditor.estimators.record_level.SeededRecordCanaries` is the local one). Only
sums are asked for: memory ``O(d)`` whatever the number of canaries.

Supported (the cosine statistic keeps the canary's direction in the update): see
:data:`SUPPORTED`. Everything else is refused with :class:`UnsupportedOptimizerError`.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
from opacus.accountants import RDPAccountant
from opacus.optimizers import DPOptimizer

__all__ = [
    "CANARY_PRECLIP_FACTOR",
    "SUPPORTED",
    "RecordCanaryDPOptimizer",
    "RecordCanarySource",
    "UnsupportedOptimizerError",
    "add_record_canaries",
    "flat_parameters",
    "opacus_epsilon",
]

SUPPORTED = (
    "record canaries support Opacus's DPOptimizer with flat clipping in one process "
    "(PrivacyEngine.make_private with clipping='flat', grad_sample_mode 'hooks' or 'functorch') "
    "around torch.optim.SGD, with or without momentum (dampening, nesterov and weight_decay "
    "allowed, maximize=False): plain and momentum SGD keep a canary's direction in the update, "
    "so the cosine statistic holds. Not supported: Adam, AdamW, RMSprop, Adagrad and any other "
    "torch optimizer (per-coordinate rescaling changes the direction), ghost clipping "
    "(DPOptimizerFastGradientClipping), per-layer clipping (DPPerLayerOptimizer, a list of "
    "max_grad_norm), adaptive clipping (AdaClipDPOptimizer) and the distributed optimizers"
)


#: ``K``: a step's canaries enter the optimizer's clipping as one per-sample gradient of norm
#: ``K * max_grad_norm``; correct clipping brings it back to ``max_grad_norm`` per canary, a
#: bypassed clipping lets ``K`` times that through (the shift the audit measures).
CANARY_PRECLIP_FACTOR = 4.0


class UnsupportedOptimizerError(TypeError):
    """The optimizer is not one the record canaries' cosine statistic holds for."""


class RecordCanarySource(Protocol):
    """What the optimizer needs from whoever holds the canaries: the step's sum of sampled
    canary directions, ``float`` array of shape ``(dim,)`` (unit vectors, not yet scaled)."""

    def step_canary_sum(self, step: int, dim: int) -> np.ndarray: ...


class RecordCanaryDPOptimizer(DPOptimizer):
    """Opacus's :class:`DPOptimizer` sending the step's canaries through its own
    ``clip_and_accumulate`` into ``summed_grad`` before the noise. Made by
    :func:`add_record_canaries` (which turns an existing ``DPOptimizer`` into one);
    ``canary_step`` counts the noised steps so far, ``canary_preclip_factor`` is ``K``."""

    record_canaries: RecordCanarySource
    canary_step: int
    canary_preclip_factor: float = CANARY_PRECLIP_FACTOR

    def canary_dim(self) -> int:
        """``d``: the trainable parameters the canaries span (``optimizer.params`` order)."""
        return sum(p.numel() for p in self.params)

    def add_canaries(self) -> None:
        """Clip ``K C s / ||s||`` (``s = step_canary_sum(canary_step, d)``) with this optimizer's
        own ``clip_and_accumulate`` and add ``||s||`` times the result to every ``summed_grad``
        (``C s`` when clipping works; nothing when no canary is sampled)."""
        dim = self.canary_dim()
        total = np.asarray(self.record_canaries.step_canary_sum(self.canary_step, dim))
        if total.shape != (dim,) or not np.all(np.isfinite(total)):
            raise ValueError(
                f"step_canary_sum must return {dim} finite values, got shape {total.shape}"
            )
        if total.dtype not in (np.float32, np.float64):
            total = total.astype(np.float64)
        norm = float(np.linalg.norm(total))  # sqrt(k) for k orthonormal canaries
        if norm == 0.0:
            return  # no canary at this step
        scale = float(self.canary_preclip_factor) * float(self.max_grad_norm) / norm
        # no upcast of a float32 sum: each piece is converted once, to its parameter's dtype
        flat = torch.from_numpy(np.ascontiguousarray(total))
        params = self.params
        batch = [(p.grad_sample, p.summed_grad) for p in params]
        try:
            offset = 0
            for p in params:
                n = p.numel()
                row = flat[offset : offset + n].to(device=p.device, dtype=p.dtype, copy=True)
                p.grad_sample = row.mul_(scale).view(1, *p.shape)  # one example: the canaries
                p.summed_grad = None
                offset += n
            self.clip_and_accumulate()  # the optimizer's own per-example clipping
            clipped = [p.summed_grad for p in params]
        finally:
            for p, (grad_sample, summed_grad) in zip(params, batch):
                p.grad_sample, p.summed_grad = grad_sample, summed_grad
        for p, canary in zip(params, clipped):
            p.summed_grad.add_(canary.view_as(p.summed_grad), alpha=norm)

    def add_noise(self) -> None:
        self.add_canaries()
        self.canary_step += 1
        super().add_noise()


def _check_supported(optimizer) -> None:
    kind = type(optimizer)
    if kind is RecordCanaryDPOptimizer:
        raise ValueError("this optimizer already adds record canaries")
    if kind is not DPOptimizer:
        raise UnsupportedOptimizerError(f"{kind.__name__} is not supported: {SUPPORTED}")
    if not isinstance(optimizer.max_grad_norm, (int, float)) or isinstance(
        optimizer.max_grad_norm, bool
    ):
        raise UnsupportedOptimizerError(
            f"max_grad_norm {optimizer.max_grad_norm!r} is not one number (per-layer clipping "
            f"is not supported): {SUPPORTED}"
        )
    inner = type(optimizer.original_optimizer)
    if inner is not torch.optim.SGD:
        raise UnsupportedOptimizerError(f"{inner.__name__} is not supported: {SUPPORTED}")
    if any(group.get("maximize", False) for group in optimizer.original_optimizer.param_groups):
        raise UnsupportedOptimizerError(f"SGD(maximize=True) is not supported: {SUPPORTED}")


def add_record_canaries(
    optimizer: DPOptimizer,
    canaries: RecordCanarySource,
    *,
    sample_rate: float | None = None,
    preclip_factor: float = CANARY_PRECLIP_FACTOR,
) -> RecordCanaryDPOptimizer:
    """Make Opacus's ``optimizer`` (from ``PrivacyEngine.make_private``) add record canaries.

    The same object is returned, now a :class:`RecordCanaryDPOptimizer` (Opacus's accountant
    hook and the data loader keep working). ``sample_rate``, when given (the DP data loader's
    ``sample_rate``), must equal ``canaries.sample_rate`` where the source has one: a canary is
    sampled at a real example's rate. ``preclip_factor`` is ``K`` (> 1; the default
    :data:`CANARY_PRECLIP_FACTOR` is what a Flower app gets): the canaries' pre-clip norm in
    ``max_grad_norm``.

    Raises
    ------
    UnsupportedOptimizerError
        Anything but a flat-clipping ``DPOptimizer`` over ``torch.optim.SGD`` (:data:`SUPPORTED`).
    """
    _check_supported(optimizer)
    if not callable(getattr(canaries, "step_canary_sum", None)):
        raise TypeError("canaries must provide step_canary_sum(step, dim)")
    own_rate = getattr(canaries, "sample_rate", None)
    if sample_rate is not None and own_rate is not None and float(own_rate) != float(sample_rate):
        raise ValueError(
            f"the canaries are sampled at {own_rate:g}, the examples at "
            f"{sample_rate:g}: they must be equal"
        )
    if not float(preclip_factor) > 1 or not np.isfinite(preclip_factor):
        raise ValueError(f"preclip_factor must be a finite number > 1, got {preclip_factor!r}")
    optimizer.__class__ = RecordCanaryDPOptimizer
    optimizer.record_canaries = canaries
    optimizer.canary_step = 0
    optimizer.canary_preclip_factor = float(preclip_factor)
    return optimizer


def flat_parameters(optimizer: DPOptimizer) -> np.ndarray:
    """The optimizer's trainable parameters flattened in the canaries' order, float64 (take it
    before and after local training: the update ``Delta`` is the difference)."""
    return torch.cat([p.detach().reshape(-1).double().cpu() for p in optimizer.params]).numpy()


def opacus_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """Opacus's own RDP accountant over ``steps`` Poisson-subsampled Gaussian steps (to put
    beside dp-accounting's :func:`flaudit.auditor.estimators.record_level.record_level_epsilon`)."""
    accountant = RDPAccountant()
    accountant.history = [(float(noise_multiplier), float(sample_rate), int(steps))]
    return float(accountant.get_epsilon(delta=delta))
