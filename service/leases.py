"""Owner leases and what outlives a worker, as queries of the store (a mixin of
:class:`~.store.Store`): heartbeats, restart recovery (:meth:`LeaseQueries.fail_interrupted`),
deployment audits whose Flower run trains on while no instance watches (released by a stopping
instance, adopted by the next), and external audits whose run fell silent.

Running audits carry an owner lease: the id of the service instance whose runner started the
worker (``owner_id``) and that instance's last heartbeat (``owner_heartbeat_at``). Restart
recovery fails running audits whose lease expired, and at once those whose owner is provably
gone (a previous process of this very instance: :func:`owner_is_gone`), so several instances can
share one database. A deployment audit is the exception: its Flower run trains on the
SuperLink without us, so a stopping instance releases it (:meth:`LeaseQueries.release`) and the
next one takes it back (:meth:`LeaseQueries.adopt_flower_runs`) instead of failing it.

An external audit (the user's own Flower app) belongs to the run that declared its claim
(``run_id``); ``last_contact_at`` is the run's last sign of progress (claim, any ingest, a
heartbeat as of what it reports): :meth:`LeaseQueries.end_silent_external` ends it when there
has been none for its silence limit (:mod:`.silence`), or when it never starts; :meth:`LeaseQueries.end_refused` ends it
when its run sends data that cannot be audited.

Replicas (several instances behind one URL, :mod:`.replicas`): an external audit is held under
the same lease by the replica that serves its run's requests (:meth:`LeaseQueries.take_over`),
and one whose replica stopped renewing is taken over in the background
(:meth:`LeaseQueries.adopt_external`); each takeover is kept on the audit (``owner_changes``).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from sqlalchemy import or_, select, update

from .silence import silence_limit, start_limit
from .tables import Audit, as_utc, ended_values, not_reported, update_audit_if, utcnow

__all__ = ["LeaseQueries", "OWNER_CHANGES_KEPT", "owner_is_gone"]


class LeaseQueries:
    """The store's lease and recovery queries; :class:`~.store.Store` provides ``session()``
    and ``get_audit()``."""

    def heartbeat(self, owner: str, audit_ids: list[str]) -> list[str]:
        """Renew ``owner``'s lease on its running audits; return those no longer running."""
        if not audit_ids:
            return []
        now = utcnow()
        with self.session() as s, s.begin():
            s.execute(
                update(Audit)
                .where(Audit.id.in_(audit_ids), Audit.owner_id == owner, Audit.status == "running")
                .values(owner_heartbeat_at=now)
            )
            running = set(
                s.scalars(
                    select(Audit.id).where(
                        Audit.id.in_(audit_ids), Audit.owner_id == owner, Audit.status == "running"
                    )
                )
            )
        return [audit_id for audit_id in audit_ids if audit_id not in running]

    def fail_interrupted(
        self, *, lease_seconds: float = 0.0, instance_id: str | None = None
    ) -> list[str]:
        """Fail running audits whose owner is gone: no owner, no heartbeat for more than
        ``lease_seconds``, or (with ``instance_id``, at start-up) an owner that
        :func:`owner_is_gone` proves dead: a restart fails its interrupted audits at once, not
        after the lease. Their worker died with its service (a simulation cannot resume
        mid-run); the reason says how many rounds were stored. Audits of live instances, audits
        of runs flaudit does not start (``engine = "external"``), and deployment audits whose
        Flower run is known (it trains on the SuperLink without us:
        :meth:`adopt_flower_runs`) are left alone."""
        expired = utcnow() - timedelta(seconds=lease_seconds)
        failed = []
        with self.session() as s:
            gone = []
            if instance_id is not None:
                owners = s.execute(
                    select(Audit.id, Audit.owner_id).where(
                        Audit.status == "running", Audit.owner_id.is_not(None)
                    )
                ).all()
                gone = [row.id for row in owners if owner_is_gone(row.owner_id, instance_id)]
            orphans = list(
                s.scalars(
                    select(Audit.id).where(
                        Audit.status == "running",
                        or_(
                            Audit.owner_heartbeat_at.is_(None),
                            Audit.owner_heartbeat_at < expired,
                            Audit.id.in_(gone),
                        ),
                    )
                )
            )
        for audit_id in orphans:
            audit = self.get_audit(audit_id)
            if audit is None or audit.spec.get("engine") == "external":
                continue  # the user's own run goes on without us: it may keep reporting
            if audit.spec.get("engine") == "deployment" and audit.flower_run_id is not None:
                continue  # its Flower run trains on: adopt_flower_runs takes it back
            reason = f"service restarted during the run; {audit.rounds_stored} rounds were stored"
            lease_held = Audit.owner_heartbeat_at.is_not(None) & (
                Audit.owner_heartbeat_at >= expired
            )
            if audit_id in gone:
                lease_held = Audit.owner_id != audit.owner_id  # re-check: still that owner
            with self.session() as s, s.begin():  # re-checked: a heartbeat may have come in
                if update_audit_if(
                    s,
                    audit_id,
                    Audit.status == "running",
                    ~lease_held,
                    **ended_values("failed", reason),
                ):
                    failed.append(audit_id)
        return failed

    def end_silent_external(self, *, since: datetime, now: datetime | None = None) -> list[str]:
        """Fail running external audits whose run has shown no sign of progress (claim, ingest,
        a heartbeat as of what it reports) for longer than their silence limit
        (:func:`.silence.silence_limit`: 150 s, at most ``timeout_seconds``), counted from the
        later of the last sign and ``since`` (this instance's start: a service outage is not the run's
        silence). An audit still waiting for its claim ends "the run never started" after
        :func:`.silence.start_limit`, counted from its creation. The reason says when the run
        last made progress and what never arrived (rounds, the final model)."""
        now = now or utcnow()
        since = as_utc(since)
        rows = self._running(
            "external",
            Audit.last_contact_at,
            Audit.started_at,
            Audit.created_at,
            Audit.rounds_stored,
            Audit.gaps,
            Audit.has_final,
            where=(Audit.run_token_hash.is_not(None),),
        )
        ended = []
        for row in rows:
            spec = row.spec or {}
            contact = as_utc(row.last_contact_at or row.started_at or row.created_at)
            if row.started_at is None:
                limit = start_limit(spec)
                if (now - max(contact, since)).total_seconds() <= limit.seconds:
                    continue
                reason = (
                    f"the run never started: no Flower run declared its claim within "
                    f"{limit.seconds:g} s of the audit's creation ({limit.rule}); start the "
                    "Flower app with the printed environment sooner, or create the audit "
                    "with a larger start_timeout_seconds (flaudit attach --start-timeout)"
                )
                with self.session() as s, s.begin():
                    if update_audit_if(
                        s,
                        row.id,
                        Audit.status == "running",
                        Audit.started_at.is_(None),
                        **ended_values("failed", reason, now),
                    ):
                        ended.append(row.id)
                continue
            limit = silence_limit(spec)
            if (now - max(contact, since)).total_seconds() <= limit.seconds:
                continue
            num_rounds = int(spec.get("num_rounds") or 0)
            stored = int(row.rounds_stored or 0)
            gaps = list(row.gaps or [])
            missing = ""
            if stored < num_rounds:
                span = (
                    f"round {stored + 1}"
                    if stored + 1 == num_rounds
                    else f"rounds {stored + 1}-{num_rounds}"
                )
                missing = f"; {span} and the final model were never reported"
                gaps.extend(not_reported(stored + 1, num_rounds, "the run stopped reporting"))
            elif not row.has_final:
                missing = "; the final model was never reported"
            reason = (
                f"the run stopped making progress: no sign of it for more than "
                f"{limit.seconds:g} s ({limit.rule}; last sign "
                f"{contact.isoformat(timespec='seconds')}) after "
                f"{stored} of {num_rounds} rounds{missing}"
            )
            with self.session() as s, s.begin():  # re-checked: the run may just have reported
                contacted = or_(
                    Audit.last_contact_at.is_(None), Audit.last_contact_at == row.last_contact_at
                )
                if update_audit_if(
                    s,
                    row.id,
                    Audit.status == "running",
                    contacted,
                    Audit.rounds_stored == stored,
                    **ended_values("failed", reason, now),
                    gaps=gaps,
                ):
                    ended.append(row.id)
        return ended

    def end_refused(self, audit_id: str, *, t: int, reason: str) -> bool:
        """End a running audit whose run sent data that cannot be audited (round ``t``'s update
        or, ``t`` past the last round, the final model: not finite, wrong length): ``failed``
        with ``reason``, the rounds from ``t`` on recorded as not reported (gaps). The estimates
        and alarm of the rounds stored stay: the verdict is on those. False if the audit was
        not running (or ``t`` is not the next round)."""
        now = utcnow()
        with self.session() as s, s.begin():
            row = s.execute(
                select(Audit.spec, Audit.gaps, Audit.rounds_stored).where(Audit.id == audit_id)
            ).one_or_none()
            if row is None:
                return False
            num_rounds = int((row.spec or {}).get("num_rounds") or 0)
            gaps = list(row.gaps or []) + not_reported(int(t), num_rounds, reason[:300])
            return update_audit_if(
                s,
                audit_id,
                Audit.status == "running",
                Audit.rounds_stored == row.rounds_stored,
                **ended_values("failed", reason, now),
                gaps=gaps,
            )

    # -- deployment audits across service restarts ---------------------------------------
    def set_flower_run(self, audit_id: str, flower_run_id: int | str) -> bool:
        """Record the Flower run of a running deployment audit (once the SuperLink accepted
        it); False if the audit is not running."""
        with self.session() as s, s.begin():
            return update_audit_if(
                s,
                audit_id,
                Audit.status == "running",
                flower_run_id=str(int(flower_run_id)),
                updated_at=utcnow(),
            )

    def release(self, audit_id: str, *, owner: str) -> bool:
        """``owner`` stops watching the running audit but leaves its Flower run training (a
        service shutdown): the lease ends now, so the next instance to start (or any live one)
        takes the audit back at once. The run token stays valid: the run's buffered reports are
        accepted when they arrive. False if the audit is not running or not ``owner``'s."""
        with self.session() as s, s.begin():
            return update_audit_if(
                s,
                audit_id,
                Audit.status == "running",
                Audit.owner_id == owner,
                Audit.flower_run_id.is_not(None),
                owner_id=None,
                owner_heartbeat_at=None,
                updated_at=utcnow(),
            )

    def adopt_flower_runs(self, owner: str, *, lease_seconds: float) -> list[tuple[str, str]]:
        """Take over running deployment audits whose Flower run is known and whose owner is
        gone (released, lease expired, or provably dead as seen from ``owner``:
        :func:`owner_is_gone`). Returns
        ``[(audit_id, flower_run_id)]`` now owned by ``owner``, whose runner watches those runs
        again. Each take-over is one conditional ``UPDATE`` (the owner and heartbeat read), so
        two instances never both adopt an audit."""
        expired = utcnow() - timedelta(seconds=lease_seconds)
        rows = self._running(
            "deployment",
            Audit.owner_id,
            Audit.owner_heartbeat_at,
            Audit.flower_run_id,
            where=(Audit.flower_run_id.is_not(None),),
        )
        adopted = []
        for row in rows:
            if row.owner_id == owner or not _lease_lapsed(row, owner, expired):
                continue
            now = utcnow()
            with self.session() as s, s.begin():
                if update_audit_if(
                    s,
                    row.id,
                    Audit.status == "running",
                    *_same_lease(row.owner_id, row.owner_heartbeat_at),
                    owner_id=owner,
                    owner_heartbeat_at=now,
                    updated_at=now,
                ):
                    adopted.append((row.id, row.flower_run_id))
        return adopted

    # -- external audits across replicas ------------------------------------------------
    def take_over(
        self, audit_id: str, owner: str, *, lease_seconds: float, live_too: bool = True
    ) -> bool:
        """``owner`` takes the lease of the running external audit ``audit_id`` (one
        conditional ``UPDATE`` on the owner and heartbeat read, so two replicas never both take
        it). With ``live_too`` (the audit's run sends its requests to ``owner``: the proxy
        routes by audit id, so the traffic says who should hold it) a live lease is taken too;
        without it (the runner's background pass) only a lease that expired or whose owner is
        provably gone (:func:`owner_is_gone`). Taking an audit from another replica appends an
        owner change (``owner_changes``: when, from, to, after which round, the previous
        owner's last heartbeat, why) that the audit names (:func:`owner_change_alerts`).
        True if ``owner`` holds the lease now and did not before."""
        with self.session() as s:
            row = s.execute(
                select(
                    Audit.spec,
                    Audit.status,
                    Audit.owner_id,
                    Audit.owner_heartbeat_at,
                    Audit.rounds_stored,
                    Audit.owner_changes,
                ).where(Audit.id == audit_id)
            ).one_or_none()
        if (
            row is None
            or row.status != "running"
            or (row.spec or {}).get("engine") != "external"
            or row.owner_id == owner
        ):
            return False
        now = utcnow()
        beat = as_utc(row.owner_heartbeat_at)
        changes = list(row.owner_changes or [])
        if row.owner_id is not None:
            if beat is None or (now - beat).total_seconds() > lease_seconds:
                why = f"its lease ({lease_seconds:g} s) expired"
            elif owner_is_gone(row.owner_id, owner):
                why = "its process is gone"
            elif live_too:
                why = "its lease was live; the audit's requests now reach this replica"
            else:
                return False
            changes.append(
                {
                    "at": now.isoformat(timespec="milliseconds"),
                    "from": row.owner_id,
                    "to": owner,
                    "after_round": int(row.rounds_stored or 0),
                    "last_heartbeat_at": beat.isoformat(timespec="milliseconds") if beat else None,
                    "why": why,
                    "count": int(changes[-1].get("count", len(changes)) if changes else 0) + 1,
                }
            )
        with self.session() as s, s.begin():
            return update_audit_if(
                s,
                audit_id,
                Audit.status == "running",
                *_same_lease(row.owner_id, row.owner_heartbeat_at),
                owner_id=owner,
                owner_heartbeat_at=now,
                owner_changes=changes[-OWNER_CHANGES_KEPT:] or None,
            )

    def adopt_external(self, owner: str, *, lease_seconds: float) -> list[str]:
        """Take over (:meth:`take_over`, background: expired or gone owners only) every running
        external audit held by another replica that stopped renewing its lease; the ids now
        ``owner``'s. A quiet run (no request since its replica died) thus still gets a live
        owner within the lease plus one runner heartbeat (a third of the lease)."""
        expired = utcnow() - timedelta(seconds=lease_seconds)
        rows = self._running(
            "external",
            Audit.owner_id,
            Audit.owner_heartbeat_at,
            where=(Audit.owner_id.is_not(None), Audit.owner_id != owner),
        )
        return [
            row.id
            for row in rows
            if _lease_lapsed(row, owner, expired)
            and self.take_over(row.id, owner, lease_seconds=lease_seconds, live_too=False)
        ]

    def _running(self, engine: str, *columns, where: tuple = ()) -> list:
        """``Audit.id``, ``Audit.spec`` and ``columns`` of the running audits of ``engine``
        (their spec's) where the conditions ``where`` hold."""
        with self.session() as s:
            rows = s.execute(
                select(Audit.id, Audit.spec, *columns).where(Audit.status == "running", *where)
            ).all()
        return [row for row in rows if (row.spec or {}).get("engine") == engine]


