"""A Flower-app stand-in for record-level audits in the service (no Flower): FedAvg over clients
that each train the built-in engine's Opacus DP-SGD (``clients/record_training.py``) with the
canary plan the service gives them, reported through ``server/record_http.py``'s
:class:`RecordAuditClient` exactly as a ServerApp's strategy wrapper does."""

from __future__ import annotations

import numpy as np

from flaudit.auditor.bugs import InjectedBug
from flaudit.auditor.record_spec import RecordLevelSpec
from flaudit.clients.record_training import load_parameters, parameters_vector, train_dp_sgd
from flaudit.server.record_engine import record_shards
from flaudit.server.record_http import ClientDP, RecordAuditClient


class PlanCanaries:
    """A ``RecordCanarySource`` over a plan: row ``step``, zeros past its end."""

    def __init__(self, plan: np.ndarray) -> None:
        self.plan = plan

    def step_canary_sum(self, step: int, dim: int) -> np.ndarray:
        if step < self.plan.shape[0]:
            return self.plan[step]
        return np.zeros(dim, dtype=np.float32)


#: A small federation on the offline digits task (examples/record-level-audit.json's model and
#: batches: a canary's footprint stands out of the data gradients' at d = 3466 with batches of 16).
SPEC = {
    "level": "record",
    "task": "digits",
    "task_options": {"hidden": 32},
    "num_rounds": 3,
    "num_clients": 20,
    "num_canaries": 3400,
    "noise_multiplier": 1.0,
    "max_grad_norm": 1.0,
    "batch_size": 16,
    "local_epochs": 2,
    "learning_rate": 0.5,
    "momentum": 0.0,
}


def run_app(
    audit: RecordAuditClient,
    *,
    num_rounds: int = 3,
    noise: dict[int, float] | None = None,
    bug: str | None = None,
    rounds: range | None = None,
    start: tuple[np.ndarray, dict] | None = None,
) -> tuple[list[dict], np.ndarray, dict]:
    """Train ``rounds`` (default all) and report each; client ``i`` (node id ``"node-<i>"``)
    trains with noise ``noise[i]`` (default 1.0). ``start``: the model and the clients' last DP
    parameters to resume from. Returns the answers, the model and the DP parameters."""
    base = RecordLevelSpec.model_validate({**SPEC, "num_rounds": num_rounds})
    task, shards = record_shards(base)
    theta, last_dp = (parameters_vector(task.build_model()), {}) if start is None else start
    dim = theta.size
    answers = []
    injected = None if bug is None else InjectedBug.parse(bug)
    for server_round in rounds or range(1, num_rounds + 1):
        updates, dps = {}, {}
        for i, data in enumerate(shards):
            key = f"node-{i}"
            plan = audit.canary_plan(key, server_round, dp=last_dp.get(key), dimension=dim)
            model = task.build_model()
            load_parameters(model, theta)
            z = (noise or {}).get(i, base.noise_multiplier)
            result = train_dp_sgd(
                model,
                data,
                noise_multiplier=z,
                max_grad_norm=base.max_grad_norm,
                batch_size=base.batch_size,
                epochs=base.local_epochs,
                learning_rate=base.learning_rate,
                momentum=base.momentum,
                canaries=PlanCanaries(plan),
                seed=1000 * server_round + i,
                bug=injected,
            )
            updates[key] = (parameters_vector(model) - theta).astype(np.float32)
            dps[key] = ClientDP(
                noise_multiplier=z,
                max_grad_norm=base.max_grad_norm,
                sample_rate=result.sample_rate,
                steps=result.steps,
                lr=base.learning_rate,
                momentum=base.momentum,
                expected_batch_size=result.expected_batch_size,
                optimizer="DPOptimizer(SGD)",
            )
        answers.append(audit.report_round(server_round, updates, dps))
        theta = theta + np.mean([u.astype(np.float64) for u in updates.values()], axis=0)
        last_dp = dps
    return answers, theta, last_dp
