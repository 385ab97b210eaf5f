"""Built-in offline tasks and the hook for your own.

A :class:`Task` bundles a model builder and federated data: ``partition(p)`` returns client
``p``'s training set, ``test_data()`` a held-out set for accuracy. Built-ins:

``synthetic``
    Non-IID federated classification of a Gaussian mixture (32 features, 10 classes); client
    label mixes are drawn from Dirichlet(``alpha``). An MLP whose hidden width is chosen so the
    model has about ``dim`` parameters (``d`` from 1e4 to 1e6 and beyond). Options: ``dim``
    (default 10000), ``alpha`` (0.5), ``samples_per_client`` (40), ``hidden`` (overrides ``dim``).
``digits``
    scikit-learn's bundled handwritten digits (8x8, 1797 images, offline), 20% held out for
    testing, the rest split non-IID across clients by a per-class Dirichlet(``alpha``) allocation;
    an MLP 64-256-256-10 (~8.5e4 parameters, ``hidden`` option to change the width).

Your own task: set ``task = "my_package.my_module:make_task"`` in the spec. The factory is called
as ``make_task(num_partitions=N, seed=data_seed, **task_options)`` and must return a
:class:`Task`. For classification with a ``torch.nn.Module`` the built-in ``train``/``evaluate``
helpers are used; a task may provide its own ``train_fn``/``evaluate_fn``. The model must be
deterministic given the seed (the server and every client build it) and should have no
non-parameter buffers whose values matter (they are flattened with the parameters).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from ..protocol.vectors import flatten, unflatten

__all__ = [
    "Task",
    "load_task",
    "model_vector",
    "set_model_vector",
    "train_classifier",
    "evaluate_classifier",
    "synthetic_task",
    "digits_task",
    "BUILTIN_TASKS",
]

Data = tuple[np.ndarray, np.ndarray]


def train_classifier(
    model: nn.Module,
    data: Data,
    *,
    epochs: int,
    learning_rate: float,
    batch_size: int,
    seed: int,
) -> float:
    """Local SGD on ``data`` (features float32, labels int64); return the mean training loss."""
    features, labels = data
    if len(labels) == 0:
        return float("nan")
    x = torch.as_tensor(features, dtype=torch.float32)
    y = torch.as_tensor(labels, dtype=torch.int64)
    generator = torch.Generator().manual_seed(int(seed) % (2**63))
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    total, count = 0.0, 0
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), batch_size):
            index = order[start : start + batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(x[index]), y[index])
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(index)
            count += len(index)
    return total / max(count, 1)


@torch.no_grad()
def evaluate_classifier(model: nn.Module, data: Data) -> dict[str, float]:
    """Accuracy and mean cross-entropy on ``data``."""
    features, labels = data
    model.eval()
    logits = model(torch.as_tensor(features, dtype=torch.float32))
    y = torch.as_tensor(labels, dtype=torch.int64)
    loss = float(nn.functional.cross_entropy(logits, y))
    accuracy = float((logits.argmax(dim=1) == y).float().mean())
    return {"accuracy": accuracy, "loss": loss}


@dataclass
class Task:
    """A federated task.

    Attributes
    ----------
    name : str
        Label shown in reports.
    build_model : callable
        ``() -> torch.nn.Module``, deterministic.
    partition : callable
        ``(partition_id) -> (features, labels)`` of one client.
    test_data : callable
        ``() -> (features, labels)`` held-out evaluation set.
    num_partitions : int
        Number of clients the data is split into.
    train_fn, evaluate_fn : callable
        Local training and evaluation (defaults: classification helpers above).
    """

    name: str
    build_model: Callable[[], nn.Module]
    partition: Callable[[int], Data]
    test_data: Callable[[], Data]
    num_partitions: int
    train_fn: Callable[..., float] = train_classifier
    evaluate_fn: Callable[[nn.Module, Data], dict[str, float]] = evaluate_classifier
    info: dict[str, Any] = field(default_factory=dict)

    def initial_vector(self) -> np.ndarray:
        """The initial model ``theta_0`` as a float32 vector."""
        return model_vector(self.build_model())

    def dim(self) -> int:
        return int(self.initial_vector().shape[0])


def model_vector(model: nn.Module) -> np.ndarray:
    """Flatten ``model.state_dict()`` (in order) into one float32 vector."""
    return flatten([t.detach().cpu().numpy() for t in model.state_dict().values()])


def set_model_vector(model: nn.Module, vector: np.ndarray) -> None:
    """Load a flat vector (as produced by :func:`model_vector`) into ``model`` in place."""
    state = model.state_dict()
    arrays = unflatten(
        np.asarray(vector, dtype=np.float32), [tuple(t.shape) for t in state.values()]
    )
    model.load_state_dict(
        {k: torch.as_tensor(a.copy()).to(t.dtype) for (k, t), a in zip(state.items(), arrays)}
    )


def _mlp(sizes: list[int], seed: int) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(seed)
        layers: list[nn.Module] = []
        for i in range(len(sizes) - 1):
            layers.append(nn.Linear(sizes[i], sizes[i + 1]))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)

    return build


def _check_positive(name: str, value: Any, *, integer: bool = True) -> None:
    if integer and (isinstance(value, bool) or int(value) != value):
        raise ValueError(f"task_options.{name} must be an integer, got {value!r}")
    if not value > 0:
        raise ValueError(f"task_options.{name} must be > 0, got {value!r}")


def synthetic_task(
    *,
    num_partitions: int,
    seed: int = 0,
    dim: int = 10_000,
    alpha: float = 0.5,
    samples_per_client: int = 40,
    hidden: int | None = None,
    features: int = 32,
    classes: int = 10,
    test_size: int = 2000,
) -> Task:
    """Synthetic non-IID Gaussian-mixture classification with a ~``dim``-parameter MLP."""
    for name, value in (
        ("dim", dim),
        ("samples_per_client", samples_per_client),
        ("features", features),
        ("test_size", test_size),
    ):
        _check_positive(name, value)
    _check_positive("alpha", alpha, integer=False)
    if classes < 2:
        raise ValueError(f"task_options.classes must be >= 2, got {classes}")
    if hidden is None:
        hidden = max(1, round((int(dim) - classes) / (features + 1 + classes)))
    _check_positive("hidden", hidden)
    hidden, features, classes = int(hidden), int(features), int(classes)
    means = np.random.default_rng([int(seed), 1]).standard_normal((classes, features)) * 1.2

    def sample(rng: np.random.Generator, labels: np.ndarray) -> Data:
        x = means[labels] + rng.standard_normal((labels.size, features))
        return x.astype(np.float32), labels.astype(np.int64)

    def partition(p: int) -> Data:
        if not 0 <= p < num_partitions:
            raise ValueError(f"partition_id must be in [0, {num_partitions}), got {p}")
        rng = np.random.default_rng([int(seed), 2, int(p)])
        mix = rng.dirichlet(np.full(classes, float(alpha)))
        return sample(rng, rng.choice(classes, size=int(samples_per_client), p=mix))

    def test_data() -> Data:
        rng = np.random.default_rng([int(seed), 3])
        return sample(rng, rng.integers(0, classes, size=int(test_size)))

    return Task(
        name="synthetic",
        build_model=_mlp([features, hidden, classes], seed),
        partition=partition,
        test_data=test_data,
        num_partitions=num_partitions,
        info={"hidden": hidden},
    )


def digits_task(
    *, num_partitions: int, seed: int = 0, alpha: float = 0.5, hidden: int = 256
) -> Task:
    """scikit-learn's handwritten digits, non-IID over ``num_partitions`` clients, MLP."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    _check_positive("alpha", alpha, integer=False)
    _check_positive("hidden", hidden)
    features, labels = load_digits(return_X_y=True)
    features = (features / 16.0).astype(np.float32)
    labels = labels.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        features, labels, test_size=0.2, random_state=int(seed) % (2**32), stratify=labels
    )
    rng = np.random.default_rng([int(seed), 4])
    owner = np.empty(len(y_train), dtype=np.int64)
    for c in range(10):
        index = rng.permutation(np.flatnonzero(y_train == c))
        share = rng.dirichlet(np.full(num_partitions, float(alpha)))
        cuts = (np.cumsum(share)[:-1] * index.size).astype(np.int64)
        for p, part in enumerate(np.split(index, cuts)):
            owner[part] = p

    def partition(p: int) -> Data:
        if not 0 <= p < num_partitions:
            raise ValueError(f"partition_id must be in [0, {num_partitions}), got {p}")
        mask = owner == p
        return x_train[mask], y_train[mask]

    return Task(
        name="digits",
        build_model=_mlp([64, int(hidden), int(hidden), 10], seed),
        partition=partition,
        test_data=lambda: (x_test, y_test),
        num_partitions=num_partitions,
    )


BUILTIN_TASKS: dict[str, Callable[..., Task]] = {"synthetic": synthetic_task, "digits": digits_task}


def load_task(
    name: str, *, num_partitions: int, seed: int = 0, options: dict[str, Any] | None = None
) -> Task:
    """Build a built-in task or call a ``module.path:factory`` hook.

    Raises
    ------
    ValueError
        Unknown task, bad ``task_options``, or a factory that does not return a :class:`Task`.
    """
    options = dict(options or {})
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    if name in BUILTIN_TASKS:
        factory = BUILTIN_TASKS[name]
    elif ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as error:
            raise ValueError(f"task {name!r} cannot be imported: {error}") from error
    else:
        raise ValueError(
            f"task must be one of {sorted(BUILTIN_TASKS)} or 'module.path:factory', got {name!r}"
        )
    try:
        task = factory(num_partitions=num_partitions, seed=seed, **options)
    except TypeError as error:
        raise ValueError(f"task_options do not fit task {name!r}: {error}") from error
    if not isinstance(task, Task):
        raise ValueError(
            f"task factory {name!r} must return flaudit.clients.tasks.Task, got {type(task).__name__}"
        )
    return task
