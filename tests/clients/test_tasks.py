"""Built-in tasks and the user hook: sizes, non-IID partitions, determinism, training works."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from flaudit.clients.app import local_update
from flaudit.clients.tasks import Task, load_task, model_vector, set_model_vector, synthetic_task


@pytest.mark.parametrize("dim", [10_000, 100_000, 1_000_000])
def test_synthetic_model_size_tracks_dim(dim):
    task = load_task("synthetic", num_partitions=5, options={"dim": dim})
    assert abs(task.dim() - dim) <= 0.001 * dim + 50


def test_digits_model_has_about_1e5_parameters_and_partitions_cover_the_training_set():
    task = load_task("digits", num_partitions=10, seed=1)
    assert 5e4 <= task.dim() <= 5e5
    sizes = [len(task.partition(p)[1]) for p in range(10)]
    test_x, test_y = task.test_data()
    assert sum(sizes) + len(test_y) == 1797
    assert test_x.shape[1] == 64


def _label_skew(task, partitions):
    # mean total-variation distance between client label mixes and the global mix
    counts = np.array(
        [np.bincount(task.partition(p)[1], minlength=10) for p in range(partitions)], float
    )
    mixes = counts / np.maximum(counts.sum(1, keepdims=True), 1)
    overall = counts.sum(0) / counts.sum()
    return 0.5 * np.abs(mixes - overall).sum(1).mean()


@pytest.mark.parametrize("name", ["synthetic", "digits"])
def test_partitions_are_non_iid_and_deterministic(name):
    task = load_task(
        name, num_partitions=8, seed=3, options={"dim": 10_000} if name == "synthetic" else {}
    )
    assert _label_skew(task, 8) > 0.3  # an IID split of this size would be ~0.1
    again = load_task(
        name, num_partitions=8, seed=3, options={"dim": 10_000} if name == "synthetic" else {}
    )
    x1, y1 = task.partition(2)
    x2, y2 = again.partition(2)
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
    assert np.array_equal(task.initial_vector(), again.initial_vector())


def test_vector_roundtrip_and_local_training_reduces_loss():
    task = load_task("digits", num_partitions=2, seed=0, options={"hidden": 64})
    theta = task.initial_vector()
    model = task.build_model()
    set_model_vector(model, theta + 1.0)
    assert np.allclose(model_vector(model), theta + 1.0)
    before = task.evaluate_fn(_with(task, theta), task.partition(0))["loss"]
    delta, n, _ = local_update(
        task, theta, partition_id=0, epochs=5, learning_rate=0.1, batch_size=16, seed=1
    )
    after = task.evaluate_fn(_with(task, theta + delta), task.partition(0))["loss"]
    assert n == len(task.partition(0)[1]) and delta.dtype == np.float32
    assert after < before


def _with(task, vector):
    model = task.build_model()
    set_model_vector(model, vector)
    return model


def test_user_task_hook(monkeypatch):
    module = types.ModuleType("my_flaudit_task")

    def make(*, num_partitions, seed, width=7):
        base = synthetic_task(num_partitions=num_partitions, seed=seed, hidden=width)
        return Task(
            name="mine",
            build_model=base.build_model,
            partition=base.partition,
            test_data=base.test_data,
            num_partitions=num_partitions,
        )

    module.make = make
    module.not_a_task = lambda **kw: 42
    monkeypatch.setitem(sys.modules, "my_flaudit_task", module)
    task = load_task("my_flaudit_task:make", num_partitions=3, options={"width": 9})
    assert task.name == "mine" and task.dim() == 32 * 9 + 9 + 9 * 10 + 10
    with pytest.raises(ValueError, match="task_options"):
        load_task("my_flaudit_task:make", num_partitions=3, options={"colour": 1})
    with pytest.raises(ValueError, match="must return"):
        load_task("my_flaudit_task:not_a_task", num_partitions=3)
    with pytest.raises(ValueError, match="cannot be imported"):
        load_task("no_such_module_xyz:make", num_partitions=3)


@pytest.mark.parametrize(
    "options, name",
    [
        ({"dim": 0}, "task_options.dim"),
        ({"alpha": -1.0}, "task_options.alpha"),
        ({"dim": 1.5}, "task_options.dim"),
    ],
)
def test_bad_options_are_named(options, name):
    with pytest.raises(ValueError, match=name):
        load_task("synthetic", num_partitions=2, options=options)
    with pytest.raises(ValueError, match="task must be one of"):
        load_task("mnist", num_partitions=2)