#: Owner changes an audit keeps (the oldest dropped first; each one's ``count`` says how many
#: there were up to it).
OWNER_CHANGES_KEPT = 20


def _lease_lapsed(row, owner: str, expired: datetime) -> bool:
    """Whether the lease of ``row`` (``owner_id``, ``owner_heartbeat_at``) is free for
    ``owner`` to take: no owner, no heartbeat since ``expired``, or an owner provably gone."""
    heartbeat = as_utc(row.owner_heartbeat_at)
    return (
        row.owner_id is None
        or heartbeat is None
        or heartbeat < expired
        or owner_is_gone(row.owner_id, owner)
    )


def _same_lease(owner_id: str | None, heartbeat_at: datetime | None) -> tuple:
    """The conditions that the lease is still the one read (owner and heartbeat)."""
    return (
        Audit.owner_id.is_(None) if owner_id is None else Audit.owner_id == owner_id,
        Audit.owner_heartbeat_at.is_(None)
        if heartbeat_at is None
        else Audit.owner_heartbeat_at == heartbeat_at,
    )


def owner_is_gone(owner_id: str, instance_id: str) -> bool:
    """Whether the instance ``owner_id`` (``host:pid:random``, :func:`default_instance_id`) is
    provably dead, seen from the live instance ``instance_id``: on the same host, either its
    process no longer exists or it had this very pid (a restarted container's pid 1) with
    another random part. Other hosts and unknown formats: not provable (the lease decides)."""
    try:
        host, pid, _ = owner_id.rsplit(":", 2)
        my_host, my_pid, _ = instance_id.rsplit(":", 2)
        pid_number = int(pid)
    except ValueError:
        return False
    if owner_id == instance_id or host != my_host or pid_number <= 0:
        return False
    if str(pid_number) == my_pid:
        return True
    try:
        os.kill(pid_number, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False
