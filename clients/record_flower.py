"""Record canaries in a Flower + Opacus ClientApp (issue #37): the client's side of a record-level
audit, in the three lines docs/flower.md shows (Flower's ``examples/opacus``)::

    from flaudit.clients.record_flower import record_canaries, record_reply

    @app.train()
    @record_reply                                   # the DP parameters go back with the reply
    def train_message(msg: Message, context: Context) -> Message:
        ...
        model, optimizer, train_loader = privacy_engine.make_private(...)
        optimizer = record_canaries(optimizer, msg)  # the round's canaries, if the server sent any

The server's wrapper (:class:`flaudit.server.record_strategy.RecordAuditStrategy`) puts the
client's **canary plan** into the train message (:data:`PLAN_KEY`, an ArrayRecord with one array
``"plan"`` of shape ``(steps, d)``: row ``s`` the sum of the unit canary directions sampled at
DP-SGD step ``s``). The seed and the seen/unseen split never reach the client. A message without
a plan (a client's first round) trains with no canaries; its DP parameters still go back.

Training is never broken by the audit: :func:`record_canaries` goes through
:func:`flaudit.clients.record_audit.try_add_record_canaries` (no Opacus, an unsupported
optimizer or secure aggregation: the optimizer comes back untouched and the refusal sentence goes
back in the reply), and a plan that does not fit stops the canaries, never the step.

Apps that build their reply themselves can use :func:`record_metrics` (numbers, for the reply's
MetricRecord: ``**record_metrics(optimizer)``) and :func:`record_config` (strings, a ConfigRecord
under :data:`CONFIG_KEY`) instead of :func:`record_reply`.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from dataclasses import dataclass

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MetricRecord

from .record_audit import try_add_record_canaries

__all__ = [
    "CONFIG_KEY",
    "PLAN_KEY",
    "PREFIX",
    "PlanCanaries",
    "record_canaries",
    "record_config",
    "record_metrics",
    "record_reply",
    "uses_secure_aggregation",
]

#: The train message's record holding the client's canary plan (an ArrayRecord, array "plan").
PLAN_KEY = "flaudit.record_canaries"
#: The reply's ConfigRecord with the strings (optimizer class names, refusal).
CONFIG_KEY = "flaudit.record"
#: Prefix of every key flaudit adds to a reply's metrics.
PREFIX = "flaudit."


class PlanCanaries:
    """The round's canary plan as a :class:`~flaudit.clients.record_canaries.RecordCanarySource`:
    ``step_canary_sum(step, dim)`` is row ``step`` of ``plan``, zeros past its end."""

    def __init__(self, plan: np.ndarray) -> None:
        plan = np.asarray(plan)
        if plan.ndim != 2:
            raise ValueError(f"a canary plan has shape (steps, d), not {plan.shape}")
        self.plan = plan

    def __repr__(self) -> str:
        return f"PlanCanaries(steps={self.plan.shape[0]}, d={self.plan.shape[1]})"

    def step_canary_sum(self, step: int, dim: int) -> np.ndarray:
        if self.plan.shape[1] != dim:
            raise ValueError(
                f"the plan is for d = {self.plan.shape[1]}, the optimizer has d = {dim} "
                "trainable parameters"
            )
        if 0 <= step < self.plan.shape[0]:
            return self.plan[step]
        return np.zeros(dim, dtype=self.plan.dtype)


@dataclass
class _Round:
    """What :func:`record_reply` learns while the app trains (one per train message)."""

    secure_aggregation: bool = False
    optimizer: object = None
    refusal: str | None = None


_ROUND: contextvars.ContextVar[_Round | None] = contextvars.ContextVar(
    "flaudit_record_round", default=None
)


def uses_secure_aggregation(msg: Message, context: Context | None = None) -> bool:
    """Whether the message or the node's state carries Flower's SecAgg+ records
    (``secaggplus_mod`` keeps its state in ``context.state``)."""
    keys = list(msg.content.keys()) if msg.has_content() else []
    if context is not None:
        keys += list(context.state.keys())
    return any("secagg" in str(key).lower() for key in keys)


def _plan(msg: Message) -> np.ndarray | None:
    if not msg.has_content() or PLAN_KEY not in msg.content:
        return None
    return msg.content[PLAN_KEY]["plan"].numpy()


def _sample_rate(optimizer, data_loader) -> float | None:
    rate = getattr(data_loader, "sample_rate", None)
    if rate is None:  # Opacus's accountant hook holds the rate make_private accounted with
        hook = getattr(optimizer, "step_hook", None)
        if callable(hook):
            try:
                rate = inspect.getclosurevars(hook).nonlocals.get("sample_rate")
            except (TypeError, ValueError):
                rate = None
    return None if rate is None else float(rate)


def record_canaries(optimizer, msg: Message, data_loader=None):
    """The optimizer to train with this round: Opacus's ``optimizer`` (from
    ``PrivacyEngine.make_private``) adding the canaries of the plan in ``msg``, or the optimizer
    untouched with the refusal kept for the reply. Never raises.

    ``data_loader``: the DP data loader (its ``sample_rate``); default: the rate Opacus's
    accountant was given by ``make_private``."""
    state = _ROUND.get() or _Round()  # a throwaway one without record_reply
    try:
        plan = _plan(msg)
        # no plan (a client's first round): no canaries, the steps are still counted
        source = _NoCanaries() if plan is None else PlanCanaries(plan)
        rate = _sample_rate(optimizer, data_loader)
    except Exception as error:  # a malformed plan: train without canaries, say why
        refusal = (
            f"record-level audit refused: the canary plan could not be read "
            f"({type(error).__name__}: {error}); training goes on without record canaries"
        )
        return _keep(state, optimizer, refusal)
    secure = state.secure_aggregation or uses_secure_aggregation(msg)
    trained, refusal = try_add_record_canaries(
        optimizer, source, sample_rate=None, secure_aggregation=secure
    )
    if refusal is None:
        trained.record_sample_rate = rate
    return _keep(state, trained, refusal)


def _keep(state: _Round, optimizer, refusal: str | None):
    state.optimizer, state.refusal = optimizer, refusal
    try:  # for record_config(optimizer) in apps that build their reply themselves
        optimizer.record_refusal = refusal
    except AttributeError:
        pass
    return optimizer


class _NoCanaries:
    """A round without a plan: zeros at every step (the steps are still counted)."""

    def step_canary_sum(self, step: int, dim: int) -> np.ndarray:
        return np.zeros(dim)


def _dp_optimizer(optimizer):
    """Opacus's DPOptimizer inside ``optimizer`` (itself, or None)."""
    return optimizer if hasattr(optimizer, "original_optimizer") else None


