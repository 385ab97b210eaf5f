"""The service client of a ServerApp (:class:`HttpRoundReporter`): PUTs each round's released
aggregate as raw little-endian float32 (then int32 participant indices) to the service's ingest
routes, declares the claim, fetches each round's canary sum, heartbeats, and fails open
(``on_service_error="continue"``: a bounded buffer, stated gaps) or stops the run (``"stop"``).
Reports are delivered in order by one keeper thread; the round's waits are bounded by the
strategy wrapper's per-round budget (:mod:`.budget`)."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..auditor.validation import check_at_least
from ..protocol.wire import RUN_ID_HEADER
from .http_canaries import CanaryFetching
from .noise_calibration import log_alarm
from .reporting import ReportingError, RoundMetadata, ServiceUnreachable

__all__ = ["HttpRoundReporter", "ReportingError", "ON_SERVICE_ERROR"]

logger = logging.getLogger("flaudit.server.reporting")


ON_SERVICE_ERROR = ("continue", "stop")
_MiB = 1 << 20


def _body(vector: np.ndarray, participants: tuple[int, ...] | None = None) -> bytes:
    """``d`` little-endian float32 values, then (rounds) the participant indices as int32."""
    body = np.ascontiguousarray(vector, dtype="<f4").tobytes()
    if participants:
        body += np.asarray(participants, dtype="<i4").tobytes()
    return body


@dataclass
class _Item:
    """One request waiting in the outbox (sent in order when the service is back)."""

    method: str
    path: str  # "{t}" stands for the round as the service numbers it (resume offset)
    what: str
    kwargs: dict = field(default_factory=dict, repr=False)
    round: int | None = None  # the run's own round number (rounds and gaps)
    nbytes: int = 0  # round bodies count against the buffer
    on_done: Any = field(default=None, repr=False)


class HttpRoundReporter(CanaryFetching):
    """The service client of a ServerApp: PUTs round data to the ingest routes, fetches an
    external run's canaries, and keeps training going while the service is away.

    Fail open (``on_service_error="continue"``, the default): when the service cannot be
    reached (connection error or 5xx after a short retry), one warning is logged and nothing
    raises; rounds are kept in order in a bounded in-memory outbox (``buffer_bytes``; a round
    that does not fit is sent as a gap, ``PUT .../rounds/{t}/missing``) and sent by a background
    thread as soon as the service answers again; a round whose canaries could not be fetched is
    trained without them and reported with ``canaries_missing``. Canaries of the next
    ``canaries_ahead`` rounds are fetched ahead, so an outage shorter than that many rounds
    costs no canary. ``report_final`` waits up to ``drain_seconds`` for the outbox to empty,
    then logs what is lost. A refusal of the service (4xx, e.g. the audit ended) mid-run stops
    the auditing of this run with an error in the log; training goes on. A refused claim
    (before training) raises :class:`ReportingError`. ``on_service_error="stop"``: every
    request is retried ``max_retries`` times, then :class:`ReportingError` stops the run.

    While training is slow a heartbeat (``PUT .../heartbeat``) keeps an external audit alive as
    long as the run makes progress: it says what the run is doing (round, phase, seconds since
    the run last moved) and, once :meth:`watch_grid` was called, when the SuperLink last
    answered; the service ends the audit when the run shows no progress (docs/flower.md,
    "When an audit ends").

    Parameters
    ----------
    base_url : str
        Service root, e.g. ``http://127.0.0.1:8000``.
    audit_id : str
        Audit id in the routes.
    run_token : str
        Bearer token issued to this run (never logged).
    on_service_error : {"continue", "stop"}
        What an unreachable service does to training (above).
    run_id : str, optional
        This run's identity (header ``X-Flaudit-Run-Id``; default: random per reporter). The
        first run to declare its claim owns an external audit; any other run is refused.
    resume : bool
        Continue an external audit after this training's ServerApp crashed: take the audit over
        (same claim) and number rounds after the last stored one; theta_0 is not sent again.
    max_retries : int
        Retries on connection errors and 5xx (``"stop"``; ``"continue"`` retries at most 2
        times before buffering). Exponential backoff from ``backoff`` seconds.
    timeout : float
        Per-request timeout in seconds (connecting: at most 5 s).
    buffer_bytes : int
        Round bodies kept while the service is away (default 1 GiB).
    canaries_ahead : int
        Rounds of canaries fetched ahead of training (external audits).
    drain_seconds : float
        How long ``report_final`` waits for buffered data to be delivered.
    fetch_timeout : float
        Per-request timeout of a canary fetch (they are on the training path: at most the
        wrapper's round budget, ``flaudit.server.budget``).
    heartbeat_seconds : float, optional
        Quiet time before a heartbeat (default: a quarter of the service's silence limit,
        ``silence_limit_seconds``, 150 s unless ``timeout_seconds`` is shorter; between 1 and
        30 s).
    """

    def __init__(
        self,
        base_url: str,
        audit_id: str,
        run_token: str,
        *,
        on_service_error: str = "continue",
        run_id: str | None = None,
        resume: bool = False,
        max_retries: int = 5,
        backoff: float = 0.5,
        timeout: float = 60.0,
        buffer_bytes: int = 1 << 30,
        canaries_ahead: int = 2,
        drain_seconds: float = 60.0,
        heartbeat_seconds: float | None = None,
        retry_seconds: float = 5.0,
        fetch_timeout: float = 5.0,
        client=None,
    ) -> None:
        import uuid

        import httpx

        if on_service_error not in ON_SERVICE_ERROR:
            raise ValueError(
                f"on_service_error must be 'continue' or 'stop', got {on_service_error!r}"
            )
        check_at_least(max_retries, "max_retries", 0)
        check_at_least(backoff, "backoff", 0)
        check_at_least(buffer_bytes, "buffer_bytes", 0)
        check_at_least(canaries_ahead, "canaries_ahead", 0)
        check_at_least(drain_seconds, "drain_seconds", 0)
        check_at_least(retry_seconds, "retry_seconds", 0.01)
        check_at_least(fetch_timeout, "fetch_timeout", 0.01)
        if heartbeat_seconds is not None:
            check_at_least(heartbeat_seconds, "heartbeat_seconds", 0.01)
        self.base_url = base_url.rstrip("/")
        self.audit_id = str(audit_id)
        self.on_service_error = on_service_error
        self.run_id = str(run_id or uuid.uuid4().hex)
        self.resume = bool(resume)
        self.max_retries = int(max_retries)
        self.backoff = float(backoff)
        self.buffer_bytes = int(buffer_bytes)
        self.canaries_ahead = int(canaries_ahead)
        self.drain_seconds = float(drain_seconds)
        self.retry_seconds = float(retry_seconds)
        self.fetch_timeout = float(fetch_timeout)
        self._heartbeat_seconds = heartbeat_seconds
        self._client = client or httpx.Client(
            timeout=httpx.Timeout(timeout, connect=min(float(timeout), 5.0))
        )
        #: Set when the service asks to end training (spec ``stop_on_alarm``, alarm fired).
        self.stop_reason: str | None = None
        self._headers = {
            "Authorization": f"Bearer {run_token}",
            "Content-Type": "application/octet-stream",
            RUN_ID_HEADER: self.run_id,
        }
        self._cond = threading.Condition()
        self._outbox: deque[_Item] = deque()
        self._outbox_bytes = 0
        self._down_since: float | None = None
        self._delivered_late = 0  # buffered reports delivered since the outage began
        self._disabled: str | None = None  # the service refused this run: auditing stopped
        self._error: ReportingError | None = None  # "stop": raised at the next call
        self._canaries: dict[int, tuple[np.ndarray, int]] = {}  # fetched ahead: (sum, c)
        self._no_canaries: dict[int, str] = {}
        self._given_up: set[int] = set()  # rounds that trained without canaries already
        self._ahead_busy = False  # a thread fetches the next rounds' canaries
        self._num_rounds: int | None = None
        self._silence_limit: float | None = None
        self._round_offset = 0
        self._claimed = False
        self._finished = False  # the final model was delivered: no more heartbeats
        self._last_contact = time.monotonic()
        self._moved_at = time.monotonic()  # the run last moved: a round started or was reported
        self._moved: tuple[int, str] = (0, "starting")  # (round, phase)
        self._grid_answered_at: float | None = None  # None: no probe (watch_grid not called)
        self._round_timeout: float | None = None
        self._keeper: threading.Thread | None = None
        self._kicked = False
        self._failures = 0  # the keeper's failed tries (callers wait for the next one)
        self._closed = threading.Event()
        #: What this run could not give the audit: ``[{round, kind, reason}]`` (the service's
        #: ``gaps`` hold the same once it has heard of them).
        self.gaps: list[dict] = []

    def __repr__(self) -> str:  # never show the token
        return f"HttpRoundReporter(base_url={self.base_url!r}, audit_id={self.audit_id!r})"

    # -- one request --------------------------------------------------------------------
    @property
    def _fail_open(self) -> bool:
        return self.on_service_error == "continue"

    def _request(self, method: str, path: str, *, attempts: int | None = None, **kwargs):
        """One call to ``/audits/{id}/{path}``, retried on connection errors and 5xx.

        Raises :class:`ReportingError` on a 4xx, :class:`ServiceUnreachable` after ``attempts``.
        """
        import httpx

        attempts = self.max_retries + 1 if attempts is None else max(1, int(attempts))
        url = f"{self.base_url}/audits/{self.audit_id}/{path}"
        headers = dict(self._headers, **kwargs.pop("headers", {}))
        for attempt in range(attempts):
            try:
                response = self._client.request(method, url, headers=headers, **kwargs)
            except httpx.TransportError as error:
                problem = f"{type(error).__name__}"
            else:
                if response.status_code < 400:
                    self._last_contact = time.monotonic()
                    return response
                if response.status_code < 500:
                    raise ReportingError(
                        f"auditor rejected {method} {path}: HTTP {response.status_code} "
                        f"{response.text[:600]}"
                    )
                problem = f"HTTP {response.status_code}"
            if attempt + 1 == attempts:
                raise ServiceUnreachable(problem, attempts)
            wait = self.backoff * (2**attempt)
            logger.log(
                logging.DEBUG if self._fail_open else logging.WARNING,
                "%s %s failed (%s); retrying in %.1f s",
                method,
                path,
                problem,
                wait,
            )
            time.sleep(wait)

    def _stopped(self, method: str, path: str, error: ServiceUnreachable) -> ReportingError:
        return ReportingError(
            f"flaudit: the audit service at {self.base_url} is unreachable: {method} {path} "
            f"failed after {error.attempts} attempts ({error.problem}); training stops because "
            "on_service_error='stop' (the default, 'continue', trains on without the audit "
            "while the service is away and reports when it is back)"
        )

    def _send(self, item: _Item, *, attempts: int | None = None):
        path = item.path.format(t=(item.round or 0) + self._round_offset)
        response = self._request(item.method, path, attempts=attempts, **dict(item.kwargs))
        if item.on_done is not None:
            item.on_done(response)
        return response

    # -- fail-open state ----------------------------------------------------------------
    def _raise_pending(self) -> None:
        if self._error is not None:
            raise self._error

    def _went_down(self, problem: str) -> None:
        with self._cond:
            first = self._down_since is None
            if first:
                self._down_since = time.monotonic()
        if first:
            logger.warning(
                "flaudit: the audit service at %s is unreachable (%s); training goes on "
                "(on_service_error='continue'): rounds are kept (up to %d MiB) and sent when it "
                "is back, and rounds whose canaries cannot be fetched train without them",
                self.base_url,
                problem,
                self.buffer_bytes // _MiB,
            )

    def _came_back(self) -> None:
        with self._cond:
            since, self._down_since = self._down_since, None
            delivered, self._delivered_late = self._delivered_late, 0
        if since is not None:
            logger.warning(
                "flaudit: the audit service is back (unreachable for %.0f s from the first failed "
                "request); %d buffered report(s) delivered",
                time.monotonic() - since,
                delivered,
            )

    def _refused(self, error: ReportingError, what: str) -> None:
        """The service said no mid-run: stop auditing this run (``"continue"``) or remember the
        error for the next call (``"stop"``)."""
        if not self._fail_open:
            self._error = error
            return
        with self._cond:
            first = self._disabled is None
            self._disabled = str(error)
            lost = [item.round for item in self._outbox if item.round is not None]
            self._outbox.clear()
            self._outbox_bytes = 0
            self._cond.notify_all()
        if first:
            logger.error(
                "flaudit: the audit service refused %s, so this run is no longer audited "
                "(training goes on): %s",
                what,
                error,
            )
        for t in lost:
            self._gap(t, "not_reported", "the service refused this run's reports")

    def _gap(self, t: int, kind: str, reason: str) -> None:
        self.gaps.append({"round": int(t) + self._round_offset, "kind": kind, "reason": reason})

    def _ensure_keeper(self) -> None:
        with self._cond:
            if self._keeper is None and not self._closed.is_set():
                self._keeper = threading.Thread(
                    target=self._keep, name="flaudit-reporter", daemon=True
                )
                self._keeper.start()

    def _deliver(self, item: _Item) -> None:
        """Send now if the service is reachable and nothing waits before ``item``; else queue."""
        self._raise_pending()
        if self._disabled is not None:
            return
        if not self._fail_open:
            try:
                self._send(item)
            except ServiceUnreachable as error:
                raise self._stopped(item.method, item.path, error) from None
            return
        with self._cond:
            queued = bool(self._outbox) or self._down_since is not None
        if not queued:
            try:
                self._send(item, attempts=min(self.max_retries, 2) + 1)
                return
            except ServiceUnreachable as error:
                self._went_down(error.problem)
            except ReportingError as error:
                self._refused(error, item.what)
                return
        self._enqueue(item)

    def _enqueue(self, item: _Item) -> None:
        def full() -> bool:
            return bool(item.nbytes) and self._outbox_bytes + item.nbytes > self.buffer_bytes

        if full() and self._keeper is not None:  # the service may be back: room soon?
            self._kick_until(full, 2.0)
        with self._cond:
            if full():
                reason = (
                    f"not reported: the wrapper's buffer ({self.buffer_bytes // _MiB} MiB) "
                    "was full while the service was away"
                )
                logger.warning("flaudit: %s: %s", item.what, reason)
                self._gap(item.round, "not_reported", reason)
                item = _Item(
                    "PUT",
                    "rounds/{t}/missing",
                    f"the gap of {item.what}",
                    {"json": {"reason": reason}, "headers": {"Content-Type": "application/json"}},
                    round=item.round,
                )
            self._outbox.append(item)
            self._outbox_bytes += item.nbytes
            self._cond.notify_all()
        self._ensure_keeper()

    def _keep(self) -> None:
        """Background thread: send the outbox in order while the service answers; heartbeat
        while the run is quiet."""
        wait = min(0.5, self.retry_seconds)
        while not self._closed.is_set():
            with self._cond:
                item = self._outbox[0] if self._outbox else None
            if item is not None:
                try:
                    self._send(item, attempts=1)
                except ServiceUnreachable as error:
                    self._went_down(error.problem)
                    with self._cond:  # until the next try, or a caller kicks (_kick_until)
                        self._failures += 1
                        self._cond.notify_all()
                        if not self._kicked and not self._closed.is_set():
                            self._cond.wait(wait)
                        self._kicked = False
                    wait = min(wait * 2, self.retry_seconds)
                    continue
                except ReportingError as error:
                    self._refused(error, item.what)
                    continue
                wait = min(0.5, self.retry_seconds)
                with self._cond:  # (an RLock: _came_back takes it again)
                    if self._outbox and self._outbox[0] is item:
                        self._outbox.popleft()
                        self._outbox_bytes -= item.nbytes
                        self._delivered_late += 1
                    if not self._outbox:
                        self._came_back()  # logged before drain() returns
                    self._cond.notify_all()
                continue
            if self._finished or self._disabled is not None:
                return
            interval = self._heartbeat_interval()
            quiet = time.monotonic() - self._last_contact
            if interval is not None and self._disabled is None and quiet >= interval:
                try:
                    self._heartbeat_acknowledged(
                        self._request(
                            "PUT",
                            "heartbeat",
                            attempts=1,
                            json=self.heartbeat_body(),
                            headers={"Content-Type": "application/json"},
                        )
                    )
                    self._came_back()
                except ServiceUnreachable as error:
                    if self._fail_open:
                        self._went_down(error.problem)
                    self._last_contact = time.monotonic() - interval + wait  # retry soon
                except ReportingError as error:
                    self._refused(error, "the heartbeat")
                continue
            timeout = 1.0 if interval is None else max(0.05, min(1.0, interval - quiet))
            with self._cond:
                if not self._outbox:
                    self._cond.wait(timeout)

    def _heartbeat_acknowledged(self, response) -> None:
        """The service answers its silence limit: heartbeat by it."""
        try:
            limit = float(response.json()["silence_limit_seconds"])
        except (ValueError, KeyError, TypeError):
            return
        if limit > 0:
            self._silence_limit = limit

    def _heartbeat_interval(self) -> float | None:
        if not self._claimed or self._finished:
            return None
        if self._heartbeat_seconds is not None:
            return self._heartbeat_seconds
        limit = self._silence_limit or 3600.0
        return min(30.0, max(1.0, limit / 4))

    # -- progress, for the heartbeat ---------------------------------------------------------
    def moved(self, server_round: int, phase: str) -> None:
        """The run moved: round ``server_round`` started (``"training"``) or was reported."""
        self._moved = (int(server_round), str(phase))
        self._moved_at = time.monotonic()

    def heartbeat_body(self) -> dict[str, Any]:
        """What the run is doing, for the service's silence rule (service/silence.py)."""
        now = time.monotonic()
        body: dict[str, Any] = {
            "round": self._moved[0] + self._round_offset,
            "phase": self._moved[1],
            "progress_age_seconds": round(now - self._moved_at, 3),
        }
        if self._grid_answered_at is not None:
            body["grid_age_seconds"] = round(now - self._grid_answered_at, 3)
        if self._round_timeout is not None:
            body["round_timeout_seconds"] = self._round_timeout
        return body

    def watch_grid(self, probe, *, round_timeout: float | None = None, every: float = 10.0) -> None:
        """Ask the SuperLink something cheap (``probe()``, e.g. ``grid.get_node_ids``) every
        ``every`` seconds on a thread of its own, so heartbeats say when it last answered: a
        ServerApp whose SuperLink died keeps heartbeating, and the service then ends its audit.
        ``round_timeout``: how long a round may go without a move (the wrapper sends twice
        ``Strategy.start(timeout=...)``: training, then evaluation)."""
        if round_timeout is not None and float(round_timeout) > 0:
            self._round_timeout = float(round_timeout)
        if self._grid_answered_at is not None:
            return
        self._grid_answered_at = time.monotonic()

        def work() -> None:
            while not self._closed.wait(every) and not self._finished:
                try:
                    probe()
                except Exception as error:  # any failure of the grid: it did not answer
                    logger.debug("flaudit: the SuperLink did not answer (%s)", type(error).__name__)
                    continue
                self._grid_answered_at = time.monotonic()

        threading.Thread(target=work, name="flaudit-grid-probe", daemon=True).start()

    def pending(self) -> int:
        """Items waiting in the outbox (0 when everything handed over was delivered)."""
        with self._cond:
            return len(self._outbox)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` (default ``drain_seconds``) for the outbox to empty; True if
        it did. Otherwise log what is lost (the service will end the audit after its silence
        limit, with these rounds missing)."""
        deadline = time.monotonic() + (self.drain_seconds if timeout is None else timeout)
        with self._cond:
            while self._outbox and self._disabled is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.5))
            lost = list(self._outbox) if self._disabled is None else []
        if lost:
            rounds = [item.round for item in lost if item.round is not None]
            logger.warning(
                "flaudit: the audit service at %s is still unreachable; not reported: %s; the "
                "service will end the audit after its silence limit with these rounds missing",
                self.base_url,
                ", ".join(item.what for item in lost),
            )
            for t in rounds:
                self._gap(t, "not_reported", "the service was unreachable until the run ended")
            return False
        return True

    # -- the audit protocol ---------------------------------------------------------------
    def _claim_acknowledged(self, response) -> None:
        try:
            ack = response.json()
        except ValueError:
            ack = {}
        spec = ack.get("spec") or {}
        self.claim_ack = ack  # the canaries chosen and the design, for the ServerApp's log
        if self.resume:
            self._round_offset = int(ack.get("rounds_stored") or 0)
            logger.warning(
                "flaudit: resuming audit %s after its round %d", self.audit_id, self._round_offset
            )
        self._num_rounds = spec.get("num_rounds")
        self._silence_limit = spec.get("timeout_seconds")
        self._claimed = True

    def declare_claim(self, claim: dict) -> None:
        """Send the run's DP claim (``engine = "external"`` audits; idempotent for this run).

        Raises
        ------
        ReportingError
            The service refused the claim (another run owns the audit, an invalid claim, an
            ended audit), with its message; or it is unreachable and ``on_service_error`` is
            ``"stop"``. Unreachable with ``"continue"``: the claim waits in the outbox.
        """
        item = _Item(
            "PUT",
            "claim",
            "the claim",
            {
                "json": claim,
                "headers": {"Content-Type": "application/json"},
                "params": {"resume": "true"} if self.resume else None,
            },
            on_done=self._claim_acknowledged,
        )
        if not self._fail_open:
            try:
                self._send(item)
            except ServiceUnreachable as error:
                raise self._stopped("PUT", "claim", error) from None
        else:
            try:
                self._send(item, attempts=min(self.max_retries, 2) + 1)
            except ServiceUnreachable as error:
                self._went_down(error.problem)
                self._enqueue(item)
                self._claimed = True  # heartbeats start once it is delivered (silence limit)
        self._ensure_keeper()

    def _kick_until(self, blocked, seconds: float) -> bool:
        """Have the keeper try the outbox now; wait until ``blocked()`` is False, the keeper's
        next try failed, or ``seconds`` passed; whether ``blocked()`` cleared."""
        deadline = time.monotonic() + seconds
        with self._cond:
            self._kicked = True
            failures = self._failures
            self._cond.notify_all()
            while blocked() and self._disabled is None and self._failures == failures:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.05))
        return not blocked() and self._disabled is None

    def _final_delivered(self, _response) -> None:
        self._finished = True
        with self._cond:
            self._cond.notify_all()

    def report_initial(self, initial_model: np.ndarray) -> None:
        if self.resume:  # the audit holds theta_0 already; this run starts from a checkpoint
            return
        self._deliver(
            _Item("PUT", "initial-model", "the initial model", {"content": _body(initial_model)})
        )

    def report_round(self, server_round: int, update: np.ndarray, metadata: RoundMetadata) -> None:
        t = int(server_round)
        params = metadata.as_query()
        missing = self._no_canaries.pop(t, None)
        if missing is not None and metadata.num_canaries_inserted == 0:
            params["canaries_missing"] = missing[:300]
            logger.warning("flaudit: round %d trains without canaries: %s", t, missing)
        content = _body(update, metadata.participants)
        self.moved(t, "reported")
        self._deliver(
            _Item(
                "PUT",
                "rounds/{t}",
                f"round {t}",
                {"content": content, "params": params},
                round=t,
                nbytes=len(content),
                on_done=self._round_acknowledged,
            )
        )

    def _round_acknowledged(self, response) -> None:
        """Stop on alarm: the service answers ``"stop"`` once the claim is refuted."""
        try:
            ack = response.json()
        except ValueError:
            ack = {}
        log_alarm(self, ack)  # the alarm's line in the ServerApp log; stop_reason on "stop"

    def report_final(self, final_model: np.ndarray, metrics: dict[str, float]) -> None:
        """Send theta_T; with ``"continue"``, then wait up to ``drain_seconds`` for everything
        buffered to be delivered (:meth:`drain`)."""
        params = {k: float(v) for k, v in metrics.items() if k in ("accuracy", "loss")}
        self._deliver(
            _Item(
                "PUT",
                "final-model",
                "the final model",
                {"content": _body(final_model), "params": params},
                on_done=self._final_delivered,
            )
        )
        if self._fail_open and self._disabled is None:
            self.drain()

    def close(self) -> None:
        self._closed.set()
        with self._cond:
            self._cond.notify_all()
            keeper = self._keeper
        if keeper is not None:
            keeper.join(timeout=5)
        self._client.close()
