"""The service's Prometheus metrics (``GET /metrics``, docs/operations.md).

Each app has its own :class:`ServiceMetrics` and registry (tests build several apps in one
process). Two kinds of metric:

* What this instance did, counted as it happens: rounds ingested, their ingest and transform
  times, gaps recorded, canary-fetch budget overruns its runs reported, alarms fired. Several
  replicas each count their own share; ``sum`` over instances in PromQL.
* What the database holds, read at scrape time by :class:`StoreCollector`: audits by status and
  verdict (the same on every replica of one database), the database's health and this
  instance's workers.

No label carries an audit id, a seed or anything per canary: every label set is bounded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import select

from ..auditor.claims.alerts import first_alarm
from .tables import Audit
from .views import audit_verdict_view

__all__ = ["ServiceMetrics", "StoreCollector", "BUDGET_OVERRUN_MARK"]

log = logging.getLogger("flaudit.service.metrics")

#: How a ServerApp's ``canaries_missing`` reason says the canaries missed the round budget
#: (``flaudit.server.wrapper``: "the canaries did not arrive within the round budget ...").
BUDGET_OVERRUN_MARK = "round budget"

#: Seconds: a round's ingest is ~ms for small models and seconds for 10^8 parameters.
_INGEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

#: Audits whose verdict is read per scrape query (SQL ``IN`` lists stay short).
_CHUNK = 500


class StoreCollector(Collector):
    """Gauges read at scrape time: audits by status and verdict, database health, workers.

    ``state`` is the app's ``app.state`` (its ``store`` and ``runner`` exist once the app has
    started). A verdict is computed once per audit version (status, rounds, last update) and
    kept: a scrape reads one small row per audit and the full rows of those that changed.
    """

    def __init__(self, state: Any) -> None:
        self._state = state
        self._verdicts: dict[str, tuple[tuple, str]] = {}
        self._lock = threading.Lock()

    def describe(self) -> Iterable[Metric]:
        return []  # no collection at registration time (the store may not be open yet)

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        store = getattr(self._state, "store", None)
        audits = GaugeMetricFamily(
            "flaudit_audits",
            "Audits in the database by status and verdict.",
            labels=["status", "verdict"],
        )
        up = 0
        if store is not None:
            try:
                store.ping()
                for (status, verdict), count in sorted(self._audit_counts(store).items()):
                    audits.add_metric([status, verdict], count)
                up = 1
            except Exception as exc:  # the kind of failure only: no connection strings
                log.warning("metrics: database unreadable (%s)", type(exc).__name__)
        yield audits
        yield GaugeMetricFamily(
            "flaudit_database_up",
            "1 if the database answered this scrape's queries, else 0.",
            value=up,
        )
        runner = getattr(self._state, "runner", None)
        yield GaugeMetricFamily(
            "flaudit_runner_up",
            "1 if this instance's runner thread is alive, 0 if stopped or disabled.",
            value=1 if runner is not None and runner.alive else 0,
        )
        yield GaugeMetricFamily(
            "flaudit_workers_running",
            "Audit worker processes this instance runs now.",
            value=len(runner.active) if runner is not None else 0,
        )
        yield GaugeMetricFamily(
            "flaudit_scrape_duration_seconds",
            "Seconds this scrape spent reading the database.",
            value=time.perf_counter() - started,
        )

    def _audit_counts(self, store) -> dict[tuple[str, str], int]:
        with store.session() as s:
            rows = s.execute(
                select(
                    Audit.id, Audit.status, Audit.rounds_stored, Audit.has_final, Audit.updated_at
                )
            ).all()
        with self._lock:
            versions = {row[0]: tuple(row[1:]) for row in rows}
            stale = [
                i
                for i, v in versions.items()
                if i not in self._verdicts or self._verdicts[i][0] != v
            ]
            for start in range(0, len(stale), _CHUNK):
                with store.session() as s:
                    for audit in s.scalars(
                        select(Audit).where(Audit.id.in_(stale[start : start + _CHUNK]))
                    ):
                        self._verdicts[audit.id] = (versions[audit.id], _verdict(audit))
            for gone in set(self._verdicts) - set(versions):
                del self._verdicts[gone]
            counts: dict[tuple[str, str], int] = {}
            for version, verdict in self._verdicts.values():
                key = (str(version[0]), verdict)
                counts[key] = counts.get(key, 0) + 1
            return counts


def _verdict(audit: Audit) -> str:
    try:
        return str(audit_verdict_view(audit)["status"])
    except Exception as exc:  # an audit whose verdict cannot be computed still counts
        log.warning("metrics: no verdict for an audit (%s)", type(exc).__name__)
        return "unknown"


class ServiceMetrics:
    """The metrics of one app: counters and histograms of what this instance does, and the
    :class:`StoreCollector` of what the database holds, in a registry of their own."""

    def __init__(self, state: Any = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.rounds_ingested = Counter(
            "flaudit_rounds_ingested",
            "Rounds stored by this instance's ingest route.",
            registry=self.registry,
        )
        self.round_ingest_seconds = Histogram(
            "flaudit_round_ingest_seconds",
            "Seconds to ingest one round (transform, statistics, alarm, database write).",
            buckets=_INGEST_BUCKETS,
            registry=self.registry,
        )
        self.round_transform_seconds = Histogram(
            "flaudit_round_transform_seconds",
            "Seconds of one round's cosine transform (the canaries' cosines with the update).",
            buckets=_INGEST_BUCKETS,
            registry=self.registry,
        )
        self.gaps_recorded = Counter(
            "flaudit_gaps_recorded",
            "Rounds recorded as gaps: no_canaries (trained without them), not_reported.",
            labelnames=["kind"],
            registry=self.registry,
        )
        self.canary_budget_overruns = Counter(
            "flaudit_canary_budget_overruns",
            "Rounds whose ServerApp reported the canaries missed its round budget.",
            registry=self.registry,
        )
        self.alarms_fired = Counter(
            "flaudit_alarms_fired",
            "Audits whose error alarm (claim refuted) fired here.",
            registry=self.registry,
        )
        for kind in ("no_canaries", "not_reported"):
            self.gaps_recorded.labels(kind=kind)  # exported at 0 before the first gap
        if state is not None:
            self.registry.register(StoreCollector(state))
        #: Also told of the events counted here, as ``(event, audit_id, data)``: the app's
        #: webhooks (``service/webhooks.py``) hear of an alarm fired or a gap recorded at the
        #: same points the counters move. A listener must not block (it queues).
        self.listeners: list[Callable[[str, str, dict], None]] = []

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)

    def round_stored(
        self, result: str, seconds: float, gap: dict | None, audit_id: str | None = None
    ) -> None:
        """A round ingest answered ``result`` ("stored" or "duplicate") after ``seconds``;
        ``gap``: the gap it recorded (trained without canaries), if any."""
        if result != "stored":
            return
        self.rounds_ingested.inc()
        self.round_ingest_seconds.observe(seconds)
        if gap is not None:
            self.gap(
                str(gap.get("kind")),
                str(gap.get("reason") or ""),
                audit_id=audit_id,
                round=gap.get("round"),
            )

    def gap(
        self, kind: str, reason: str = "", *, audit_id: str | None = None, round: int | None = None
    ) -> None:
        self.gaps_recorded.labels(kind=kind).inc()
        if kind == "no_canaries" and BUDGET_OVERRUN_MARK in reason:  # the ServerApp's reason
            self.canary_budget_overruns.inc()
        self._tell("gap.recorded", audit_id, {"round": round, "kind": kind, "reason": reason})

    def alarm(self, before: list | None, after: list | None, audit_id: str | None = None) -> None:
        """An ingest moved an audit's alerts from ``before`` to ``after``: count the error
        alarm if it fired now."""
        record = first_alarm(after)
        if first_alarm(before) is None and record is not None:
            self.alarms_fired.inc()
            self._tell("alarm.fired", audit_id, {"round": record.get("round")})

    def _tell(self, event: str, audit_id: str | None, data: dict) -> None:
        if audit_id is None:
            return
        for listener in self.listeners:
            try:
                listener(event, audit_id, data)
            except Exception as exc:  # never fail the ingest that counted it
                log.warning("metrics: an event listener failed (%s)", type(exc).__name__)
