"""Talking to a SuperLink's Control API: a run's state, listing runs, stopping one.

:class:`SuperLinkControl` is what ``flwr ls --run-id`` and ``flwr stop`` do, without starting a
Python process per poll; :func:`parse_run_status` maps the SuperLink's status text to a
:class:`RunState`. :mod:`flaudit.server.deployment` (which starts runs with ``flwr run``) and the
service's watch over external runs use them.
"""

from __future__ import annotations

import logging
from enum import Enum
from pathlib import Path
from typing import Any

__all__ = [
    "DeploymentError",
    "RunState",
    "SuperLinkControl",
    "check_superlink_address",
    "parse_run_status",
]

log = logging.getLogger(__name__)


class RunState(str, Enum):
    """Where a Flower run is, as the SuperLink reports it (``flwr ls``'s status column)."""

    pending = "pending"
    starting = "starting"
    running = "running"
    completed = "completed"  # finished:completed
    failed = "failed"  # finished:failed
    stopped = "stopped"  # finished:stopped

    @property
    def finished(self) -> bool:
        return self in (RunState.completed, RunState.failed, RunState.stopped)


class DeploymentError(RuntimeError):
    """The SuperLink could not be reached, refused the run, or answered something unexpected."""


def parse_run_status(status: str) -> RunState:
    """Map a SuperLink status text (``"running"``, ``"finished:failed"``, ...) to a :class:`RunState`.

    Raises
    ------
    ValueError
        If ``status`` is not a status the SuperLink reports.
    """
    text = (status or "").strip().lower()
    if text.startswith("finished"):
        sub = text.partition(":")[2]
        try:
            state = RunState(sub)
        except ValueError:
            raise ValueError(f"status: unknown finished sub-status {status!r}") from None
        if not state.finished:
            raise ValueError(f"status: unknown finished sub-status {status!r}")
        return state
    try:
        state = RunState(text)
    except ValueError:
        raise ValueError(f"status: unknown run status {status!r}") from None
    if state.finished:  # "completed" without "finished:" is not something the SuperLink says
        raise ValueError(f"status: unknown run status {status!r}")
    return state


def check_superlink_address(address: str) -> None:
    """Raise :class:`ValueError` unless ``address`` is ``host:port`` (a SuperLink's Control API)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"address must be host:port, got {address!r}")


class SuperLinkControl:
    """A small client of the SuperLink's Control API: one run's status, and stopping it.

    This is what ``flwr ls --run-id`` and ``flwr stop`` do, without starting a Python process
    per poll. It uses Flower's own Control API client (``flwr.supercore.control``).

    Parameters
    ----------
    address : str
        ``host:port`` of the SuperLink's Control API.
    root_certificates : str, optional
        Path of a PEM CA bundle for TLS; without it the connection is plain HTTP.
    """

    def __init__(self, address: str, *, root_certificates: str | None = None):
        check_superlink_address(address)
        from flwr.supercore.control import ControlHttpClient
        from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor

        certificates = Path(root_certificates).read_bytes() if root_certificates else None
        self.address = address
        self._client = ControlHttpClient.from_server_address(
            server_address=address,
            insecure=certificates is None,
            root_certificates=certificates,
            interceptors=[RuntimeVersionHttpInterceptor(component_name="flwr CLI")],
        )

    def status(self, run_id: int) -> tuple[RunState, str]:
        """The run's state and the SuperLink's detail text (empty when it has none).

        Raises
        ------
        DeploymentError
            If the SuperLink cannot be reached or does not know the run.
        """
        from flwr.proto.control_pb2 import ListRunsRequest  # pylint: disable=E0611

        try:
            response = self._client.ListRuns(ListRunsRequest(run_id=int(run_id)))
        except Exception as exc:  # the client raises transport- and API-specific errors
            raise DeploymentError(
                f"cannot read the status of run {run_id} from SuperLink {self.address}: "
                f"{type(exc).__name__}"
            ) from None
        run = response.run_dict.get(int(run_id))
        if run is None:
            raise DeploymentError(f"SuperLink {self.address} does not know run {run_id}")
        return self._state_of(run)

    def runs(self) -> dict[int, tuple[RunState, str]]:
        """Every run the SuperLink knows: ``{run_id: (state, details)}`` (what ``flwr ls`` lists).

        Raises
        ------
        DeploymentError
            If the SuperLink cannot be reached.
        """
        from flwr.proto.control_pb2 import ListRunsRequest  # pylint: disable=E0611

        try:
            response = self._client.ListRuns(ListRunsRequest())
        except Exception as exc:
            raise DeploymentError(
                f"cannot list the runs of SuperLink {self.address}: {type(exc).__name__}"
            ) from None
        return {int(run_id): self._state_of(run) for run_id, run in response.run_dict.items()}

    @staticmethod
    def _state_of(run: Any) -> tuple[RunState, str]:
        status_text = run.status.status
        if run.status.sub_status:
            status_text = f"{status_text}:{run.status.sub_status}"
        details = run.status.details or ""
        return parse_run_status(status_text), ("" if details == "N/A" else details)

    def stop(self, run_id: int) -> bool:
        """Ask the SuperLink to stop the run; ``True`` if it accepted."""
        from flwr.proto.control_pb2 import StopRunRequest  # pylint: disable=E0611

        try:
            return bool(self._client.StopRun(StopRunRequest(run_id=int(run_id))).success)
        except Exception as exc:
            log.warning(
                "stopping run %s on SuperLink %s failed: %s",
                run_id,
                self.address,
                type(exc).__name__,
            )
            return False

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> SuperLinkControl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
