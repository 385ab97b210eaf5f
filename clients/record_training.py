"""One client's local training with Opacus DP-SGD and record canaries (issue #37): what the
built-in record-level engine (``server/record_engine.py``) runs in every client every round.

Opacus builds the DP-SGD: ``PrivacyEngine.make_private`` with Poisson sampling and flat clipping
around ``torch.optim.SGD``, rebuilt every round as Flower's ``examples/opacus`` does; then
:func:`flaudit.clients.record_canaries.add_record_canaries` adds the round's canaries. The
deliberate bugs (testing only; the claim never knows about them) are made here:

* ``noise_scale=f``: the optimizer is built with ``f * z`` (it adds ``f`` times the claimed noise);
  ``no_noise``: with 0;
* ``no_clipping=f``: per-example clipping is bypassed for real (:class:`ClippingBypassedOptimizer`:
  its ``clip_and_accumulate`` sums the unclipped per-sample gradients; the noise still uses
  ``max_grad_norm``), and the canaries, which go through that same ``clip_and_accumulate``, come
  in at pre-clip norm ``f * max_grad_norm`` (``preclip_factor=f``; a Flower app's is the fixed
  ``K = 4`` of :data:`flaudit.clients.record_canaries.CANARY_PRECLIP_FACTOR`, the default ``f``),
  so they reach the update ``f`` times too large, as unclipped large examples would.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ..auditor.bugs import DPBug, InjectedBug
from .record_canaries import RecordCanaryDPOptimizer, add_record_canaries

__all__ = [
    "ClippingBypassedOptimizer",
    "LocalDPSGD",
    "OffsetCanaries",
    "load_parameters",
    "momentum_factors",
    "parameters_vector",
    "train_dp_sgd",
]


class OffsetCanaries:
    """A canary source whose step numbers start at ``offset``: every (client, round) draws its
    Poisson inclusions from its own steps of the seed's stream, never reusing another's."""

    def __init__(self, source, offset: int) -> None:
        self.source = source
        self.offset = int(offset)
        self.sample_rate = getattr(source, "sample_rate", None)

    def __repr__(self) -> str:
        return f"OffsetCanaries({self.source!r}, offset={self.offset})"

    def step_canary_sum(self, step: int, dim: int) -> np.ndarray:
        return self.source.step_canary_sum(self.offset + int(step), dim)


class ClippingBypassedOptimizer(RecordCanaryDPOptimizer):
    """Testing only: Opacus's ``DPOptimizer`` with per-example clipping bypassed, as a broken app
    would have it: ``clip_and_accumulate`` sums the per-sample gradients unclipped (the noise is
    still ``N(0, (z C)^2)``, what the claim accounts). Nothing here touches the canaries: they
    pass through this same ``clip_and_accumulate`` (:meth:`RecordCanaryDPOptimizer.add_canaries`)."""

    def clip_and_accumulate(self) -> None:
        for p in self.params:
            grad = self._get_flat_grad_sample(p).to(p.dtype).sum(dim=0)
            p.summed_grad = grad if p.summed_grad is None else p.summed_grad + grad


@dataclass(frozen=True)
class LocalDPSGD:
    """What one client's round did: ``steps`` noised steps, the Poisson ``sample_rate``, Opacus's
    ``expected_batch_size`` (the divisor of the noised sum) and the momentum factors
    ``sum_t m_t`` and ``sum_t m_t^2`` of its steps (``m_t = (1 - beta^(T - t)) / (1 - beta)``,
    how far an impulse at step ``t`` moves the parameters by the end of the round, in ``lr``)."""

    steps: int
    sample_rate: float
    expected_batch_size: int
    factor_sum: float
    factor_square_sum: float
    loss: float


def momentum_factors(steps: int, momentum: float) -> np.ndarray:
    """``m_t`` for ``t = 0 .. steps - 1`` (all 1 without momentum)."""
    if momentum == 0:
        return np.ones(steps)
    remaining = steps - np.arange(steps)
    return (1.0 - momentum**remaining) / (1.0 - momentum)


def train_dp_sgd(
    model: nn.Module,
    data: tuple[np.ndarray, np.ndarray],
    *,
    noise_multiplier: float,
    max_grad_norm: float,
    batch_size: int,
    epochs: int,
    learning_rate: float,
    momentum: float,
    canaries,
    seed: int,
    bug: InjectedBug | None = None,
) -> LocalDPSGD:
    """Train ``model`` in place on ``data`` with Opacus DP-SGD plus record canaries."""
    from opacus import PrivacyEngine

    torch.manual_seed(int(seed) % (2**63))  # Opacus's Poisson batches and noise (not secure_mode)
    x = torch.as_tensor(data[0], dtype=torch.float32)
    y = torch.as_tensor(data[1], dtype=torch.int64)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch_size)
    z = noise_multiplier
    if bug is not None and bug.kind is DPBug.noise_scale:
        z = noise_multiplier * float(bug.factor)
    elif bug is not None and bug.kind is DPBug.no_noise:
        z = 0.0
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate, momentum=momentum)
    engine = PrivacyEngine()
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=optimizer,
        data_loader=loader,
        noise_multiplier=z,
        max_grad_norm=max_grad_norm,
        poisson_sampling=True,
    )
    bypassed = bug is not None and bug.kind is DPBug.no_clipping
    optimizer = add_record_canaries(
        optimizer,
        canaries,
        sample_rate=loader.sample_rate,
        **({"preclip_factor": float(bug.factor)} if bypassed else {}),
    )
    if bypassed:
        optimizer.__class__ = ClippingBypassedOptimizer
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    total, count = 0.0, 0
    for _ in range(epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb) if len(yb) else (model(xb).sum() * 0.0)
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(yb)
            count += len(yb)
    steps = int(optimizer.canary_step)
    factors = momentum_factors(steps, momentum)
    return LocalDPSGD(
        steps=steps,
        sample_rate=float(loader.sample_rate),
        expected_batch_size=int(optimizer.expected_batch_size),
        factor_sum=float(factors.sum()),
        factor_square_sum=float((factors**2).sum()),
        loss=total / max(count, 1),
    )


def parameters_vector(model: nn.Module) -> np.ndarray:
    """The trainable parameters flattened in ``model.parameters()`` order (the optimizer's and
    so the canaries' order), float64."""
    return torch.cat([p.detach().reshape(-1).double().cpu() for p in model.parameters()]).numpy()


def load_parameters(model: nn.Module, vector: np.ndarray) -> None:
    """Load a :func:`parameters_vector` back into ``model`` in place."""
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            n = p.numel()
            piece = torch.from_numpy(np.ascontiguousarray(vector[offset : offset + n]))
            p.copy_(piece.view_as(p).to(p.dtype))
            offset += n
