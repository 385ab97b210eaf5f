"""Replicas behind one URL (issue #41): which external audits this service instance holds.

Several replicas share one database behind a proxy that routes by audit id
(docs/deployment.md, "Replicas"). Everything an ingest needs is in the database and committed
before the request is acknowledged; what a replica keeps in memory per audit is a cache
(the canary tracker, rebuilt from the seed), a lock (across replicas the conditional
``UPDATE`` on ``rounds_stored`` orders the writers) and one live state:
``theta_t - theta_0`` for the final-model estimate "so far" (:class:`~.live.LiveAudits`), which
only the replica that saw every round has. So an external audit is held by one replica under
the owner lease of :mod:`.leases`:

* the replica that serves the run's requests takes the lease (:meth:`Ownership.serve`): the
  proxy sends an audit's requests to one replica, so the traffic says who should hold it; a
  request that lands elsewhere (the owner died, or the proxy's ring changed) is served from the
  database and moves the lease, naming the change on the audit (``owner_changes``);
* the runner renews the leases it holds every third of ``FLAUDIT_LEASE_SECONDS`` and drops an
  audit another replica took (:meth:`Ownership.lost`);
* an audit whose owner stopped renewing is taken over in the background within the lease plus
  a third of it (:meth:`~.leases.LeaseQueries.adopt_external`), even if its run is quiet.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .live import LiveAudits
from .store import Store

__all__ = ["Ownership"]

log = logging.getLogger("flaudit.service")


class Ownership:
    """The external audits whose lease this instance (``instance_id``) holds."""

    def __init__(
        self,
        store: Store,
        live: LiveAudits,
        *,
        instance_id: str,
        lease_seconds: float,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.live = live
        # called with the audit id when this instance lets an audit go (the app drops its cached
        # GET body: another replica writes it now, and this one must not serve its old view)
        self.on_lost = on_lost
        self.instance_id = instance_id
        self.lease_seconds = float(lease_seconds)
        self._held: set[str] = set()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Ownership(held={len(self._held)})"

    def held(self) -> list[str]:
        with self._lock:
            return sorted(self._held)

    def serve(self, audit) -> bool:
        """This instance serves a request of the run of ``audit`` (as read by the route): if it
        is a running external audit another replica (or none) holds, take its lease. True if it
        was taken now. Cheap when this instance holds it already (no query)."""
        if audit.status != "running" or audit.spec.get("engine") != "external":
            return False
        if audit.owner_id == self.instance_id:
            with self._lock:  # e.g. a restart with the same FLAUDIT_INSTANCE_ID
                self._held.add(audit.id)
            return False
        taken = self.store.take_over(audit.id, self.instance_id, lease_seconds=self.lease_seconds)
        if taken:
            self.add([audit.id])
            log.info("audit %s: this replica holds its lease now", audit.id)
        return taken

    def add(self, audit_ids: list[str]) -> None:
        with self._lock:
            self._held.update(audit_ids)

    def lost(self, audit_id: str) -> bool:
        """The audit ended or another replica took it: forget its live state here. False if
        this instance did not hold it."""
        with self._lock:
            if audit_id not in self._held:
                return False
            self._held.discard(audit_id)
        self.live.forget(audit_id)
        if self.on_lost is not None:
            self.on_lost(audit_id)
        return True
