"""Flower ClientApp: honest local training on one partition of a built-in or user task.

The ServerApp sends, per sampled client, a ``train`` message with

* ``arrays``: an :class:`~flwr.app.ArrayRecord` holding the global model as one float32 vector;
* ``config``: ``partition-id``, ``num-partitions``, ``task``, ``task-options`` (JSON),
  ``data-seed``, ``server-round``, ``local-epochs``, ``learning-rate``, ``batch-size``.

It answers with ``arrays`` = the model delta (local model minus global model, float32 vector) and
``metrics`` = ``num-examples``, ``train-loss``. A node may be asked to train several partitions
(the simulation maps partitions onto fewer virtual SuperNodes). Canaries never reach a client.
"""

from __future__ import annotations

import json
from functools import lru_cache

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from .tasks import Task, load_task, model_vector, set_model_vector

__all__ = ["app", "local_update"]

app = ClientApp()


@lru_cache(maxsize=4)
def _task(name: str, options_json: str, num_partitions: int, seed: int) -> Task:
    return load_task(
        name, num_partitions=num_partitions, seed=seed, options=json.loads(options_json)
    )


def local_update(
    task: Task,
    global_model: np.ndarray,
    *,
    partition_id: int,
    epochs: int,
    learning_rate: float,
    batch_size: int,
    seed: int,
) -> tuple[np.ndarray, int, float]:
    """Train ``task``'s model from ``global_model`` on one partition.

    Returns
    -------
    (delta, num_examples, train_loss)
        ``delta`` is the float32 vector ``local - global``.
    """
    import torch

    torch.set_num_threads(1)
    model = task.build_model()
    set_model_vector(model, global_model)
    data = task.partition(partition_id)
    loss = task.train_fn(
        model, data, epochs=epochs, learning_rate=learning_rate, batch_size=batch_size, seed=seed
    )
    delta = model_vector(model) - np.asarray(global_model, dtype=np.float32)
    return delta, int(len(data[1])), float(loss)


@app.train()
def train(msg: Message, context: Context) -> Message:
    config = msg.content["config"]
    global_model = msg.content["arrays"].to_numpy_ndarrays()[0]
    task = _task(
        str(config["task"]),
        str(config["task-options"]),
        int(config["num-partitions"]),
        int(config["data-seed"]),
    )
    partition_id = int(config["partition-id"])
    seed = int(config["data-seed"]) * 1_000_003 + int(config["server-round"]) * 7919 + partition_id
    delta, num_examples, loss = local_update(
        task,
        global_model,
        partition_id=partition_id,
        epochs=int(config["local-epochs"]),
        learning_rate=float(config["learning-rate"]),
        batch_size=int(config["batch-size"]),
        seed=seed,
    )
    metrics = {"num-examples": num_examples, "partition-id": partition_id}
    if np.isfinite(loss):
        metrics["train-loss"] = loss
    content = RecordDict({"arrays": ArrayRecord([delta]), "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)
