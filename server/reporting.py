"""Round reporting: the one path of round data from the ServerApp to the auditor.

:class:`RoundReporter` is the interface (docs/architecture.md). Per round it carries the released
aggregate ``rho_bar_t`` (the noisy average DP-FedAvg releases, before the server optimizer; a
wrapper that sees only the new model sends the delta of the aggregated model) with its
:class:`RoundMetadata`, including the round's canary participants. :class:`HttpRoundReporter`
PUTs raw little-endian float32 (then int32 participant indices) to the service's ingest routes;
:class:`LocalRoundReporter` feeds an in-process :class:`flaudit.auditor.statistics.CosineTracker` and the
known-rounds statistic (``flaudit run`` and tests).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from flaudit.auditor.canaries import CanaryFamily, seen_mask
from flaudit.auditor.known_rounds import KnownRoundsStatistic
from flaudit.auditor.statistics import CosineTracker
from flaudit.auditor.validation import check_at_least

__all__ = [
    "RoundMetadata",
    "RoundReporter",
    "HttpRoundReporter",
    "LocalRoundReporter",
    "ReportingError",
    "participant_mask",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoundMetadata:
    """What the auditor gets with each round's released aggregate (no seed).

    ``participants`` are the canary indices "in" the round: the seen canaries inserted and the
    unseen canaries whose rounds (drawn by the same schedule, never inserted) include it, merged
    and sorted (:func:`flaudit.server.schedules.canary_participants`). The list does not reveal which
    canaries are seen, but it is secret data all the same: kept out of ``repr`` and of the query.
    """

    clip_norm: float
    cohort_size: int  # real clients that returned an update + canaries inserted
    num_canaries_inserted: int
    num_failures: int
    clipped_fraction: float
    noise_stddev: float
    train_loss: float | None = None
    accuracy: float | None = None
    participants: tuple[int, ...] | None = field(default=None, repr=False)

    def as_query(self) -> dict[str, float | int]:
        """Query parameters of the ingest route (``num_participants`` instead of the list)."""
        query = {k: v for k, v in asdict(self).items() if v is not None and k != "participants"}
        if self.participants is not None:
            query["num_participants"] = len(self.participants)
        return query


@runtime_checkable
class RoundReporter(Protocol):
    def report_initial(self, initial_model: np.ndarray) -> None: ...

    def report_round(self, server_round: int, update: np.ndarray, metadata: RoundMetadata) -> None: ...

    def report_final(self, final_model: np.ndarray, metrics: dict[str, float]) -> None: ...


def participant_mask(participants, num_canaries: int) -> np.ndarray:
    """Boolean mask of length ``num_canaries`` from a list of participant indices.

    Raises
    ------
    ValueError
        Naming ``participants`` for a negative, out-of-range or repeated index.
    """
    indices = np.asarray(participants, dtype=np.int64).reshape(-1)
    if indices.size:
        if indices.min() < 0:
            raise ValueError(f"participants: negative canary index {int(indices.min())}")
        if indices.max() >= num_canaries:
            raise ValueError(
                f"participants: canary index {int(indices.max())} out of range (k={num_canaries})"
            )
        if np.unique(indices).size != indices.size:
            raise ValueError("participants: a canary index is listed twice")
    mask = np.zeros(num_canaries, dtype=bool)
    mask[indices] = True
    return mask


class ReportingError(RuntimeError):
    """The auditor rejected or could not receive round data."""


def _body(vector: np.ndarray, participants: tuple[int, ...] | None = None) -> bytes:
    """``d`` little-endian float32 values, then (rounds) the participant indices as int32."""
    body = np.ascontiguousarray(vector, dtype="<f4").tobytes()
    if participants:
        body += np.asarray(participants, dtype="<i4").tobytes()
    return body


class HttpRoundReporter:
    """PUT round data to the auditor service's ingest routes.

    Parameters
    ----------
    base_url : str
        Service root, e.g. ``http://127.0.0.1:8000``.
    audit_id : str
        Audit id in the routes.
    run_token : str
        Bearer token issued to this run (never logged).
    max_retries : int
        Retries on connection errors and 5xx responses (exponential backoff).
    backoff : float
        First backoff in seconds (doubles each retry).
    timeout : float
        Per-request timeout in seconds.
    """

    def __init__(
        self,
        base_url: str,
        audit_id: str,
        run_token: str,
        *,
        max_retries: int = 5,
        backoff: float = 0.5,
        timeout: float = 60.0,
        client=None,
    ) -> None:
        import httpx

        check_at_least(max_retries, "max_retries", 0)
        check_at_least(backoff, "backoff", 0)
        self.base_url = base_url.rstrip("/")
        self.audit_id = str(audit_id)
        self.max_retries = int(max_retries)
        self.backoff = float(backoff)
        self._client = client or httpx.Client(timeout=timeout)
        self._headers = {
            "Authorization": f"Bearer {run_token}",
            "Content-Type": "application/octet-stream",
        }

    def __repr__(self) -> str:  # never show the token
        return f"HttpRoundReporter(base_url={self.base_url!r}, audit_id={self.audit_id!r})"

    def _request(self, method: str, path: str, **kwargs):
        """One call to ``/audits/{id}/{path}`` with retries on connection errors and 5xx."""
        import httpx

        url = f"{self.base_url}/audits/{self.audit_id}/{path}"
        headers = dict(self._headers, **kwargs.pop("headers", {}))
        for attempt in range(self.max_retries + 1):
            try:
                response = self._client.request(method, url, headers=headers, **kwargs)
            except httpx.TransportError as error:
                problem = f"{type(error).__name__}"
            else:
                if response.status_code < 400:
                    return response
                if response.status_code < 500:
                    raise ReportingError(
                        f"auditor rejected {method} {path}: HTTP {response.status_code} "
                        f"{response.text[:300]}"
                    )
                problem = f"HTTP {response.status_code}"
            if attempt == self.max_retries:
                raise ReportingError(
                    f"{method} {path} failed after {attempt + 1} attempts ({problem})"
                )
            wait = self.backoff * (2**attempt)
            logger.warning("%s %s failed (%s); retrying in %.1f s", method, path, problem, wait)
            time.sleep(wait)

    def _put(
        self, path: str, vector: np.ndarray, params: dict | None = None,
        participants: tuple[int, ...] | None = None,
    ) -> None:
        self._request("PUT", path, content=_body(vector, participants), params=params)

    def declare_claim(self, claim: dict) -> None:
        """Send the run's DP claim (``engine = "external"`` audits; idempotent)."""
        self._request(
            "PUT", "claim", json=claim, headers={"Content-Type": "application/json"}
        )

    def round_canaries(self, server_round: int) -> np.ndarray:
        """The unit canary vectors the service schedules for ``server_round``: float32 ``(c, d)``."""
        response = self._request(
            "GET", f"rounds/{int(server_round)}/canaries",
            headers={"Accept": "application/octet-stream"},
        )
        count = int(response.headers["X-Canary-Count"])
        dim = int(response.headers["X-Canary-Dim"])
        return np.frombuffer(response.content, dtype="<f4").reshape(count, dim)

    def round_canary_sum(self, server_round: int) -> tuple[np.ndarray, int]:
        """``(sum, c)``: the sum of the ``c`` unit canaries the service schedules for
        ``server_round``, float32 ``(d,)`` -- ``4 d`` bytes whatever ``c``."""
        response = self._request(
            "GET", f"rounds/{int(server_round)}/canary-sum",
            headers={"Accept": "application/octet-stream"},
        )
        count = int(response.headers["X-Canary-Count"])
        dim = int(response.headers["X-Canary-Dim"])
        return np.frombuffer(response.content, dtype="<f4").reshape(dim), count

    def report_initial(self, initial_model: np.ndarray) -> None:
        self._put("initial-model", initial_model)

    def report_round(self, server_round: int, update: np.ndarray, metadata: RoundMetadata) -> None:
        self._put(f"rounds/{int(server_round)}", update, metadata.as_query(), metadata.participants)

    def report_final(self, final_model: np.ndarray, metrics: dict[str, float]) -> None:
        params = {k: float(v) for k, v in metrics.items() if k in ("accuracy", "loss")}
        self._put("final-model", final_model, params)

    def close(self) -> None:
        self._client.close()


