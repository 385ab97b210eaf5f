"""The built-in record-level engine of ``flaudit run`` (issue #37): FedAvg over clients that each
train with Opacus DP-SGD and record canaries, audited from the updates the server receives.

In one process, without Flower: every round each client of the cohort loads the global model,
trains :func:`flaudit.clients.record_training.train_dp_sgd` (Poisson sampling, flat clipping,
SGD; the round's canaries added before the noise) and sends its update; the server averages the
updates (plain FedAvg, no server noise: the DP is the clients') and, before that, scores each
client's update per canary. Canary ``j`` lives in client ``j mod N`` (a record of that client);
its score is the cosine of ``-U_i`` with ``c_j``, ``U_i`` the sum of client ``i``'s updates so
far (post-processing of everything the client released, so the claim over all its steps holds
for it). The data are the task's training set split evenly, so every client has the same
Poisson rate and the same steps per round.

The seed stays in this process; the canaries' per-step Poisson draws come from the seed's
stream at steps that never repeat across clients and rounds
(:class:`flaudit.clients.record_training.OffsetCanaries`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..auditor.canaries import seen_mask
from ..auditor.claims.record_alarm import record_signals
from ..auditor.estimators.record_claim import record_step_weights
from ..auditor.estimators.record_level import SeededRecordCanaries, record_canary_cosines
from ..auditor.record_spec import RecordLevelSpec
from ..clients.record_training import (
    OffsetCanaries,
    load_parameters,
    parameters_vector,
    train_dp_sgd,
)
from ..clients.tasks import load_task

__all__ = ["RecordRound", "record_plan", "record_shards", "run_record_audit", "STEP_STRIDE"]

#: Steps reserved per client in the seed's stream of per-step draws (client ``i`` draws its
#: steps from ``i * STEP_STRIDE`` on).
STEP_STRIDE = 10**9


@dataclass
class RecordRound:
    """The audit's view after one round: every canary's score (NaN while its client has not
    trained), its projections in noise and shift units (for the cause), its claimed signal so
    far (:func:`flaudit.auditor.claims.record_alarm.record_signals`: 0 for unseen or
    never-included canaries; the alarm's test weights), and the claim's parameters so far."""

    round: int
    scores: np.ndarray
    noise_units: np.ndarray
    shift_units: np.ndarray
    steps: int  # the most DP-SGD steps any client has trained so far
    sample_rate: float
    cohort: list[int] = field(default_factory=list)
    signals: np.ndarray | None = None
    dim: int = 0  # the model's dimension (the cosines' studentization)


def record_shards(spec: RecordLevelSpec):
    """The spec's task and its training data split evenly over ``num_clients`` (a fixed
    permutation from ``data_seed``): ``(task, [(x_i, y_i)])``."""
    task = load_task(
        spec.task, num_partitions=1, seed=spec.data_seed, options=dict(spec.task_options)
    )
    x, y = task.partition(0)
    n = len(y) // spec.num_clients
    if n < 1:
        raise ValueError(
            f"{len(y)} training examples cannot be split over {spec.num_clients} clients"
        )
    order = np.random.default_rng([spec.data_seed, 37]).permutation(len(y))[: n * spec.num_clients]
    parts = order.reshape(spec.num_clients, n)
    return task, [(x[p], y[p]) for p in parts]


def record_plan(spec: RecordLevelSpec) -> dict:
    """Before training: ``examples_per_client``, Opacus's Poisson ``sample_rate``
    (``1 / ceil(n / batch_size)``) and ``steps_per_round`` (``epochs / sample_rate``: Opacus's
    Poisson loader has as many batches as the plain one)."""
    _, shards = record_shards(spec)
    n = len(shards[0][1])
    batches = math.ceil(n / spec.batch_size)
    return {
        "examples_per_client": n,
        "sample_rate": 1.0 / batches,
        "steps_per_round": spec.local_epochs * batches,
    }


def run_record_audit(
    spec: RecordLevelSpec,
    *,
    canary_seed: int,
    on_round: Callable[[RecordRound], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
    timeout: float | None = None,
) -> dict:
    """Train and score; ``on_round`` sees every round's :class:`RecordRound` and returns True to
    stop training there (the alarm's ``stop_on_alarm``).

    Returns the run's facts: ``dim``, ``sample_rate``, ``steps_per_round``, ``rounds_trained``
    (per client), ``metrics`` of the final model, ``seconds``, ``stopped_at_round``.

    Raises
    ------
    ValueError
        More canaries than the model's dimension, or too little data.
    TimeoutError
        The run took longer than ``timeout`` (the spec's ``timeout_seconds`` when None).
    """
    started = time.monotonic()
    limit = spec.timeout_seconds if timeout is None else float(timeout)
    task, shards = record_shards(spec)
    model = task.build_model()
    theta = parameters_vector(model)
    dim = int(theta.size)
    k = spec.num_canaries
    if k > dim:
        raise ValueError(
            f"num_canaries ({k}) must be at most the model's dimension ({dim}): record canaries "
            "are an orthogonal family"
        )
    seen = seen_mask(canary_seed, k)
    owner = np.arange(k) % spec.num_clients
    batches = math.ceil(len(shards[0][1]) / spec.batch_size)
    sample_rate = 1.0 / batches
    sources = [
        SeededRecordCanaries(canary_seed, seen & (owner == i), sample_rate=sample_rate)
        for i in range(spec.num_clients)
    ]
    family = sources[0].family(dim)
    totals = np.zeros((spec.num_clients, dim))  # U_i: the sum of client i's updates so far
    steps_done = np.zeros(spec.num_clients, dtype=np.int64)
    factor_sum = np.zeros(spec.num_clients)
    factor_square_sum = np.zeros(spec.num_clients)
    divisor = np.ones(spec.num_clients)  # Opacus's expected batch size (same for every client)
    rounds_trained = np.zeros(spec.num_clients, dtype=np.int64)
    weight_sums = np.zeros(k)  # per canary: sum of w_t over the steps it was included at
    weight_square_sums = np.zeros(spec.num_clients)  # per client: sum of ||w_r||^2
    schedule = np.random.default_rng([spec.data_seed, 38])
    stopped_at = None
    steps_per_round = 0
    for server_round in range(1, spec.num_rounds + 1):
        if spec.clients_per_round is None:
            cohort = list(range(spec.num_clients))
        else:
            cohort = sorted(
                int(i)
                for i in schedule.choice(spec.num_clients, spec.clients_per_round, replace=False)
            )
        updates = []
        for i in cohort:
            if time.monotonic() - started > limit:
                raise TimeoutError(f"the record-level audit ran past its {limit:g} s timeout")
            local = task.build_model()
            load_parameters(local, theta)
            result = train_dp_sgd(
                local,
                shards[i],
                noise_multiplier=spec.noise_multiplier,
                max_grad_norm=spec.max_grad_norm,
                batch_size=spec.batch_size,
                epochs=spec.local_epochs,
                learning_rate=spec.learning_rate,
                momentum=spec.momentum,
                canaries=OffsetCanaries(sources[i], i * STEP_STRIDE + int(steps_done[i])),
                seed=hash((spec.data_seed, server_round, i)) % (2**63),
                bug=spec.inject_bug,
            )
            delta = parameters_vector(local) - theta
            updates.append(delta)
            totals[i] += delta
            if result.steps > 0:
                weights = record_step_weights(result.steps, momentum=spec.momentum)
                weight_sums += sources[i].included_weight_sums(
                    i * STEP_STRIDE + int(steps_done[i]), weights
                )
                weight_square_sums[i] += float(np.sum(weights**2))
            steps_done[i] += result.steps
            steps_per_round = result.steps
            factor_sum[i] += result.factor_sum
            factor_square_sum[i] += result.factor_square_sum
            divisor[i] = result.expected_batch_size
            rounds_trained[i] += 1
        theta = theta + np.mean(updates, axis=0)
        view = _score(
            spec,
            family,
            totals,
            owner,
            steps_done,
            factor_sum,
            factor_square_sum,
            divisor,
            sample_rate,
        )
        view = RecordRound(
            round=server_round,
            scores=view[0],
            noise_units=view[1],
            shift_units=view[2],
            steps=int(steps_done.max()),
            sample_rate=sample_rate,
            cohort=cohort,
            dim=dim,
            signals=(
                record_signals(
                    weight_sums,
                    weight_square_sums,
                    owner,
                    noise_multiplier=spec.noise_multiplier,
                )
                if spec.noise_multiplier > 0
                else np.zeros(k)
            ),
        )
        if progress is not None:
            progress(server_round, spec.num_rounds)
        if on_round is not None and on_round(view) and server_round < spec.num_rounds:
            stopped_at = server_round
            break
    load_parameters(model, theta)
    metrics = task.evaluate_fn(model, task.test_data())
    return {
        "dim": dim,
        "sample_rate": sample_rate,
        "steps_per_round": steps_per_round,
        "examples_per_client": len(shards[0][1]),
        "rounds_trained": rounds_trained.tolist(),
        "metrics": metrics,
        "seconds": time.monotonic() - started,
        "stopped_at_round": stopped_at,
    }


def _score(
    spec, family, totals, owner, steps_done, factor_sum, factor_square_sum, divisor, sample_rate
):
    """Every canary's cosine with its client's summed update, and its projection in noise units
    (over ``(lr / B) C sqrt(sum m_t^2)``) and shift units (over ``(lr / B) C q sum m_t``)."""
    k = owner.size
    scores = np.full(k, np.nan)
    noise_units = np.full(k, np.nan)
    shift_units = np.full(k, np.nan)
    for i in range(spec.num_clients):
        if steps_done[i] == 0 or not np.any(totals[i]):
            continue
        mine = np.flatnonzero(owner == i)
        scores[mine] = record_canary_cosines(totals[i], family, mine)
        projection = family.dots(-totals[i], family.positions(mine))
        scale = spec.learning_rate / divisor[i] * spec.max_grad_norm
        noise_units[mine] = projection / (scale * math.sqrt(factor_square_sum[i]))
        shift_units[mine] = projection / (scale * sample_rate * factor_sum[i])
    return scores, noise_units, shift_units