def record_metrics(optimizer) -> dict[str, float | int]:
    """The DP parameters of this round for the reply's MetricRecord (keys prefixed
    ``flaudit.``): ``noise_multiplier``, ``max_grad_norm``, ``sample_rate``, ``steps`` (noised
    steps trained), ``lr``, ``momentum``, ``expected_batch_size``, ``dimension``. Only those that
    can be read (none for an optimizer that is not Opacus's); never raises."""
    out: dict[str, float | int] = {}
    try:
        dp = _dp_optimizer(optimizer)
        if dp is None:
            return out
        group = dp.original_optimizer.param_groups[0]
        values = {
            "noise_multiplier": dp.noise_multiplier,
            "max_grad_norm": dp.max_grad_norm,
            "lr": group.get("lr"),
            "momentum": group.get("momentum", 0.0),
            "expected_batch_size": dp.expected_batch_size,
            "sample_rate": getattr(dp, "record_sample_rate", None),
            "steps": getattr(dp, "canary_step", None),
            "dimension": sum(p.numel() for p in dp.params),
        }
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            kind = int if key in ("steps", "expected_batch_size", "dimension") else float
            out[PREFIX + key] = kind(value)
    except Exception:  # the reply goes back without them: the server says this client is not read
        return out
    return out


def _optimizer_name(optimizer) -> str:
    inner = getattr(optimizer, "original_optimizer", None)
    name = type(optimizer).__name__
    return name if inner is None else f"{name}({type(inner).__name__})"


def record_config(optimizer, refusal: str | None = None) -> ConfigRecord:
    """The strings of this round for the reply (a ConfigRecord under :data:`CONFIG_KEY`): the
    optimizer's class names and the refusal or the canaries' failure, if any."""
    record = ConfigRecord({PREFIX + "optimizer": _optimizer_name(optimizer)})
    refusal = refusal or getattr(optimizer, "record_refusal", None)
    source = getattr(optimizer, "record_canaries", None)
    failure = getattr(source, "error", None)
    if refusal or failure:
        record[PREFIX + "refusal"] = str(refusal or failure)
    return record


def record_reply(train_fn):
    """Decorate a ``@app.train()`` function: what :func:`record_canaries` did this round goes
    back in the reply (:func:`record_metrics` into its MetricRecord ``"metrics"``,
    :func:`record_config` under :data:`CONFIG_KEY`). The reply is returned as the app made it
    when anything about the audit fails."""

    @functools.wraps(train_fn)
    def train(msg: Message, context: Context) -> Message:
        state = _Round(secure_aggregation=uses_secure_aggregation(msg, context))
        token = _ROUND.set(state)
        try:
            reply = train_fn(msg, context)
        finally:
            _ROUND.reset(token)
        try:
            if reply.has_content():
                optimizer = state.optimizer
                if optimizer is None:
                    state.refusal = (
                        "record-level audit refused: record_canaries(optimizer, msg) was not "
                        "called in this train function (after PrivacyEngine.make_private)"
                    )
                    reply.content[CONFIG_KEY] = ConfigRecord({PREFIX + "refusal": state.refusal})
                    return reply
                metrics = record_metrics(optimizer)
                if "metrics" in reply.content:
                    for key, value in metrics.items():
                        reply.content["metrics"][key] = value
                else:
                    reply.content["metrics"] = MetricRecord(metrics)
                reply.content[CONFIG_KEY] = record_config(optimizer, state.refusal)
        except Exception:  # never break the reply
            pass
        return reply

    return train
