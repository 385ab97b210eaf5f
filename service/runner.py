"""Audit runner: one worker process per audit, a concurrency limit, timeouts, cancellation.

Each audit runs in its own process started with multiprocessing's ``spawn`` method. The worker
makes itself the leader of a new process group (``os.setsid``) and tags its environment with
``FLAUDIT_AUDIT_WORKER=<audit id>``, which every process it starts (Flower, Ray's raylet, GCS and
workers) inherits. Cancelling or timing out kills the whole group and then any process still
carrying the tag, so no Ray process outlives its audit. A watcher thread in the worker kills the
group when the service process dies (e.g. ``kill -9``).

The worker reports rounds back to this service over HTTP (``flaudit.server.http_reporter.HttpRoundReporter``
-> ingest routes): one data path for the embedded default and the deployment engine alike.

Engines
-------
Each engine is a ``"module:function"`` the worker imports (``Settings.worker_target`` and
``Settings.deployment_target``; defaults in :mod:`flaudit.protocol.wire`): the service process
itself never imports Flower code.
``simulation`` (default): :func:`flaudit.server.engines.simulation_worker` runs
``flaudit.server.simulation.run_simulation_audit`` in the worker.
``deployment``: :func:`flaudit.server.engines.deployment_worker` runs the audit's ServerApp on
``spec.superlink_address`` via :mod:`flaudit.server.deployment` (``flwr run`` with the run config
of docs/architecture.md).
The worker sends the Flower run id back as soon as the SuperLink accepted the run; it is stored
(``flower_run_id``). That run trains on the SuperLink, not here: :meth:`Runner.stop` leaves it
training and releases the audit, and a starting runner adopts released or orphaned deployment
audits and watches their runs again (:meth:`Store.adopt_flower_runs`).
"""

from __future__ import annotations

import importlib
import logging
import os
import secrets
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..auditor.spec import AuditSpec, Engine
from .replicas import Ownership
from .settings import Settings
from .store import Store, as_utc, utcnow

__all__ = ["Runner", "kill_tagged_processes"]

log = logging.getLogger("flaudit.runner")

WORKER_TAG = "FLAUDIT_AUDIT_WORKER"
#: Workers (and the Flower/Ray processes they start) run at this lower CPU priority.
WORKER_NICENESS = 10


def scrub(text: str, secret: int) -> str:
    """Remove the secret seed (decimal and hex forms) from a message."""
    for form in (str(secret), hex(secret), format(secret, "x"), format(secret, "X")):
        if len(form) >= 6:
            text = text.replace(form, "<redacted>")
    return text


def kill_tagged_processes(audit_id: str, *, sig: int = signal.SIGKILL) -> int:
    """Send ``sig`` to every process whose environment has ``FLAUDIT_AUDIT_WORKER=<audit_id>``.

    Linux only (reads ``/proc``); returns the number of processes signalled.
    """
    marker = f"{WORKER_TAG}={audit_id}".encode()
    count = 0
    me = os.getpid()
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return 0
    for pid in pids:
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if marker in env:
            try:
                os.kill(pid, sig)
                count += 1
            except OSError:
                pass
    return count


def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            try:
                os.killpg(os.getpgid(0), signal.SIGKILL)
            finally:
                os._exit(1)


def _worker_entry(target: str, payload: dict, conn, parent_pid: int) -> None:
    """Body of the worker process (spawned)."""
    try:
        os.setsid()
    except OSError:
        pass
    os.environ[WORKER_TAG] = payload["audit_id"]
    try:  # training is batch work: the API process keeps answering pollers first
        os.nice(WORKER_NICENESS)
    except OSError:
        pass
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    seed = int(payload["seed"])
    # Progress messages to the runner before the final one (the deployment worker sends the
    # Flower run id: Runner._read_message).
    payload["notify"] = lambda kind, value: conn.send((str(kind), str(value)))
    try:
        module_name, _, func_name = target.partition(":")
        func = getattr(importlib.import_module(module_name), func_name)
        func(payload)
        conn.send(("ok", ""))
        code = 0
    except BaseException as exc:  # noqa: BLE001 - report every failure to the service
        message = scrub(f"{type(exc).__name__}: {exc}", seed)[:2000]
        try:  # a traceback helps debugging; the seed is scrubbed from it too
            import traceback

            sys.stderr.write(
                f"flaudit worker for audit {payload['audit_id']} failed:\n"
                + scrub(traceback.format_exc(), seed)
            )
        except Exception:
            pass
        try:
            conn.send(("error", message))
        except Exception:
            pass
        code = 1
    finally:
        conn.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@dataclass