@dataclass
class LocalRoundReporter:
    """Feeds a :class:`CosineTracker` and the known-rounds statistic in this process.

    Parameters
    ----------
    tracker : CosineTracker
        Tracks every canary (seen and unseen) of the audit.
    null_mask : numpy.ndarray of bool, optional
        The unseen canaries. With it, rounds that carry participants also update
        :attr:`known_rounds` (:meth:`for_audit` sets it from the seed).
    """

    tracker: CosineTracker | None = None
    null_mask: np.ndarray | None = field(default=None, repr=False)
    known_rounds: KnownRoundsStatistic | None = field(default=None, repr=False)
    initial_model: np.ndarray | None = field(default=None, repr=False)
    final_model: np.ndarray | None = field(default=None, repr=False)
    rounds: list[tuple[int, RoundMetadata]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    _lazy: tuple[int, int, CanaryFamily | None] | None = field(default=None, repr=False)

    @classmethod
    def for_audit(
        cls,
        *,
        canary_seed: int,
        num_canaries: int,
        canary_family: CanaryFamily | str | None = None,
    ) -> "LocalRoundReporter":
        """A reporter whose tracker is created when ``theta_0`` (hence ``d``) arrives.

        ``canary_family`` is the spec's (``None``: the default rule of
        :func:`flaudit.auditor.canaries.resolve_canary_family`, as the ServerApp applies it).
        """
        check_at_least(num_canaries, "num_canaries", 1)
        family = None if canary_family is None else CanaryFamily(canary_family)
        return cls(tracker=None, null_mask=~seen_mask(canary_seed, int(num_canaries)),
                   _lazy=(canary_seed, int(num_canaries), family))

    def report_initial(self, initial_model: np.ndarray) -> None:
        self.initial_model = np.array(initial_model, dtype=np.float32)
        if self.tracker is None:
            if self._lazy is None:
                raise ValueError("tracker is required (or use LocalRoundReporter.for_audit)")
            seed, k, family = self._lazy
            self.tracker = CosineTracker(seed, k, int(self.initial_model.shape[0]), family=family)

    def report_round(self, server_round: int, update: np.ndarray, metadata: RoundMetadata) -> None:
        expected = len(self.rounds) + 1
        if server_round != expected:
            raise ValueError(f"server_round must be {expected}, got {server_round}")
        round_cosines = self.tracker.update(np.asarray(update, dtype=np.float32))
        if self.null_mask is not None and metadata.participants is not None:
            k = self.tracker.num_canaries
            if self.known_rounds is None:
                self.known_rounds = KnownRoundsStatistic(k)
            self.known_rounds.update(
                round_cosines, participant_mask(metadata.participants, k), self.null_mask
            )
        self.rounds.append((server_round, metadata))

    def report_final(self, final_model: np.ndarray, metrics: dict[str, float]) -> None:
        if self.initial_model is None:
            raise ValueError("report_initial must be called before report_final")
        self.final_model = np.array(final_model, dtype=np.float32)
        self.tracker.finalize(self.final_model, self.initial_model)
        self.metrics = dict(metrics)
