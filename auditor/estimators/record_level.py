"""Record-level DP-SGD inside clients (issue #37, first slice): the pure math.

White-box gradient canaries (Steinke et al. 2023): canary ``j`` is a secret unit direction
``c_j`` of the orthogonal family (:class:`flaudit.auditor.canaries.OrthogonalCanaries`); at every
DP-SGD step each *seen* canary is included independently with the optimizer's Poisson rate ``q``
and ``max_grad_norm * c_j`` is added to the clipped per-example gradient sum before the noise
(``clients/record_canaries.py`` does the adding). Unseen canaries are never included.

Here:

* :class:`SeededRecordCanaries`: the per-step sums ``sum_{j sampled at step t} c_j`` regenerated
  from the audit's seed and seen mask (for tests and the built-in engine, whose worker holds the
  seed; a Flower client is meant to receive only what it needs, a transport still to design).
  ``O(d)`` memory and ``O(d log d)`` time per step whatever the number of canaries: the sum is
  ``R`` applied to a sparse vector (:meth:`OrthogonalCanaries.sum_of`), no ``k x d`` matrix.
* :func:`record_canary_cosines`: the statistic, Andrew et al.'s cosine, of a client's update
  ``Delta = theta_after - theta_before``. SGD moves the parameters by ``-lr * grad``, so a
  canary's footprint in ``Delta`` is along ``-c_j``: the score is ``cos(-Delta, c_j)``
  (positive for an included canary). With momentum the footprint of an inclusion at step ``t`` of
  ``T`` is ``-lr C/B (1 - mu^(T-t)) / (1 - mu)`` times ``c_j`` (same direction, scaled).
* :func:`record_level_epsilon`: the claim for the whole run, the Poisson-subsampled Gaussian
  ``(z, q)`` composed over every step of every round the client trained (dp-accounting, RDP and
  PLD, through :func:`flaudit.auditor.estimators.analytic.analytic_epsilon`), and
  :func:`record_level_per_round_epsilon`, the per-round figure Flower's ``examples/opacus``
  prints (it rebuilds its PrivacyEngine each round, so its accountant only sees one round).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ..canaries import OrthogonalCanaries
from ..results import EpsilonResult
from ._validation import check_delta, check_nonnegative
from .analytic import analytic_epsilon

__all__ = [
    "RECORD_SAMPLING_STREAM",
    "SeededRecordCanaries",
    "record_canary_cosines",
    "record_level_epsilon",
    "record_level_per_round_epsilon",
    "record_level_steps",
]

#: SeedSequence spawn key ``(3, step)`` of the per-step Poisson draws: streams 0..2 are the
#: canary families' and the seen/unseen split's (:mod:`flaudit.auditor.canaries`).
RECORD_SAMPLING_STREAM = 3


def _check_rate(sample_rate: float) -> float:
    q = check_nonnegative(sample_rate, "sample_rate")
    if not (0 < q <= 1):
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
    return q


class SeededRecordCanaries:
    """Per-step canary sums from the audit's seed and seen mask (the local canary source).

    Parameters
    ----------
    seed : int
        The audit's secret master seed (kept only inside; never shown by ``repr``).
    seen : array of bool, shape (k,)
        The seen/unseen split (:func:`flaudit.auditor.canaries.seen_mask`): only seen canaries
        are ever sampled.
    sample_rate : float
        The Poisson rate ``q`` of a real example in the client's DP-SGD (Opacus's
        ``sample_rate``, ``1 / len(data_loader)``).
    """

    def __init__(self, seed: int, seen, *, sample_rate: float) -> None:
        seen = np.asarray(seen, dtype=bool).reshape(-1)
        self.num_canaries = int(seen.size)
        self.sample_rate = _check_rate(sample_rate)
        self._seed = seed
        self._seen = np.flatnonzero(seen)  # O(k) indices, never vectors
        self._family: OrthogonalCanaries | None = None
        OrthogonalCanaries(seed, 2)  # validates the seed now, not at the first step

    def __repr__(self) -> str:  # never show the seed or the split
        return f"SeededRecordCanaries(k={self.num_canaries}, sample_rate={self.sample_rate:g})"

    def family(self, dim: int) -> OrthogonalCanaries:
        """The orthogonal family at dimension ``dim`` (built once, ``O(d)`` bits)."""
        if self._family is None or self._family.dim != dim:
            if self.num_canaries > dim:
                raise ValueError(
                    f"{self.num_canaries} canaries need a model of dimension "
                    f">= {self.num_canaries} (the orthogonal family), got {dim}"
                )
            self._family = OrthogonalCanaries(self._seed, dim)
        return self._family

    def sampled(self, step: int) -> np.ndarray:
        """Indices of the seen canaries included at ``step`` (each with probability ``q``,
        independently, from the stream keyed by ``(seed, 3, step)``)."""
        if isinstance(step, bool) or int(step) != step or step < 0:
            raise ValueError(f"step must be an integer >= 0, got {step!r}")
        sequence = np.random.SeedSequence(
            entropy=self._seed, spawn_key=(RECORD_SAMPLING_STREAM, int(step))
        )
        draws = np.random.Generator(np.random.Philox(sequence)).random(self._seen.size)
        return self._seen[draws < self.sample_rate]

    def included_weight_sums(self, first_step: int, weights) -> np.ndarray:
        """``(k,)``: for every canary, the sum of ``weights[t]`` over the steps ``t`` of a round
        (stream steps ``first_step + t``) it was included at (0 for unseen canaries): the
        numerator of its claimed signal (:func:`flaudit.auditor.claims.record_alarm.record_signals`,
        step weights from :func:`flaudit.auditor.estimators.record_claim.record_step_weights`)."""
        weights = np.asarray(weights, dtype=np.float64).reshape(-1)
        out = np.zeros(self.num_canaries)
        for t, w in enumerate(weights):
            out[self.sampled(int(first_step) + t)] += w
        return out

    def step_canary_sum(self, step: int, dim: int) -> np.ndarray:
        """``sum_{j in sampled(step)} c_j``, float32 of length ``dim`` (zeros if none): the
        parameters' precision, and half the transform's time of float64 (the per-step cost the
        client pays, docs/benchmarks.md "Record canaries: overhead")."""
        return self.family(dim).sum_of(self.sampled(step), dtype=np.float32)


def record_canary_cosines(update, canaries: OrthogonalCanaries, indices) -> np.ndarray:
    """``cos(-Delta, c_j)`` for the canaries ``indices``: the score of a client's update.

    ``update`` is ``theta_after - theta_before`` flattened in the optimizer's parameter order
    (the order the canaries were added in). The sign is flipped because SGD steps along
    ``-grad``: an included canary pushes ``Delta`` along ``-c_j`` and scores positive.
    """
    update = np.asarray(update, dtype=np.float64).reshape(-1)
    if update.size != canaries.dim:
        raise ValueError(f"update has {update.size} values, the canaries dimension {canaries.dim}")
    norm = float(np.linalg.norm(update))
    if not np.isfinite(norm) or norm == 0:
        raise ValueError("update must be finite and nonzero to score a cosine")
    return canaries.dots(-update, canaries.positions(indices)) / norm


def record_level_steps(steps_per_round: int | Sequence[int], rounds_trained: int | None) -> int:
    """Total DP-SGD steps of one client: ``steps_per_round * rounds_trained``, or the sum of a
    per-round list (one entry per round it trained; ``rounds_trained`` then ``None``)."""
    if isinstance(steps_per_round, Sequence):
        if rounds_trained is not None and rounds_trained != len(steps_per_round):
            raise ValueError("rounds_trained must match the number of per-round step counts")
        counts = list(steps_per_round)
    else:
        if rounds_trained is None:
            raise ValueError("rounds_trained is required with one steps_per_round for all rounds")
        if (
            isinstance(rounds_trained, bool)
            or int(rounds_trained) != rounds_trained
            or rounds_trained < 1
        ):
            raise ValueError(f"rounds_trained must be an integer >= 1, got {rounds_trained!r}")
        counts = [steps_per_round] * int(rounds_trained)
    if not counts:
        raise ValueError("a client must have trained at least one round")
    for s in counts:
        if isinstance(s, bool) or int(s) != s or s < 1:
            raise ValueError(f"steps per round must be integers >= 1, got {s!r}")
    return int(sum(int(s) for s in counts))


def record_level_epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps_per_round: int | Sequence[int],
    delta: float,
    *,
    rounds_trained: int | None = None,
    accountants: tuple[str, ...] = ("rdp", "pld"),
) -> list[EpsilonResult]:
    """The record-level claim for the whole run: Poisson-subsampled Gaussian ``(z, q)`` composed
    over all ``steps_per_round x rounds_trained`` steps (one result per accountant).

    The composition is the same mechanism as DP-FedAvg's user-level one (an example is a client,
    a step is a round), so this is :func:`analytic_epsilon` over the total step count, with the
    result relabelled (threat model ``record_level``)."""
    z = check_nonnegative(noise_multiplier, "noise_multiplier")
    q = _check_rate(sample_rate)
    delta = check_delta(delta)
    steps = record_level_steps(steps_per_round, rounds_trained)
    rounds = len(steps_per_round) if isinstance(steps_per_round, Sequence) else int(rounds_trained)
    out = []
    for result in analytic_epsilon(z, q, steps, delta, accountants=accountants):
        name = result.details["accountant"]
        out.append(
            replace(
                result,
                threat_model="record_level",
                method=f"dp-accounting {name.upper()} accountant: Poisson-subsampled Gaussian "
                f"(z={z:g}, q={q:g}) composed over {steps} DP-SGD steps in {rounds} round(s)",
                details={
                    "accountant": name,
                    "noise_multiplier": z,
                    "sample_rate": q,
                    "steps": steps,
                    "rounds_trained": rounds,
                },
            )
        )
    return out


def record_level_per_round_epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps_per_round: int,
    delta: float,
    *,
    accountants: tuple[str, ...] = ("rdp", "pld"),
) -> list[EpsilonResult]:
    """The epsilon of one round alone (what a per-round PrivacyEngine, as in Flower's
    ``examples/opacus``, reports): :func:`record_level_epsilon` with one round."""
    return record_level_epsilon(
        noise_multiplier,
        sample_rate,
        steps_per_round,
        delta,
        rounds_trained=1,
        accountants=accountants,
    )
