"""The server's side of a record-level audit of a Flower + Opacus app (issue #37): a wrapper
around the app's Message-API strategy that sends each client its canary plan and reports every
client's update before aggregation. The lines a ServerApp adds (docs/flower.md)::

    from flaudit.server.record_strategy import RecordAuditStrategy
    strategy = RecordAuditStrategy.from_env(strategy, run_config=context.run_config)

``from_env`` reads the audit from ``FLAUDIT_URL`` and ``FLAUDIT_AUDIT_ID`` (or the run-config
keys ``flaudit-ingest-url`` and ``flaudit-audit-id``; the environment wins) and the service's API
key from ``FLAUDIT_API_KEY``, or from the file named by ``FLAUDIT_API_KEY_FILE`` or the run-config
key ``flaudit-api-key-file`` (the key itself never in the run config: Flower stores it with the
run). With none of them set the app trains unaudited (a warning says so).

Every round ``t``, for each node the wrapped strategy sends a train message to, the wrapper asks
the service for that node's canary plan (:meth:`RecordAuditClient.canary_plan`, sized by the DP
parameters the node sent back in its previous reply; a node's first round has none) and adds it
to that node's message (:data:`flaudit.clients.record_flower.PLAN_KEY`). The node's reply brings
its DP parameters (``flaudit.*`` metrics, strings in a ConfigRecord); the wrapper takes them off
the reply, computes the node's update (arrays returned minus arrays sent, flattened in the
ArrayRecord's order: the model's parameter order for a plain ``nn.Module``), reports the round
(:meth:`RecordAuditClient.report_round`) and hands the wrapped strategy the replies exactly as the
app made them. After the last round it ends the audit (:attr:`verdict`).

Training is never broken by the audit: a service that fails stops the audit (:attr:`audit_error`,
logged) and the rounds go on; a node whose client refused (no Opacus, an unsupported optimizer,
secure aggregation: :mod:`flaudit.clients.record_audit`) is not sent plans, and its refusal is in
:attr:`refusals` and the log.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from ..clients.record_flower import CONFIG_KEY, PLAN_KEY, PREFIX
from .record_http import ClientDP, RecordAuditClient
from .strategies import refuse_legacy

__all__ = ["RecordAuditStrategy", "ENV_API_KEY", "ENV_API_KEY_FILE"]

ENV_URL = "FLAUDIT_URL"
ENV_AUDIT_ID = "FLAUDIT_AUDIT_ID"
ENV_API_KEY = "FLAUDIT_API_KEY"
ENV_API_KEY_FILE = "FLAUDIT_API_KEY_FILE"
RUN_CONFIG_URL = "flaudit-ingest-url"
RUN_CONFIG_AUDIT_ID = "flaudit-audit-id"
RUN_CONFIG_API_KEY_FILE = "flaudit-api-key-file"


def flat_arrays(arrays: ArrayRecord, order: list[str] | None = None) -> np.ndarray:
    """The arrays of ``arrays`` flattened into one float64 vector, in ``order`` (its own
    order by default)."""
    keys = list(arrays.keys()) if order is None else order
    if not keys:
        return np.zeros(0)
    return np.concatenate([np.asarray(arrays[k].numpy(), dtype=np.float64).ravel() for k in keys])


def _reply_arrays(content: RecordDict) -> ArrayRecord | None:
    records = list(content.array_records.values())
    return records[0] if len(records) == 1 else None


class RecordAuditStrategy(Strategy):
    """Wrap ``strategy`` (a Message-API strategy such as ``flwr.serverapp.strategy.FedAvg``):
    each node's train message gets its canary plan; each node's update is reported before the
    wrapped strategy aggregates.

    Parameters
    ----------
    strategy : flwr.serverapp.strategy.Strategy
        The app's strategy; its methods run unchanged on the messages and replies the app
        would have had.
    audit : RecordAuditClient
        The record-level audit in the service (anything with ``canary_plan``,
        ``report_round`` and ``end``).

    Raises
    ------
    TypeError
        ``strategy`` is a legacy ``flwr.server.strategy`` strategy.
    """

    def __init__(self, strategy: Strategy, *, audit: Any) -> None:
        refuse_legacy(strategy)
        self.strategy = strategy
        self.audit = audit
        #: node id (str) -> the DP parameters of its last reply (None: not readable)
        self.client_dp: dict[str, ClientDP | None] = {}
        #: node id (str) -> why its client's DP-SGD is not audited
        self.refusals: dict[str, str] = {}
        #: round -> node id -> steps of the plan it was sent
        self.planned: dict[int, dict[str, int]] = {}
        #: round -> the audit's status after that round's look
        self.looks: dict[int, dict] = {}
        #: the service's error that stopped the audit (training went on)
        self.audit_error: str | None = None
        #: the final verdict (``end()``), after ``start`` returned
        self.verdict: dict | None = None
        self._sent: np.ndarray | None = None
        self._order: list[str] = []

    @classmethod
    def from_env(
        cls, strategy: Strategy, *, run_config: Mapping[str, Any] | None = None
    ) -> Strategy:
        """Wrap ``strategy`` for the audit the environment or the run config names (see the
        module's docstring); ``strategy`` itself, with a warning, when none is named or the
        API key cannot be read (the app then trains unaudited).

        Raises
        ------
        ValueError
            The API key is in the run config (``flaudit-api-key``).
        """
        config = dict(run_config or {})
        if str(config.get("flaudit-api-key", "") or ""):
            raise ValueError(
                "run config 'flaudit-api-key': the API key must not be in the run config "
                "(Flower stores it with the run); set FLAUDIT_API_KEY where the ServerApp runs "
                "or name a file holding it with 'flaudit-api-key-file'"
            )
        url = os.environ.get(ENV_URL) or str(config.get(RUN_CONFIG_URL, "") or "")
        audit_id = os.environ.get(ENV_AUDIT_ID) or str(config.get(RUN_CONFIG_AUDIT_ID, "") or "")
        key = os.environ.get(ENV_API_KEY, "")
        key_file = os.environ.get(ENV_API_KEY_FILE) or str(
            config.get(RUN_CONFIG_API_KEY_FILE, "") or ""
        )
        problem = None
        if not url or not audit_id:
            problem = (
                f"{ENV_URL} / {ENV_AUDIT_ID} (or the run-config keys {RUN_CONFIG_URL!r}, "
                f"{RUN_CONFIG_AUDIT_ID!r}) are not set"
            )
        elif not key and key_file:
            try:
                with open(key_file, encoding="utf-8") as handle:
                    key = handle.readline().strip()
            except OSError as error:
                problem = f"the API key file cannot be read ({type(error).__name__})"
        if problem is None and not key:
            problem = (
                f"{ENV_API_KEY} (or {ENV_API_KEY_FILE}, {RUN_CONFIG_API_KEY_FILE!r}) is not set"
            )
        if problem is not None:
            log(WARNING, "flaudit record-level audit: %s; training without the audit", problem)
            return strategy
        return cls(strategy, audit=RecordAuditClient(url, audit_id, api_key=key))

    def __repr__(self) -> str:
        return f"RecordAuditStrategy({self.strategy!r})"

    def summary(self) -> None:
        log(INFO, "\t├──> Record-level audit: canary plans into each train message")
        self.strategy.summary()

    def _stop_audit(self, what: str, error: Exception) -> None:
        self.audit_error = f"{what}: {type(error).__name__}: {error}"
        log(
            WARNING,
            "flaudit record-level audit stopped (%s); training goes on",
            self.audit_error,
        )

    # -- train -------------------------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        self._order = list(arrays.keys())
        self._sent = flat_arrays(arrays, self._order)
        planned = self.planned.setdefault(server_round, {})
        out = []
        for message in messages:
            node = str(message.metadata.dst_node_id)
            plan = None
            dp = self.client_dp.get(node)
            if self.audit_error is None and dp is not None and node not in self.refusals:
                try:
                    plan = self.audit.canary_plan(
                        node, server_round, dp=dp, dimension=int(self._sent.size)
                    )
                except Exception as error:  # the audit stops, the round does not
                    self._stop_audit(f"canary plan of node {node}, round {server_round}", error)
            if plan is not None and plan.shape[0] > 0:
                content = RecordDict(dict(message.content.items()))  # its own copy
                content[PLAN_KEY] = ArrayRecord({"plan": Array(np.ascontiguousarray(plan))})
                message = Message(
                    content=content,
                    dst_node_id=message.metadata.dst_node_id,
                    message_type=message.metadata.message_type,
                    group_id=message.metadata.group_id,
                )
                planned[node] = int(plan.shape[0])
            out.append(message)
        return out

    def _read_reply(self, node: str, content: RecordDict) -> tuple[np.ndarray, ClientDP] | None:
        """Take flaudit's entries off ``content`` (the wrapped strategy never sees them) and
        return the node's update and DP parameters, or None (with the reason kept)."""
        config = content.get(CONFIG_KEY)
        strings = dict(config.items()) if isinstance(config, ConfigRecord) else {}
        if CONFIG_KEY in content:
            del content[CONFIG_KEY]
        numbers = {}
        for record in content.metric_records.values():
            for key in [k for k in record.keys() if k.startswith(PREFIX)]:
                numbers[key] = record[key]
                del record[key]
        refusal = strings.get(PREFIX + "refusal")
        if refusal:
            if self.refusals.get(node) != refusal:
                log(WARNING, "flaudit record-level audit, node %s: %s", node, refusal)
            self.refusals[node] = str(refusal)
            self.client_dp[node] = None
            return None
        if not numbers and not strings:
            self.refusals[node] = (
                "record-level audit refused: the reply has no flaudit DP parameters "
                "(the ClientApp lacks record_canaries / record_reply)"
            )
            self.client_dp[node] = None
            return None
        try:
            dp = ClientDP.from_metrics(numbers, strings)
        except (KeyError, TypeError, ValueError) as error:
            self.refusals[node] = f"record-level audit refused: {error}"
            self.client_dp[node] = None
            return None
        arrays = _reply_arrays(content)
        dimension = int(numbers.get(PREFIX + "dimension", -1))
        if arrays is None or set(arrays.keys()) != set(self._order):
            self.refusals[node] = (
                "record-level audit refused: the reply's arrays are not the model's"
            )
            self.client_dp[node] = None
            return None
        update = flat_arrays(arrays, self._order) - self._sent
        if update.size != dimension:
            self.refusals[node] = (
                f"record-level audit refused: the model has {update.size} values, the optimizer "
                f"{dimension} trainable parameters (buffers or frozen layers are not supported)"
            )
            self.client_dp[node] = None
            return None
        self.client_dp[node] = dp
        return update, dp

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        updates: dict[str, np.ndarray] = {}
        dps: dict[str, ClientDP] = {}
        for reply in replies:
            if reply.has_error() or not reply.has_content() or self._sent is None:
                continue
            node = str(reply.metadata.src_node_id)
            try:
                read = self._read_reply(node, reply.content)
            except Exception as error:  # never lose the round over the audit
                self.refusals[node] = f"record-level audit: the reply could not be read ({error})"
                read = None
            if read is not None:
                updates[node], dps[node] = read
        if updates and self.audit_error is None:
            try:
                look = self.audit.report_round(server_round, updates, dps)
                self.looks[server_round] = look
                log(INFO, "\t├──> flaudit record-level look, round %s: %s", server_round, look)
            except Exception as error:
                self._stop_audit(f"report of round {server_round}", error)
        return self.strategy.aggregate_train(server_round, replies)

    # -- evaluate: the wrapped strategy's ----------------------------------------------
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, **kwargs):
        """The wrapped strategy's rounds (Flower's ``Strategy.start``), then the audit's end:
        :attr:`verdict` (also logged)."""
        result = super().start(grid, initial_arrays, num_rounds=num_rounds, **kwargs)
        if self.audit_error is None:
            try:
                self.verdict = self.audit.end()
                log(INFO, "flaudit record-level verdict: %s", self.verdict)
            except Exception as error:
                self._stop_audit("end of the audit", error)
        return result

    def __getattr__(self, name: str) -> Any:  # the wrapped strategy's other attributes
        if name == "strategy":
            raise AttributeError(name)
        return getattr(self.strategy, name)
