"""Run one audit in Flower's simulation engine (Ray backend).

The ServerApp runs in a thread of this process, so the secret canary seed and the reporter are
handed over in memory and never logged. Real clients are partitions mapped onto a few virtual
SuperNodes (``min(num_clients, max_supernodes)``); each message says which partition to train.

Flower 1.41 marks ``flwr.simulation.run_simulation`` deprecated in favour of ``flwr run``, which
starts a local SuperLink in simulation mode and runs the ServerApp in a ``flwr-simulation``
subprocess loaded from a Flower app bundle: the canary seed, the reporter, the progress callback
and the deadline could then no longer be handed over in memory. ``run_simulation`` is still
Flower's only in-process entry (ServerApp + ClientApp, Ray backend, ``num_supernodes``,
``backend_config``), so it stays, and only its deprecation record is dropped
(:class:`_DropRunSimulationDeprecation`); every other Flower warning is printed (docs/flower.md).

Ray has no authentication, so its GCS, raylet and workers listen on the loopback interface only
(``127.0.0.1``) unless the caller names another address (``ray_node_ip`` or
``FLAUDIT_RAY_NODE_IP``). On Linux Ray replaces a loopback ``_node_ip_address`` by the machine's
address (it assumes a cluster) and its gRPC servers then listen on all interfaces;
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (read when ``ray`` is first imported, i.e. inside
``run_simulation``) keeps the loopback address, and every server Ray starts binds to it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from ..auditor.spec import AuditSpec
from ..auditor.validation import check_at_least, check_positive
from ..clients.app import app as client_app
from ..clients.app import train
from .app import AuditRuntime, make_server_app, run_audit
from .reporting import RoundReporter

__all__ = [
    "run_simulation_audit",
    "run_inprocess_audit",
    "InProcessGrid",
    "DEFAULT_MAX_SUPERNODES",
    "LOOPBACK",
    "ray_init_args",
]

DEFAULT_MAX_SUPERNODES = 8
LOOPBACK = "127.0.0.1"


class _DropRunSimulationDeprecation(logging.Filter):
    """Drops the one ``flwr`` record saying ``run_simulation`` is deprecated; passes all others."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            str(record.msg).lstrip().startswith("DEPRECATED FEATURE:")
            and any("`run_simulation` function is deprecated" in str(a) for a in record.args or ())
        )


def _runtime(
    spec: AuditSpec,
    canary_seed: int,
    reporter: RoundReporter,
    timeout: float | None,
    progress: Callable[[int, int], None] | None,
    noise_seed: int | None,
    **options: Any,
) -> AuditRuntime:
    """The main loop's :class:`AuditRuntime` for an audit run in this process, its deadline
    ``timeout`` seconds from now (``None``: the spec's ``timeout_seconds``)."""
    if timeout is None:
        timeout = spec.timeout_seconds
    return AuditRuntime(
        spec=spec,
        canary_seed=canary_seed,
        reporter=reporter,
        deadline=time.monotonic() + timeout,
        progress=progress,
        noise_seed=noise_seed,
        **options,
    )