class _Worker:
    audit_id: str
    process: Any
    conn: Any
    started: float
    timeout: float
    message: tuple[str, str] | None = None
    extra: dict = field(default_factory=dict)


class Runner:
    """Starts queued audits in worker processes and watches them.

    Parameters
    ----------
    store : Store
    settings : Settings
    on_change : callable, optional
        Called after the runner changes an audit (for read caches).
    ownership : Ownership, optional
        The external audits this instance holds (:mod:`.replicas`): their leases are renewed
        with the workers', and expired ones of other replicas taken over.
    """

    def __init__(
        self,
        store: Store,
        settings: Settings,
        *,
        on_change=None,
        ownership: Ownership | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.ownership = ownership
        self._on_change = on_change or (lambda audit_id: None)
        self._workers: dict[str, _Worker] = {}
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_heartbeat = 0.0
        self._next_silence_check = 0.0
        self._started_at = utcnow()  # a service outage is not a run's silence
        import multiprocessing

        self._ctx = multiprocessing.get_context("spawn")

    def __repr__(self) -> str:
        return f"Runner(workers={len(self._workers)})"

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="flaudit-runner", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop and every worker. A deployment audit whose Flower run the SuperLink
        accepted is released, not ended: its run trains on (the service going away must not
        stop the training it watches), its ServerApp keeps its reports until the service
        answers again, and the next instance to start watches the run again
        (:meth:`Store.adopt_flower_runs`). Every other audit still running ends failed with a
        reason."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            self._read_message(worker)
            if worker.extra.get("flower_run_id") is not None and self._detach(worker):
                continue
            self._kill(worker)
            audit = self.store.get_audit(worker.audit_id)
            rounds = audit.rounds_stored if audit else 0
            self.store.finish(
                worker.audit_id,
                status="failed",
                reason=f"service stopped during the run; {rounds} rounds were stored",
                only_if=("running",),
            )
            self._reaped(worker)

    def _detach(self, worker: _Worker) -> bool:
        """Stop watching a deployment audit without stopping its Flower run: SIGKILL (the
        worker turns only SIGTERM into ``flwr stop``), then release the lease."""
        pid = worker.process.pid
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                worker.process.kill()
        worker.process.join(timeout=5)
        kill_tagged_processes(worker.audit_id)
        released = self.store.release(worker.audit_id, owner=self.settings.instance_id)
        if released:
            log.info(
                "audit %s: service stopping; Flower run %s trains on and is watched again "
                "when the service starts",
                worker.audit_id,
                worker.extra["flower_run_id"],
            )
        self._reaped(worker, keep_run_token=released)
        return released

    def wake(self) -> None:
        self._wake.set()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def active(self) -> list[str]:
        with self._lock:
            return list(self._workers)

    # -- cancellation ---------------------------------------------------------------------
    def cancel(self, audit_id: str, *, reason: str = "cancelled by the user") -> bool:
        """Cancel a queued or running audit; kills its worker process group. False if ended."""
        changed = self.store.finish(
            audit_id, status="cancelled", reason=reason, only_if=("queued", "running")
        )
        with self._lock:
            worker = self._workers.get(audit_id)
        if worker is not None:
            self._kill(worker)
            self._reaped(worker)
        self._on_change(audit_id)
        self._wake.set()
        return changed

    # -- internals ------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._reap()
                self._enforce_timeouts()
                self._keep_leases()
                self._end_silent_runs()
                self._launch_queued()
            except Exception:  # keep the loop alive; log without secrets
                log.exception("runner loop error")
            self._wake.wait(self.settings.runner_poll_seconds)
            self._wake.clear()

    def _launch_queued(self) -> None:
        with self._lock:
            free = self.settings.max_concurrent_audits - len(self._workers)
        if free <= 0:
            return
        for audit_id in self.store.audit_ids_with_status("queued")[:free]:
            self._launch(audit_id)

    def _launch(self, audit_id: str, *, flower_run_id: str | None = None) -> None:
        """Start the worker of a queued audit; with ``flower_run_id``, of an adopted running
        deployment audit (the worker watches that run; its budget is what is left of the
        spec's ``timeout_seconds`` since the audit started)."""
        audit = self.store.get_audit(audit_id)
        if audit is None:
            return
        spec = AuditSpec.model_validate(audit.spec)
        timeout = float(spec.timeout_seconds)
        if flower_run_id is None:
            token = secrets.token_urlsafe(32)
            if not self.store.mark_running(
                audit_id, run_token=token, owner=self.settings.instance_id
            ):
                return
        else:  # the run has its token; the service keeps only its hash
            token = ""
            if audit.started_at is not None:
                elapsed = (utcnow() - as_utc(audit.started_at)).total_seconds()
                timeout = max(1.0, timeout - elapsed)
        target = (
            self.settings.deployment_target
            if spec.engine == Engine.deployment
            else self.settings.worker_target
        )
        payload = {
            "audit_id": audit_id,
            "spec": spec.model_dump(mode="json"),
            "seed": str(self.store.canary_seed(audit_id)),
            "token": token,
            "base_url": self.settings.public_url,
            "timeout": timeout,
        }
        if flower_run_id is not None:
            payload["flower_run_id"] = flower_run_id
        receiver, sender = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(
            target=_worker_entry,
            args=(target, payload, sender, os.getpid()),
            name=f"flaudit-audit-{audit_id}",
            daemon=False,
        )
        try:
            process.start()
        except Exception as exc:
            self.store.finish(
                audit_id,
                status="failed",
                reason=f"could not start the worker: {type(exc).__name__}",
                only_if=("running",),
            )
            return
        finally:
            sender.close()
            del payload
        log.info("audit %s started in worker pid %s", audit_id, process.pid)
        worker = _Worker(audit_id, process, receiver, time.monotonic(), timeout)
        if flower_run_id is not None:
            worker.extra["flower_run_id"] = flower_run_id
        with self._lock:
            self._workers[audit_id] = worker
        self._on_change(audit_id)

    def _keep_leases(self) -> None:
        """Every third of the lease: renew this instance's lease on its running audits, stop
        workers whose audit ended elsewhere (e.g. cancelled through another instance; not one
        that watches the Flower run of a succeeded audit to its end: :meth:`_finishing`), and
        fail running audits whose owner's lease expired (that instance died with its workers).
        The external audits this instance holds (:mod:`.replicas`) are renewed alike; one that
        ended or that another replica took is forgotten, and external audits whose owner
        stopped renewing are taken over."""
        now = time.monotonic()
        if now < self._next_heartbeat:
            return
        self._next_heartbeat = now + self.settings.lease_seconds / 3
        with self._lock:
            owned = list(self._workers)
        held = self.ownership.held() if self.ownership is not None else []
        for audit_id in self.store.heartbeat(self.settings.instance_id, owned + held):
            if audit_id in held and self.ownership.lost(audit_id):
                log.info("audit %s: ended, or another replica holds it now", audit_id)
            with self._lock:
                worker = self._workers.get(audit_id)
            if worker is None or self._finishing(worker):
                continue
            audit = self.store.get_audit(audit_id)
            if audit is not None and audit.status == "succeeded":
                # the normal end: the run's final model is stored; the worker may still be closing
                log.info("audit %s ended with its final model; stopping its worker", audit_id)
            else:
                status = audit.status if audit is not None else "deleted"
                log.info(
                    "audit %s ended outside this instance (%s); stopping its worker",
                    audit_id,
                    status,
                )
            self._kill(worker)
            self._reaped(worker)
        for audit_id in self.store.fail_interrupted(lease_seconds=self.settings.lease_seconds):
            log.warning(
                "audit %s failed: its service instance stopped renewing its lease", audit_id
            )
            self._on_change(audit_id)
        for audit_id, flower_run_id in self.store.adopt_flower_runs(
            self.settings.instance_id, lease_seconds=self.settings.lease_seconds
        ):
            log.warning(
                "audit %s: its service instance stopped during the run; watching its "
                "Flower run %s again",
                audit_id,
                flower_run_id,
            )
            self._launch(audit_id, flower_run_id=flower_run_id)
        if self.ownership is not None:
            taken = self.store.adopt_external(
                self.settings.instance_id, lease_seconds=self.settings.lease_seconds
            )
            self.ownership.add(taken)
            for audit_id in taken:
                log.warning(
                    "audit %s: its replica stopped renewing its lease; this replica holds it",
                    audit_id,
                )
                self._on_change(audit_id)

    def _finishing(self, worker: _Worker) -> bool:
        """Whether ``worker`` watches a Flower run whose audit has succeeded: the final model is
        in, and the run ends on its own (its ServerApp may still be closing). The worker is left
        to see the run finish; killing it would stop a run that is completing (SIGTERM is
        ``flwr stop``). It still ends at its own budget, as any deployment worker does."""
        if worker.extra.get("finishing"):
            return True
        self._read_message(worker)
        if worker.extra.get("flower_run_id") is None:
            return False
        audit = self.store.get_audit(worker.audit_id)
        if audit is None or audit.status != "succeeded":
            return False
        worker.extra["finishing"] = True
        log.info(
            "audit %s succeeded; its worker watches Flower run %s to its end",
            worker.audit_id,
            worker.extra["flower_run_id"],
        )
        return True

    def _end_silent_runs(self) -> None:
        """Every ``silence_check_seconds``: end external audits whose run has not been heard
        from for their silence limit, or whose run never started
        (:meth:`Store.end_silent_external`)."""
        now = time.monotonic()
        if now < self._next_silence_check:
            return
        self._next_silence_check = now + self.settings.silence_check_seconds
        for audit_id in self.store.end_silent_external(since=self._started_at):
            log.warning("audit %s failed: its run never started or stopped reporting", audit_id)
            self._on_change(audit_id)

    def _read_message(self, worker: _Worker) -> None:
        """Read what the worker sent: progress (``("flower_run", id)``: recorded at once, so a
        stopping service can leave that run training) and its final ``ok``/``error``."""
        try:
            while worker.message is None and worker.conn.poll():
                message = worker.conn.recv()
                if message[0] == "flower_run":
                    worker.extra["flower_run_id"] = message[1]
                    self.store.set_flower_run(worker.audit_id, message[1])
                else:
                    worker.message = message
        except (EOFError, OSError):
            pass

    def _reap(self) -> None:
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            self._read_message(worker)
            if worker.process.is_alive():
                continue
            worker.process.join(timeout=1)
            self._read_message(worker)
            audit = self.store.get_audit(worker.audit_id)
            if audit is not None and audit.status == "running":
                if worker.message and worker.message[0] == "error":
                    reason = f"the run failed: {worker.message[1]}"
                else:
                    reason = (
                        f"the worker exited (code {worker.process.exitcode}) before the final "
                        "model was reported"
                    )
                reason += f"; {audit.rounds_stored} rounds were stored"
                self.store.finish(
                    worker.audit_id, status="failed", reason=reason, only_if=("running",)
                )
            # Ray may leave processes behind even after a clean exit: sweep the tag.
            kill_tagged_processes(worker.audit_id)
            self._reaped(worker)
            log.info(
                "audit %s worker exited with code %s", worker.audit_id, worker.process.exitcode
            )

    def _enforce_timeouts(self) -> None:
        now = time.monotonic()
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            # the spec's timeout plus a margin for the engine's start-up
            if now - worker.started > worker.timeout + self.settings.timeout_grace_seconds:
                audit = self.store.get_audit(worker.audit_id)
                rounds = audit.rounds_stored if audit else 0
                self.store.finish(
                    worker.audit_id,
                    status="failed",
                    reason=(
                        f"timed out after {worker.timeout:g} s (timeout_seconds); "
                        f"{rounds} rounds were stored"
                    ),
                    only_if=("running",),
                )
                self._kill(worker)
                self._reaped(worker)

    def _kill(self, worker: _Worker) -> None:
        process = worker.process
        pid = process.pid
        if pid is not None and process.is_alive():
            try:
                os.killpg(pid, signal.SIGTERM)
            except OSError:
                process.terminate()
            process.join(timeout=self.settings.cancel_grace_seconds)
            if process.is_alive():
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    process.kill()
                process.join(timeout=5)
        if pid is not None:
            try:  # anything left in the group (Ray children)
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        kill_tagged_processes(worker.audit_id)

    def _reaped(self, worker: _Worker, *, keep_run_token: bool = False) -> None:
        """Forget an ended worker; its run token stops working unless ``keep_run_token`` (a
        released deployment audit: its run still reports)."""
        with self._lock:
            self._workers.pop(worker.audit_id, None)
        try:
            worker.conn.close()
        except OSError:
            pass
        if not keep_run_token:
            self.store.clear_run_token(worker.audit_id)
        self._on_change(worker.audit_id)
        self._wake.set()
