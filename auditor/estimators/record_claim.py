"""What a record-level DP-SGD claim implies for the record canaries' scores (issue #37).

A client trains ``T`` DP-SGD steps in a round with Opacus (noise multiplier ``z``, clip norm
``C``, Poisson rate ``q``, expected batch ``B``); at step ``t`` each seen canary ``j`` is included
with probability ``q`` (``I_jt``) and ``C c_j`` joins the clipped sum before the noise
``N(0, (zC)^2 I)`` (``clients/record_canaries.py``). The optimizer turns the step gradients
``g_t`` into the round's update; for ``torch.optim.SGD`` (momentum ``beta``, dampening ``tau``,
Nesterov, weight decay ``lambda``) that map is linear and the same on every coordinate, so

    -Delta = lr * sum_t w_t g_t  (+ the weight decay's pull on theta_0, which no canary enters)

with step weights ``w_t`` (:func:`record_step_weights`: 1 for plain SGD,
``(1 - beta^(T-t)) / (1 - beta)`` with momentum). Along a canary direction (orthonormal family,
isotropic noise) ``<-Delta, c_j> = (lr C / B) [sum_t w_t I_jt + z sum_t w_t xi_jt] + data``,
``xi`` i.i.d. ``N(0, 1)``. In noise units (``lr z C ||w|| / B``):

* a **never-included** canary (unseen, or seen and never sampled this round) scores
  ``N(0, 1)`` -- exactly, on its cosine's normal score, whatever the mechanism (the update does
  not depend on its direction);
* an **included** canary, given the steps ``S_j`` it was included at, scores
  ``N(lam_j, 1)`` with ``lam_j = sum_{t in S_j} w_t / (z ||w||)``
  (:func:`record_level_claimed_mu`): a per-canary Gaussian-DP ``mu`` of the statistic. The
  auditor holds the seed, so it knows ``S_j``. ``lam_j <= sqrt(|S_j|) / z``, the mechanism's own
  GDP towards a canary whose steps are known (Cauchy-Schwarz; equality only when every step
  includes it with equal weights): the round's one update hides how the inclusions were spread;
* **unconditionally** (only the seen/unseen label known, the Poisson draws not) a seen canary
  scores the mixture ``N(0, 1) + sum_t (w_t / (z ||w||)) Bernoulli(q)``
  (:func:`record_seen_score_sf`): what Steinke et al.'s and jax_privacy's auditors see.

The data gradients add a projection that does not depend on which canaries are included and
raise the scale the cosine is studentized by: they only lower the signal in noise units.
The claim test on these signals is in :mod:`flaudit.auditor.claims.record_level`.

Pure numpy/scipy: arrays in, numbers out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import special, stats

from ._validation import check_finite, check_nonnegative

__all__ = [
    "RECORD_CLAIM_SUPPORTED",
    "UnsupportedRecordClaimError",
    "check_record_optimizer",
    "record_level_claimed_mu",
    "record_level_signals",
    "record_seen_score_sf",
    "record_step_weights",
]

#: What the record-level claim test holds for (the error message of every refusal).
RECORD_CLAIM_SUPPORTED = (
    "the record-level claim test holds for DP-SGD with flat per-example clipping, "
    "Poisson-sampled record canaries and Gaussian noise, with torch.optim.SGD as the optimizer "
    "(optimizer='sgd': plain, or with momentum, dampening, nesterov, weight_decay), each round "
    "starting from an empty momentum buffer; not for Adam, AdamW, RMSprop, Adagrad or any other "
    "optimizer (per-coordinate rescaling changes the canary's direction), ghost clipping, "
    "per-layer or adaptive clipping"
)

_OPTIMIZERS = ("sgd",)
_CLIPPINGS = ("flat",)
#: The longest local round (steps) a claim is computed for, and with weight decay (T x T work).
_MAX_STEPS = 1_000_000
_MAX_STEPS_DECAY = 20_000


class UnsupportedRecordClaimError(ValueError):
    """The claimed optimizer or clipping is not one the record-level claim test holds for."""


def check_record_optimizer(optimizer: str = "sgd", clipping: str = "flat") -> None:
    """Refuse what the claim test does not hold for (:data:`RECORD_CLAIM_SUPPORTED`)."""
    if str(optimizer).lower() not in _OPTIMIZERS:
        raise UnsupportedRecordClaimError(
            f"optimizer {optimizer!r} is not supported: {RECORD_CLAIM_SUPPORTED}"
        )
    if str(clipping).lower() not in _CLIPPINGS:
        raise UnsupportedRecordClaimError(
            f"clipping {clipping!r} is not supported: {RECORD_CLAIM_SUPPORTED}"
        )


def _check_steps(steps: int) -> int:
    if isinstance(steps, bool) or int(steps) != steps or not 1 <= steps <= _MAX_STEPS:
        raise ValueError(f"steps must be an integer in [1, {_MAX_STEPS}], got {steps!r}")
    return int(steps)


def record_step_weights(
    steps: int,
    *,
    momentum: float = 0.0,
    dampening: float = 0.0,
    nesterov: bool = False,
    weight_decay: float = 0.0,
    lr: float | None = None,
) -> np.ndarray:
    """``w_t``, ``t = 0..T-1``: how much step ``t``'s gradient moves the round's update.

    ``-Delta = lr * sum_t w_t g_t`` for ``torch.optim.SGD``'s update rule (the first step fills
    the momentum buffer undampened, as torch does); found as the impulse response of the
    scalar recursion, so momentum, dampening, Nesterov and weight decay are exact. ``lr`` is
    needed only with weight decay (otherwise it factors out). Plain SGD: all ones.
    """
    steps = _check_steps(steps)
    beta = check_finite(momentum, "momentum")
    tau = check_finite(dampening, "dampening")
    wd = check_nonnegative(weight_decay, "weight_decay")
    if not 0 <= beta < 1:
        raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
    if not 0 <= tau < 1:
        raise ValueError(f"dampening must be in [0, 1), got {dampening!r}")
    if nesterov and (beta == 0 or tau != 0):
        raise ValueError("nesterov needs momentum > 0 and dampening 0 (as torch.optim.SGD)")
    if wd > 0:
        if lr is None or not float(lr) > 0:
            raise ValueError("lr > 0 is needed with weight_decay")
        lr = float(lr)
    else:
        lr = 1.0
    if wd == 0:  # closed forms of the recursion below (no lr: it factors out)
        left = np.arange(steps, 0, -1, dtype=np.float64)  # T - s
        if beta == 0:
            return np.ones(steps)
        tail = (1.0 - beta**left) / (1.0 - beta)  # sum_{t >= s} beta^(t - s)
        if nesterov:
            return 1.0 + beta * tail
        out = (1.0 - tau) * tail
        out[0] = tail[0]  # torch fills the buffer with the first gradient undampened
        return out
    if steps > _MAX_STEPS_DECAY:
        raise ValueError(f"weight decay: at most {_MAX_STEPS_DECAY} steps, got {steps}")
    # column s: the scalar system driven by a unit gradient at step s only
    p = np.zeros(steps)
    buf = np.zeros(steps)
    for t in range(steps):
        d_p = wd * p
        d_p[t] += 1.0
        if beta > 0:
            buf = d_p.copy() if t == 0 else beta * buf + (1.0 - tau) * d_p
            d_p = d_p + beta * buf if nesterov else buf
        p = p - lr * d_p
    return -p / lr


def _included_weights(weights: np.ndarray, included_steps) -> float:
    steps = np.asarray(included_steps, dtype=np.int64).ravel()
    if steps.size and (steps.min() < 0 or steps.max() >= weights.size):
        raise ValueError(f"included steps must be in [0, {weights.size}), got {steps.tolist()}")
    if np.unique(steps).size != steps.size:
        raise ValueError("included steps must not repeat (a canary is included once a step)")
    return float(weights[steps].sum())


def _check_z(noise_multiplier: float) -> float:
    z = check_finite(noise_multiplier, "noise_multiplier")
    if not z > 0:
        raise ValueError(
            f"noise_multiplier must be > 0 for a record-level claim to test, got {z!r}"
        )
    return z


def record_level_claimed_mu(
    noise_multiplier: float,
    included_steps: Sequence[int] | np.ndarray,
    steps_per_round: int,
    *,
    optimizer: str = "sgd",
    clipping: str = "flat",
    **sgd,
) -> float:
    """The claimed signal of one canary in one round's update: ``lam = sum_{t in S} w_t / (z ||w||)``.

    Under the claim (noise multiplier ``z``, canaries at the clip norm) the canary's studentized
    score with the round's update is ``N(lam, 1)`` given the steps ``S`` (``included_steps``,
    0-based within the round, from the seed) it was included at; 0 when it was never included.
    It is the per-canary Gaussian-DP ``mu`` of the cosine statistic (not of the mechanism, whose
    GDP towards a canary with known steps is ``sqrt(|S|) / z >= lam``). The sample rate does not
    enter: the inclusions are conditioned on.

    Parameters
    ----------
    noise_multiplier : float
        The claimed ``z > 0`` (Opacus's ``noise_multiplier``).
    included_steps : sequence of int
        The steps of this round the canary was included at (each in ``[0, steps_per_round)``).
    steps_per_round : int
        ``T``: noised DP-SGD steps the client made this round.
    **sgd
        ``torch.optim.SGD``'s arguments ``momentum``, ``dampening``, ``nesterov``,
        ``weight_decay`` and ``lr`` (:func:`record_step_weights`; default plain SGD).
    optimizer, clipping : str
        Only ``"sgd"`` and ``"flat"``; anything else raises
        :class:`UnsupportedRecordClaimError` (its message names what is supported).
    """
    check_record_optimizer(optimizer, clipping)
    z = _check_z(noise_multiplier)
    w = record_step_weights(steps_per_round, **sgd)
    return _included_weights(w, included_steps) / (z * float(np.linalg.norm(w)))


def record_level_signals(
    noise_multiplier: float,
    inclusions,
    *,
    optimizer: str = "sgd",
    clipping: str = "flat",
    **sgd,
) -> np.ndarray:
    """:func:`record_level_claimed_mu` for many canaries of one round at once: ``inclusions`` is
    a boolean ``(k, T)`` array (row ``j``: the steps canary ``j`` was included at); returns
    ``(k,)`` signals. ``sgd``: as for :func:`record_level_claimed_mu`."""
    check_record_optimizer(optimizer, clipping)
    z = _check_z(noise_multiplier)
    inc = np.asarray(inclusions, dtype=bool)
    if inc.ndim != 2 or inc.shape[1] < 1:
        raise ValueError(f"inclusions must be a (k, T) boolean array, got shape {inc.shape}")
    w = record_step_weights(inc.shape[1], **sgd)
    return inc.astype(np.float64) @ w / (z * float(np.linalg.norm(w)))


def record_seen_score_sf(
    x,
    noise_multiplier: float,
    sample_rate: float,
    steps_per_round: int,
    **sgd,
) -> np.ndarray:
    """``P(Y > x)`` for a seen canary's score in one round when its Poisson draws are unknown:
    ``Y = N(0, 1) + sum_t a_t Bernoulli(q)``, ``a_t = w_t / (z ||w||)``.

    Plain SGD (equal weights): the binomial mixture ``sum_k Bin(T, q)(k) Phi(k a - x)``.
    Otherwise Gil-Pelaez inversion of the characteristic function
    ``exp(-u^2/2) prod_t (1 - q + q e^{i u a_t})`` (``sgd``: torch SGD's arguments, as for
    :func:`record_level_claimed_mu`) (midpoint rule on ``u`` in ``(0, 14]``,
    where the Gaussian factor has fallen below ``e^-98``): absolute error below ``1e-9``
    (checked against the binomial form), so tails under ``1e-8`` are not resolved.
    """
    z = _check_z(noise_multiplier)
    q = check_finite(sample_rate, "sample_rate")
    if not 0 < q <= 1:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
    w = record_step_weights(steps_per_round, **sgd)
    a = w / (z * float(np.linalg.norm(w)))
    xs = np.asarray(x, dtype=np.float64)
    flat = xs.ravel()
    if np.allclose(a, a[0], rtol=1e-12, atol=0):
        k = np.arange(a.size + 1)
        pmf = stats.binom.pmf(k, a.size, q)
        out = special.ndtr(k[None, :] * a[0] - flat[:, None]) @ pmf
        return out.reshape(xs.shape)
    n = 20_000
    u = (np.arange(n) + 0.5) * (14.0 / n)
    log_phi = -0.5 * u * u + np.sum(np.log(1.0 - q + q * np.exp(1j * np.outer(u, a))), axis=1)
    phi = np.exp(log_phi)
    out = np.empty(flat.shape)
    for i, xi in enumerate(flat):
        integrand = np.imag(np.exp(-1j * u * xi) * phi) / u
        out[i] = 0.5 + float(np.sum(integrand)) * (14.0 / n) / math.pi
    return np.clip(out, 0.0, 1.0).reshape(xs.shape)