def run_simulation_audit(
    spec: AuditSpec,
    *,
    canary_seed: int,
    reporter: RoundReporter,
    timeout: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    max_supernodes: int = DEFAULT_MAX_SUPERNODES,
    num_cpus: int | None = None,
    round_timeout: float = 600.0,
    noise_seed: int | None = None,
    ray_node_ip: str | None = None,
) -> dict[str, Any]:
    """Run the audit described by ``spec`` in the simulation engine.

    Parameters
    ----------
    spec : AuditSpec
        The audit.
    canary_seed : int
        Secret master seed (in memory only).
    reporter : RoundReporter
        Receives theta_0, every Delta_t with metadata, and theta_T.
    timeout : float, optional
        Seconds for the whole audit (default ``spec.timeout_seconds``).
    progress : callable, optional
        ``progress(round, num_rounds)`` after each round.
    max_supernodes : int
        Upper bound on virtual SuperNodes (Ray actors are limited by ``num_cpus`` anyway).
    num_cpus : int, optional
        CPUs given to Ray (default: all); each ClientApp uses one.
    round_timeout : float
        Seconds to wait for the clients of one round; late clients are dropped and counted.
    noise_seed : int, optional
        Seed for the DP noise (reproducible benchmarks); default fresh entropy.
    ray_node_ip : str, optional
        Address Ray's servers listen on (default ``$FLAUDIT_RAY_NODE_IP`` or ``127.0.0.1``).
        Ray has no authentication: any other address lets whoever reaches it run code here.

    Returns
    -------
    dict
        Summary: rounds, dimension, failures, final metrics, seconds (no seed, no canaries).

    Raises
    ------
    TimeoutError
        If the audit does not finish within ``timeout``.
    ValueError
        Bad arguments (named) or a spec the task cannot satisfy.
    """
    from flwr.simulation import run_simulation

    if timeout is None:
        timeout = spec.timeout_seconds
    check_positive(timeout, "timeout")
    check_at_least(max_supernodes, "max_supernodes", 1)
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    num_supernodes = min(spec.num_clients, max_supernodes)
    runtime = _runtime(
        spec,
        canary_seed,
        reporter,
        timeout,
        progress,
        noise_seed,
        round_timeout=round_timeout,
        min_nodes=num_supernodes,
    )
    init_args = ray_init_args(ray_node_ip, num_cpus=num_cpus)
    backend_config = {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": init_args,
    }
    flwr_logger = logging.getLogger("flwr")
    previous_level = flwr_logger.level
    flwr_logger.setLevel(logging.WARNING)
    deprecation = _DropRunSimulationDeprecation()
    flwr_logger.addFilter(deprecation)
    try:
        run_simulation(
            server_app=make_server_app(runtime),
            client_app=client_app,
            num_supernodes=num_supernodes,
            backend_config=backend_config,
        )
    finally:
        flwr_logger.removeFilter(deprecation)
        flwr_logger.setLevel(previous_level)
    if not runtime.result:
        raise RuntimeError("the simulation ended before the audit finished")
    result = dict(runtime.result)
    result["num_supernodes"] = num_supernodes
    return result


def ray_init_args(node_ip: str | None = None, *, num_cpus: int | None = None) -> dict[str, Any]:
    """The ``ray.init`` arguments of a simulation run, listening on ``node_ip``.

    ``node_ip`` defaults to ``$FLAUDIT_RAY_NODE_IP`` or ``127.0.0.1``. For a loopback address this
    also sets ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` in this process's environment (inherited by
    Ray's processes), without which Ray swaps the loopback address for the machine's.
    """
    node_ip = node_ip or os.environ.get("FLAUDIT_RAY_NODE_IP") or LOOPBACK
    init_args: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "_node_ip_address": node_ip,
    }
    if node_ip in (LOOPBACK, "localhost"):
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    if num_cpus is not None:
        init_args["num_cpus"] = int(num_cpus)
    return init_args


class InProcessGrid:
    """A Grid stand-in that runs the ClientApp's ``train`` handler in this process, one message at
    a time. The same ServerApp main loop (:func:`flaudit.server.app.run_audit`) drives it; there is no
    Ray, no SuperNode and no isolation, so use it for benchmarks and tests only.

    Parameters
    ----------
    num_nodes : int
        Virtual node ids ``1 .. num_nodes``.
    """

    def __init__(self, num_nodes: int = 1) -> None:
        check_at_least(num_nodes, "num_nodes", 1)
        self._nodes = list(range(1, num_nodes + 1))

    def get_node_ids(self) -> list[int]:
        return list(self._nodes)

    def send_and_receive(self, messages, *, timeout: float | None = None):
        from flwr.app import Error, Message

        replies = []
        for msg in messages:
            try:
                replies.append(train(msg, None))
            except Exception as error:  # noqa: BLE001 - a failing client is dropped and counted
                replies.append(Message(Error(code=1, reason=type(error).__name__), reply_to=msg))
        return replies


def run_inprocess_audit(
    spec: AuditSpec,
    *,
    canary_seed: int,
    reporter: RoundReporter,
    timeout: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    noise_seed: int | None = None,
) -> dict[str, Any]:
    """Run the audit's ServerApp loop against :class:`InProcessGrid` (no Flower runtime).

    Same arguments and result as :func:`run_simulation_audit`; for benchmarks and tests.
    """
    from flwr.supercore.task_identity import TaskIdentity

    old = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    if old[1] is None:  # messages need a run identity; set a local one if none is active
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    try:
        runtime = _runtime(spec, canary_seed, reporter, timeout, progress, noise_seed)
        return dict(run_audit(InProcessGrid(), runtime))
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = old
