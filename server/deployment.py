"""The Deployment Engine side of the audit runner: run an audit's ServerApp on a Flower SuperLink.

An audit with ``engine = "deployment"`` does not train in a worker process of the service. The
runner hands the audit to :func:`run_deployment_audit`, which

1. submits the project's Flower app (``pyproject.toml`` ``[tool.flwr.app]``) to the SuperLink at
   ``spec.superlink_address`` with ``flwr run``, passing the audit in the run config (keys below);
2. polls the run's status over the SuperLink's Control API until it finishes, times out, or the
   runner sets ``cancel_event``;
3. stops the run (Control API ``StopRun``, what ``flwr stop`` does) on cancel or timeout.

The ServerApp reads the run config, trains on the SuperNodes and reports every round to the
service's ingest routes with :class:`flaudit.server.http_reporter.HttpRoundReporter` -- the same path as the
embedded default. This module only starts, watches and stops the Flower run.

Run config keys (declared in ``[tool.flwr.app.config]``; see ``docs/architecture.md``)
-----------------------------------------------------------------------------------------
``flaudit-audit-id``   the audit's id in the service.
``flaudit-ingest-url`` base URL of the service as the ServerApp reaches it (``FLAUDIT_PUBLIC_URL``).
``flaudit-run-token``  bearer token for the ingest routes, issued to this run only.
``flaudit-num-seen-canaries``  how many of the audit's canaries are seen (a count, decimal).
``flaudit-spec``       the :class:`flaudit.auditor.spec.AuditSpec` as JSON.

Secrets
-------
The canary seed never goes to the SuperLink (issue #29): the ServerApp fetches each round's
canary sum from the service (``GET .../rounds/{t}/canary-sum``), which derives the round's
participants too; the run config says how many canaries are seen, not which. The run token
travels in a TOML file readable only by this process's user (never on a command line); every
message this module raises or logs has it (and the seed) redacted. Whoever reads a run's config
on the SuperLink can send rounds to its audit: protect the Control API (TLS, Flower auth).

Connection settings (environment)
---------------------------------
``FLAUDIT_SUPERLINK_ROOT_CERTIFICATES``  PEM CA bundle to verify the SuperLink's TLS certificate;
    unset means the connection is plain HTTP (``insecure = true``), as on a private compose network.
``FLAUDIT_FLOWER_APP_DIR``  directory holding the Flower app's ``pyproject.toml`` (default: the
    source tree this module was loaded from).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..auditor.canaries import seen_mask
from ..auditor.spec import AuditSpec, Engine
from ..protocol.wire import (
    RUN_CONFIG_AUDIT_ID,
    RUN_CONFIG_INGEST_URL,
    RUN_CONFIG_NUM_SEEN_CANARIES,
    RUN_CONFIG_RUN_TOKEN,
    RUN_CONFIG_SPEC,
)
from .superlink import (
    DeploymentError,
    RunState,
    SuperLinkControl,
    check_superlink_address,
    parse_run_status,
)

if TYPE_CHECKING:  # pragma: no cover
    from ..auditor.spec import AuditSpec

__all__ = [
    "RUN_CONFIG_AUDIT_ID",
    "RUN_CONFIG_INGEST_URL",
    "RUN_CONFIG_NUM_SEEN_CANARIES",
    "RUN_CONFIG_RUN_TOKEN",
    "RUN_CONFIG_SPEC",
    "DeploymentError",
    "DeploymentResult",
    "RunState",
    "SuperLinkControl",
    "build_run_config",
    "check_superlink_address",
    "default_app_dir",
    "deployment_worker",
    "flower_config_toml",
    "parse_run_status",
    "run_deployment_audit",
    "start_flower_run",
]

log = logging.getLogger(__name__)


_CONNECTION_NAME = "flaudit"
_REDACTED = "[redacted]"


@dataclass(frozen=True)
class DeploymentResult:
    """How a deployment run ended.

    ``state`` is the SuperLink's final word (``completed``, ``failed`` or ``stopped``);
    ``cancelled`` and ``timed_out`` say whether flaudit asked for the stop.
    """

    run_id: int
    state: RunState
    details: str = ""
    elapsed_seconds: float = 0.0
    cancelled: bool = False
    timed_out: bool = False

    @property
    def succeeded(self) -> bool:
        return self.state == RunState.completed and not (self.cancelled or self.timed_out)


def build_run_config(
    spec: AuditSpec,
    *,
    audit_id: str,
    canary_seed: int,
    ingest_url: str,
    run_token: str,
) -> dict[str, str]:
    """The Flower run config that hands one audit to the ServerApp: no seed, only the number of
    seen canaries it determines (:func:`flaudit.auditor.canaries.seen_mask`). Every value is a
    string.

    Raises
    ------
    ValueError
        Naming the argument that is empty or out of range.
    """
    if not str(audit_id).strip():
        raise ValueError("audit_id must not be empty")
    if isinstance(canary_seed, bool) or not isinstance(canary_seed, int):
        raise ValueError("canary_seed must be an integer")
    if canary_seed < 0:
        raise ValueError("canary_seed must be non-negative")
    if not ingest_url.startswith(("http://", "https://")):
        raise ValueError("ingest_url must be an http:// or https:// URL")
    if not run_token:
        raise ValueError("run_token must not be empty")
    return {
        RUN_CONFIG_AUDIT_ID: str(audit_id),
        RUN_CONFIG_INGEST_URL: ingest_url.rstrip("/"),
        RUN_CONFIG_RUN_TOKEN: run_token,
        RUN_CONFIG_NUM_SEEN_CANARIES: str(int(seen_mask(canary_seed, spec.num_canaries).sum())),
        RUN_CONFIG_SPEC: spec.model_dump_json(),
    }


def _toml_string(value: str) -> str:
    """A TOML basic string. JSON's escapes (quote, backslash, control characters below U+0020)
    are valid TOML escapes; TOML also wants DEL escaped, and ``ensure_ascii=False`` keeps
    characters outside the BMP whole (JSON would write surrogate pairs, which TOML rejects)."""
    import json

    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _run_config_toml(config: dict[str, str]) -> str:
    return "".join(f"{_toml_string(k)} = {_toml_string(v)}\n" for k, v in config.items())


def flower_config_toml(*, address: str, root_certificates: str | None = None) -> str:
    """A Flower CLI configuration (``$FLWR_HOME/config.toml``) with one SuperLink connection.

    Parameters
    ----------
    address : str
        ``host:port`` of the SuperLink's Control API.
    root_certificates : str, optional
        Path of a PEM CA bundle; without it the connection is plain HTTP (``insecure = true``).

    Raises
    ------
    ValueError
        If ``address`` is not ``host:port``.
    """
    check_superlink_address(address)
    lines = [
        "[superlink]",
        f"default = {_toml_string(_CONNECTION_NAME)}",
        "",
        f"[superlink.{_CONNECTION_NAME}]",
        f"address = {_toml_string(address)}",
    ]
    if root_certificates:
        lines.append(f"root-certificates = {_toml_string(str(Path(root_certificates).resolve()))}")
    else:
        lines.append("insecure = true")
    return "\n".join(lines) + "\n"


def default_app_dir() -> Path:
    """Directory of the Flower app that ``flwr run`` submits (holds ``pyproject.toml``)."""
    configured = os.environ.get("FLAUDIT_FLOWER_APP_DIR")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[1]


def _flwr_executable() -> str:
    beside = Path(sys.executable).parent / "flwr"
    if beside.exists():
        return str(beside)
    found = shutil.which("flwr")
    if not found:
        raise DeploymentError("the `flwr` command (Flower CLI) is not installed")
    return found


class _Redactor:
    def __init__(self, secrets: list[str]):
        self._secrets = [s for s in secrets if s]

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, _REDACTED)
        return text


def _flower_env(flwr_home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["FLWR_HOME"] = str(flwr_home)
    env.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    env.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    # `flwr` lives beside the interpreter; make sure its helpers are found too.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def start_flower_run(
    *,
    address: str,
    run_config: dict[str, str],
    app_dir: str | os.PathLike[str] | None = None,
    root_certificates: str | None = None,
    timeout: float = 120.0,
) -> int:
    """Submit the Flower app to the SuperLink with ``flwr run`` and return the run id.

    The run config goes to ``flwr run`` as a TOML file (mode 0600) in a private temporary
    ``FLWR_HOME`` that is deleted afterwards. Messages are redacted of the seed and token.

    Raises
    ------
    ValueError
        If ``app_dir`` has no ``pyproject.toml`` or ``timeout`` is not positive.
    DeploymentError
        If ``flwr run`` fails or does not say which run it started.
    """
    import json

    if timeout <= 0:
        raise ValueError("timeout must be positive")
    app = Path(app_dir) if app_dir is not None else default_app_dir()
    if not (app / "pyproject.toml").is_file():
        raise ValueError(f"app_dir: {app} has no pyproject.toml")
    redact = _Redactor([run_config.get(RUN_CONFIG_RUN_TOKEN, "")])
    with tempfile.TemporaryDirectory(prefix="flaudit-flwr-") as tmp:
        home = Path(tmp)
        (home / "config.toml").write_text(
            flower_config_toml(address=address, root_certificates=root_certificates),
            encoding="utf-8",
        )
        config_path = home / "run-config.toml"
        fd = os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(_run_config_toml(run_config))
        command = [
            _flwr_executable(),
            "run",
            str(app),
            _CONNECTION_NAME,
            "--run-config",
            str(config_path),
            "--format",
            "json",
        ]
        try:
            proc = subprocess.run(
                command,
                env=_flower_env(home),
                cwd=str(app),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                # Own session: a SIGTERM to the worker's process group (cancel) must not kill
                # `flwr run` between StartRun and printing the run id, or the run could not be
                # stopped; the worker learns the id and then stops the run itself.
                start_new_session=True,
            )
        except subprocess.TimeoutExpired:
            raise DeploymentError(
                f"`flwr run` did not answer within {timeout:g} s (SuperLink {address})"
            ) from None
    payload: dict[str, Any] = {}
    if "{" in proc.stdout:  # `--format json` prints one JSON object (after any banner lines)
        try:
            payload = json.loads(proc.stdout[proc.stdout.index("{") :])
        except ValueError:
            payload = {}
    if proc.returncode != 0 or not payload.get("success") or not payload.get("run-id"):
        reason = payload.get("error-message") or proc.stderr.strip() or proc.stdout.strip()
        reason = redact(str(reason))[-2000:]
        raise DeploymentError(
            f"`flwr run` against SuperLink {address} failed (exit {proc.returncode}): {reason}"
        )
    return int(payload["run-id"])


def run_deployment_audit(
    spec: AuditSpec,
    *,
    audit_id: str,
    canary_seed: int,
    ingest_url: str,
    run_token: str,
    timeout: float | None = None,
    cancel_event: threading.Event | _SignalFlag | None = None,
    app_dir: str | os.PathLike[str] | None = None,
    root_certificates: str | None = None,
    poll_interval: float = 1.0,
    stop_grace: float = 30.0,
    unreachable_grace: float = 60.0,
    on_started: Callable[[int], None] | None = None,
    control_factory: Callable[..., SuperLinkControl] | None = None,
    flower_run_id: int | None = None,
) -> DeploymentResult:
    """Run one audit's ServerApp on the SuperLink named in ``spec`` and wait until it ends.

    With ``flower_run_id``, nothing is submitted: the run already trains on the SuperLink (it
    was started by a service instance that has since stopped) and this watches it as if it had
    just started it: status polls, cancel, timeout.

    Parameters
    ----------
    spec : AuditSpec
        The audit; ``spec.engine`` must be ``deployment`` and ``spec.superlink_address`` set.
    audit_id, canary_seed, ingest_url, run_token
        Handed to the ServerApp in the run config (see the module docstring); of the seed only
        the number of seen canaries it determines.
    timeout : float, optional
        Seconds to wait for the run (default ``spec.timeout_seconds``); then the run is stopped.
    cancel_event : threading.Event, optional
        Set it to stop the run (``flwr stop``); the result then has ``cancelled=True``.
    app_dir : path, optional
        The Flower app to submit (default :func:`default_app_dir`).
    root_certificates : str, optional
        PEM CA bundle for a TLS SuperLink (default ``$FLAUDIT_SUPERLINK_ROOT_CERTIFICATES``).
    poll_interval : float
        Seconds between status polls.
    stop_grace : float
        After a stop request, seconds to wait for the SuperLink to mark the run finished.
    unreachable_grace : float
        How long the SuperLink may be unreachable (e.g. restarting) before this gives up.
    on_started : callable, optional
        Called with the Flower run id once the SuperLink accepted the run.
    control_factory : callable, optional
        Builds the Control API client (tests); default :class:`SuperLinkControl`.
    flower_run_id : int, optional
        Watch this run instead of starting one (``canary_seed``, ``ingest_url`` and
        ``run_token`` are then unused: the run has them).

    Returns
    -------
    DeploymentResult
        The run id and how the run ended. A failed run is a result, not an exception.

    Raises
    ------
    ValueError
        Naming the bad argument (wrong engine, no address, non-positive timeout or interval).
    DeploymentError
        If the run could not be started, or its status could not be read for longer than
        ``unreachable_grace``.
    """

    if spec.engine != Engine.deployment:
        raise ValueError("spec: engine must be 'deployment' to run on a SuperLink")
    if not spec.superlink_address:
        raise ValueError("spec: superlink_address is required for engine 'deployment'")
    if poll_interval <= 0:
        raise ValueError("poll_interval must be positive")
    budget = float(spec.timeout_seconds if timeout is None else timeout)
    if budget <= 0:
        raise ValueError("timeout must be positive")
    if root_certificates is None:
        root_certificates = os.environ.get("FLAUDIT_SUPERLINK_ROOT_CERTIFICATES") or None
    address = spec.superlink_address
    started = time.monotonic()
    if flower_run_id is None:
        run_config = build_run_config(
            spec,
            audit_id=audit_id,
            canary_seed=canary_seed,
            ingest_url=ingest_url,
            run_token=run_token,
        )
        run_id = start_flower_run(
            address=address,
            run_config=run_config,
            app_dir=app_dir,
            root_certificates=root_certificates,
            timeout=min(budget, 300.0),
        )
        log.info("audit %s: Flower run %s started on SuperLink %s", audit_id, run_id, address)
        if on_started is not None:
            on_started(run_id)
    else:
        run_id = int(flower_run_id)
        log.info(
            "audit %s: watching Flower run %s on SuperLink %s again", audit_id, run_id, address
        )
    factory = control_factory or SuperLinkControl
    control = factory(address, root_certificates=root_certificates)
    cancelled = timed_out = False
    try:
        unreachable_since: float | None = None
        state, details = RunState.pending, ""
        while True:
            try:
                state, details = control.status(run_id)
                unreachable_since = None
            except DeploymentError:
                # A SuperLink restart (compose: restart: unless-stopped, state in a volume) is
                # survivable; a SuperLink gone for longer than `unreachable_grace` is not.
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since > unreachable_grace:
                    raise
                log.warning("audit %s: SuperLink %s unreachable; retrying", audit_id, address)
            if state.finished:
                break
            if cancel_event is not None and cancel_event.is_set():
                cancelled = True
            elif time.monotonic() - started > budget:
                timed_out = True
            if cancelled or timed_out:
                log.info(
                    "audit %s: stopping Flower run %s (%s)",
                    audit_id,
                    run_id,
                    "cancelled" if cancelled else "timed out",
                )
                control.stop(run_id)
                state, details = _wait_until_finished(control, run_id, poll_interval, stop_grace)
                break
            if cancel_event is not None:
                cancel_event.wait(poll_interval)
            else:
                time.sleep(poll_interval)
    finally:
        control.close()
    elapsed = time.monotonic() - started
    log.info(
        "audit %s: Flower run %s ended %s after %.1f s", audit_id, run_id, state.value, elapsed
    )
    return DeploymentResult(
        run_id=run_id,
        state=state,
        details=details,
        elapsed_seconds=elapsed,
        cancelled=cancelled,
        timed_out=timed_out,
    )


def _wait_until_finished(
    control: SuperLinkControl, run_id: int, poll_interval: float, grace: float
) -> tuple[RunState, str]:
    """After a stop request: poll until the SuperLink marks the run finished (or give up)."""
    deadline = time.monotonic() + grace
    while True:
        try:
            state, details = control.status(run_id)
            last_word = f"SuperLink still reports {state.value}"
        except DeploymentError:
            state, details, last_word = RunState.running, "", "SuperLink unreachable"
        if state.finished:
            return state, details
        if time.monotonic() >= deadline:
            return RunState.stopped, f"stop requested; {last_word}"
        time.sleep(min(poll_interval, 0.5))


class _SignalFlag:
    """A cancel flag a signal handler may set: no locks (``threading.Event.set`` inside a
    handler can deadlock when the signal lands while the main thread holds the event's lock).
    ``wait`` sleeps in short steps, so a set flag is seen within 0.1 s."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self._set and time.monotonic() < deadline:
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        return self._set


def deployment_worker(payload: dict) -> None:
    """Runner worker target for ``engine = "deployment"`` (``Settings.deployment_target``).

    Runs in the runner's worker process (its own process group). ``payload`` carries
    ``audit_id``, ``spec`` (dict), ``seed`` (decimal string), ``token``, ``base_url`` and
    ``timeout``, as for the simulation worker, and ``notify`` (set by the runner's worker
    entry): the Flower run id is sent back once the SuperLink accepted the run. With
    ``flower_run_id`` in the payload the worker watches that run instead of starting one (the
    service took the audit back after a restart). SIGTERM -- what the runner sends on cancel or
    timeout -- asks the SuperLink to stop the Flower run before the worker exits, so no run
    keeps training for an audit the service has given up on; a service shutdown instead
    SIGKILLs the worker and leaves the run training (:meth:`Runner.stop`).

    Raises
    ------
    DeploymentError
        If the run could not be started, failed, or was stopped; the message names the Flower
        run and the SuperLink's reason, with the seed and token redacted.
    """
    import signal

    spec = AuditSpec.model_validate(payload["spec"])
    seed = int(payload["seed"])
    token = str(payload["token"])
    redact = _Redactor([str(seed), token])
    cancel = _SignalFlag()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: cancel.set())
    notify = payload.get("notify")
    watched = payload.get("flower_run_id")
    try:
        result = run_deployment_audit(
            spec,
            audit_id=str(payload["audit_id"]),
            canary_seed=seed,
            ingest_url=str(payload["base_url"]),
            run_token=token,
            timeout=float(payload.get("timeout") or spec.timeout_seconds),
            cancel_event=cancel,
            stop_grace=2.0,
            on_started=(lambda run_id: notify("flower_run", str(run_id))) if notify else None,
            flower_run_id=None if watched is None else int(watched),
        )
    except DeploymentError as exc:
        raise DeploymentError(redact(str(exc))) from None
    if result.succeeded:
        return
    if result.timed_out:
        why = f"timed out after {result.elapsed_seconds:.0f} s and was stopped"
    elif result.cancelled:
        why = "was stopped because the audit was cancelled"
    else:
        why = f"ended {result.state.value}"
    detail = f": {redact(result.details)}" if result.details else ""
    raise DeploymentError(
        f"Flower run {result.run_id} on SuperLink {spec.superlink_address} {why}{detail}"
    )
