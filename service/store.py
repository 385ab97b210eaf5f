"""The store: the service's database access, the queries the routes, the live ingest and the
runner use (SQLAlchemy 2).

SQLite (a file) by default, PostgreSQL by URL (``postgresql+psycopg://...``). The tables are
declared in ``tables.py``; opening a store brings the database to the newest schema revision
with Alembic (``migrations/``: the tables of an empty database are created there, and a database
an earlier flaudit created is upgraded in place). The secret canary seed lives in the column
``canary_seed`` that no schema serializes; it is loaded only by :meth:`Store.load_secret_state`
for the cosine tracker, and encrypted at rest with the store's cipher (``sealing.py``).

Every acknowledged ingest is one transaction: round row, tracker state and estimates are
committed together before the route replies 2xx. Owner leases, restart recovery and the
deployment and external audits that outlive a worker are in ``leases.py`` (a mixin of
:class:`Store`). ``gaps`` lists the rounds an audit lacks (``[{round, kind, reason}]``): trained
without canaries (``no_canaries``) or trained but never reported (``not_reported``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import create_engine, delete, event, func, select, update
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import Session, sessionmaker

from ..auditor.claims.known_rounds import KnownRoundsState
from . import migrations
from .leases import LeaseQueries, owner_is_gone
from .sealing import NO_SECRET_KEY, SecretKeyError, SeedCipher, is_sealed, open_unsealed
from .tables import (
    Audit,
    AuditRound,
    RecordAudit,
    RecordClient,
    RecordPlan,
    RecordRound,
    array_to_bytes,
    as_utc,
    bytes_to_array,
    hash_token,
    known_rounds_from_bytes,
    known_rounds_to_bytes,
    update_audit_if,
    utcnow,
)

__all__ = [
    "ACTIVE_STATUSES",
    "ENDED_STATUSES",
    "Audit",
    "AuditRound",
    "Store",
    "SecretState",
    "StaleRound",
    "utcnow",
    "as_utc",
    "hash_token",
    "array_to_bytes",
    "bytes_to_array",
    "known_rounds_to_bytes",
    "known_rounds_from_bytes",
    "owner_is_gone",
]

ACTIVE_STATUSES = ("queued", "running")
ENDED_STATUSES = ("succeeded", "failed", "cancelled")
#: The alert of an external audit until its ServerApp declared the claim.
WAITING_FOR_SERVERAPP = {
    "level": "info",
    "message": (
        "waiting for the ServerApp: start your Flower app with the environment printed at "
        "creation (CanaryAuditStrategy.from_env); no claim declared yet"
    ),
}


@dataclass
class SecretState:
    """What the tracker needs to resume: the seed (secret) and the stored running statistics."""

    seed: int
    dim: int | None
    rounds_stored: int
    has_final: bool
    max_cosines: np.ndarray | None
    last_cosines: np.ndarray | None
    initial_model: np.ndarray | None
    known_rounds: KnownRoundsState | None = None

    def __repr__(self) -> str:  # never show the seed
        return f"SecretState(dim={self.dim}, rounds_stored={self.rounds_stored})"


class StaleRound(Exception):
    """Another writer stored this round first (optimistic check failed)."""


class Store(LeaseQueries):
    """Database access for the service.

    Parameters
    ----------
    database_url : str
        SQLAlchemy URL. ``sqlite:///path.db`` or ``postgresql+psycopg://user@host/db``.
    schema : str, optional
        PostgreSQL schema to use (created if missing; tests use a fresh one per run).
    """

    def __init__(
        self, database_url: str, *, schema: str | None = None, cipher: SeedCipher | None = None
    ) -> None:
        url = make_url(database_url)
        # hide_parameters: a failing statement's log and exception never show bound values
        # (the canary seed, run-token hashes)
        kwargs: dict[str, Any] = {"future": True, "hide_parameters": True}
        if url.get_backend_name() == "sqlite":
            db = url.database
            if db and db != ":memory:":
                os.makedirs(os.path.dirname(os.path.abspath(db)), exist_ok=True)
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        else:
            kwargs["pool_pre_ping"] = True
            kwargs["pool_size"] = 10
            kwargs["max_overflow"] = 20
            if schema:
                kwargs["connect_args"] = {"options": f"-csearch_path={schema}"}
        self.engine: Engine = create_engine(url, **kwargs)
        self.dialect = url.get_backend_name()
        if self.dialect == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        if schema and self.dialect == "postgresql":
            with self.engine.begin() as conn:
                conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        #: the schema revision the database is at (Alembic; service/migrations/)
        self.revision = migrations.upgrade(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.cipher = cipher
        if cipher is not None:
            self.reseal_seeds(only_plain=True)

    def __repr__(self) -> str:
        return f"Store(dialect={self.dialect!r})"

    def dispose(self) -> None:
        self.engine.dispose()

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        with self._sessions() as session:
            yield session

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")

    # -- audits ---------------------------------------------------------------------------
    def create_audit(
        self, *, name: str, spec: dict, canary_seed: int, run_token: str | None = None
    ) -> Audit:
        """A new audit, ``queued`` for the runner; with ``run_token`` it is an audit of a run
        flaudit does not start: ``running`` at once, ingest open to that token, ``started_at``
        unset until the ServerApp declares its claim (:meth:`declare_claim`)."""
        now = utcnow()
        audit = Audit(
            id=secrets.token_urlsafe(9),
            name=name,
            status="queued" if run_token is None else "running",
            reason=None,
            spec=spec,
            canary_seed=self._seal(canary_seed),
            run_token_hash=None if run_token is None else hash_token(run_token),
            created_at=now,
            updated_at=now,
            rounds_stored=0,
            has_final=False,
            estimates=[],
            diagnostics=[],
            histograms={},
            alerts=[] if run_token is None else [WAITING_FOR_SERVERAPP],
            metrics={},
        )
        with self.session() as s, s.begin():
            s.add(audit)
        return audit

    def get_audit(self, audit_id: str) -> Audit | None:
        with self.session() as s:
            return s.get(Audit, audit_id)

    def count_audits(self) -> int:
        with self.session() as s:
            return int(s.scalar(select(func.count()).select_from(Audit)) or 0)

    def list_audits(
        self, *, status: str | None = None, limit: int = 50, offset: int = 0
    ) -> tuple[list[Audit], int]:
        with self.session() as s:
            query = select(Audit)
            count = select(func.count()).select_from(Audit)
            if status:
                query = query.where(Audit.status == status)
                count = count.where(Audit.status == status)
            query = query.order_by(Audit.created_at.desc(), Audit.id).limit(limit).offset(offset)
            return list(s.scalars(query)), int(s.scalar(count) or 0)

    def audit_ids_with_status(self, *statuses: str) -> list[str]:
        with self.session() as s:
            rows = s.scalars(
                select(Audit.id).where(Audit.status.in_(statuses)).order_by(Audit.created_at)
            )
            return list(rows)

    def delete_audit(self, audit_id: str) -> bool:
        with self.session() as s, s.begin():
            s.execute(delete(AuditRound).where(AuditRound.audit_id == audit_id))
            for table in (RecordRound, RecordPlan, RecordClient, RecordAudit):
                s.execute(delete(table).where(table.audit_id == audit_id))
            result = s.execute(delete(Audit).where(Audit.id == audit_id))
            return result.rowcount > 0

    def mark_running(self, audit_id: str, *, run_token: str, owner: str | None = None) -> bool:
        """queued -> running with a fresh run-token hash, owned by instance ``owner`` (its lease
        starts now); False if the audit is no longer queued."""
        now = utcnow()
        with self.session() as s, s.begin():
            return update_audit_if(
                s,
                audit_id,
                Audit.status == "queued",
                status="running",
                started_at=now,
                updated_at=now,
                run_token_hash=hash_token(run_token),
                owner_id=owner,
                owner_heartbeat_at=now if owner else None,
            )

    def declare_claim(self, audit_id: str, *, spec: dict, run_id: str | None = None) -> bool:
        """Store the spec completed by the ServerApp's claim and mark the run started, owned by
        ``run_id``; False if the audit is not running or its claim was declared already."""
        now = utcnow()
        with self.session() as s, s.begin():
            return update_audit_if(
                s,
                audit_id,
                Audit.status == "running",
                Audit.started_at.is_(None),
                spec=spec,
                started_at=now,
                updated_at=now,
                last_contact_at=now,
                run_id=run_id,
                alerts=[],
            )

    def resume_run(self, audit_id: str, *, run_id: str, previous: str | None) -> bool:
        """Hand a running external audit from run ``previous`` to ``run_id`` (explicit resume of
        the same training after a crash); False if it is not running or changed owner."""
        now = utcnow()
        owner = Audit.run_id.is_(None) if previous is None else Audit.run_id == previous
        with self.session() as s, s.begin():
            return update_audit_if(
                s,
                audit_id,
                Audit.status == "running",
                Audit.started_at.is_not(None),
                owner,
                run_id=run_id,
                last_contact_at=now,
                updated_at=now,
            )

    def touch(self, audit_id: str, *, at: datetime | None = None) -> bool:
        """The run was heard from (heartbeat): it made progress up to ``at`` (default now; what
        its heartbeat vouches for, :func:`.silence.progress_at`). ``last_contact_at`` never
        moves back. False if the audit is not running."""
        at = at or utcnow()
        with self.session() as s, s.begin():
            if s.scalar(select(Audit.status).where(Audit.id == audit_id)) != "running":
                return False
            s.execute(
                update(Audit)
                .where(
                    Audit.id == audit_id,
                    Audit.status == "running",
                    (Audit.last_contact_at.is_(None)) | (Audit.last_contact_at < at),
                )
                .values(last_contact_at=at)
            )
            return True

    def store_missing_round(self, audit_id: str, *, t: int, reason: str) -> bool:
        """Record round ``t`` as trained but not reported (a gap) and move past it; False if
        ``t`` is not the next round or the audit is not running."""
        now = utcnow()
        with self.session() as s, s.begin():
            gaps = list(s.scalar(select(Audit.gaps).where(Audit.id == audit_id)) or [])
            gaps.append({"round": int(t), "kind": "not_reported", "reason": reason})
            return update_audit_if(
                s,
                audit_id,
                Audit.rounds_stored == t - 1,
                Audit.status == "running",
                Audit.has_final.is_(False),
                rounds_stored=int(t),
                gaps=gaps,
                updated_at=now,
                last_contact_at=now,
            )

    def rotate_run_token(self, audit_id: str, *, run_token: str) -> bool:
        """Replace the run token of a running audit (the old one stops working at once)."""
        now = utcnow()
        with self.session() as s, s.begin():
            return update_audit_if(
                s,
                audit_id,
                Audit.status == "running",
                Audit.run_token_hash.is_not(None),
                run_token_hash=hash_token(run_token),
                updated_at=now,
            )

    # -- the secret seed at rest ----------------------------------------------------------
    def _seal(self, seed: int) -> str:
        return str(int(seed)) if self.cipher is None else self.cipher.seal(seed)

    def _open(self, stored: str) -> int:
        return open_unsealed(stored) if self.cipher is None else self.cipher.open(stored)

    def reseal_seeds(self, *, only_plain: bool = False) -> int:
        """Encrypt every stored seed with the cipher's first key, in one transaction (key
        rotation), or with ``only_plain`` only the seeds stored without encryption; returns the
        number of seeds rewritten."""
        if self.cipher is None:
            raise SecretKeyError(NO_SECRET_KEY)
        count = 0
        with self.session() as s, s.begin():
            for audit_id, stored in s.execute(select(Audit.id, Audit.canary_seed)).all():
                if only_plain and is_sealed(stored):
                    continue
                s.execute(
                    update(Audit)
                    .where(Audit.id == audit_id)
                    .values(canary_seed=self.cipher.reseal(stored))
                )
                count += 1
        return count

    def finish(
        self, audit_id: str, *, status: str, reason: str | None, only_if: tuple[str, ...]
    ) -> bool:
        """Move an audit to an ended status if its status is in ``only_if``."""
        if status not in ENDED_STATUSES:
            raise ValueError(f"status must be one of {ENDED_STATUSES}, got {status!r}")
        now = utcnow()
        with self.session() as s, s.begin():
            return update_audit_if(
                s,
                audit_id,
                Audit.status.in_(only_if),
                status=status,
                reason=reason,
                finished_at=now,
                updated_at=now,
                run_token_hash=None,
            )

    def clear_run_token(self, audit_id: str) -> None:
        """The run's worker is gone: its token stops being valid."""
        with self.session() as s, s.begin():
            s.execute(update(Audit).where(Audit.id == audit_id).values(run_token_hash=None))

    def run_token_hash(self, audit_id: str) -> str | None:
        with self.session() as s:
            return s.scalar(select(Audit.run_token_hash).where(Audit.id == audit_id))

    def canary_seed(self, audit_id: str) -> int | None:
        """The secret seed, for the runner handing it to the Flower run (never log it)."""
        with self.session() as s:
            raw = s.scalar(select(Audit.canary_seed).where(Audit.id == audit_id))
            return None if raw is None else self._open(raw)

    def load_secret_state(self, audit_id: str) -> SecretState | None:
        with self.session() as s:
            row = s.execute(
                select(
                    Audit.canary_seed,
                    Audit.dim,
                    Audit.rounds_stored,
                    Audit.has_final,
                    Audit.max_cosines,
                    Audit.last_cosines,
                    Audit.initial_model,
                    Audit.known_rounds_state,
                ).where(Audit.id == audit_id)
            ).one_or_none()
        if row is None:
            return None
        max_cosines = bytes_to_array(row.max_cosines)
        return SecretState(
            seed=self._open(row.canary_seed),
            dim=row.dim,
            rounds_stored=row.rounds_stored,
            has_final=bool(row.has_final),
            max_cosines=max_cosines,
            last_cosines=bytes_to_array(row.last_cosines),
            initial_model=bytes_to_array(row.initial_model, "<f4"),
            known_rounds=None
            if max_cosines is None
            else known_rounds_from_bytes(
                row.known_rounds_state, row.rounds_stored, num_canaries=max_cosines.size
            ),
        )

    def initial_model_bytes(self, audit_id: str) -> bytes | None:
        with self.session() as s:
            return s.scalar(select(Audit.initial_model).where(Audit.id == audit_id))

    def cosine_arrays(self, audit_id: str) -> dict[str, np.ndarray | None]:
        with self.session() as s:
            row = s.execute(
                select(
                    Audit.max_cosines,
                    Audit.last_cosines,
                    Audit.final_cosines,
                    Audit.final_model_cosines,
                ).where(Audit.id == audit_id)
            ).one()
        return {
            "max_cosines": bytes_to_array(row.max_cosines),
            "last_cosines": bytes_to_array(row.last_cosines),
            "final_cosines": bytes_to_array(row.final_cosines),
            "final_model_cosines": bytes_to_array(row.final_model_cosines),
        }

    def store_initial_model(
        self,
        audit_id: str,
        *,
        model: np.ndarray,
        analytic: list[dict],
        estimates: list[dict],
        alerts: list[dict],
    ) -> None:
        now = utcnow()
        with self.session() as s, s.begin():
            if not update_audit_if(
                s,
                audit_id,
                Audit.initial_model.is_(None),
                initial_model=array_to_bytes(model, "<f4"),
                dim=int(model.shape[0]),
                analytic=analytic,
                estimates=estimates,
                alerts=alerts,
                updated_at=now,
                last_contact_at=now,
            ):
                raise StaleRound("initial model already stored")

    def store_round(
        self,
        audit_id: str,
        *,
        round_row: dict,
        max_cosines: np.ndarray,
        last_cosines: np.ndarray,
        estimates: list[dict],
        diagnostics: list[dict],
        histograms: dict,
        alerts: list[dict],
        headline_epsilon: float | None,
        known_rounds: KnownRoundsState | None = None,
        participants: np.ndarray | None = None,
        gap: dict | None = None,
    ) -> None:
        """Round row + tracker state (cosine maxima, known-rounds statistic) + estimates in one
        transaction (optimistic on the round); ``gap`` (``{round, kind, reason}``) is appended
        to the audit's gaps and the round's ``weight_factor`` raises the audit's
        ``max_weight_factor`` in the same transaction."""
        t = int(round_row["round"])
        extra = {}
        if known_rounds is not None:
            extra["known_rounds_state"] = known_rounds_to_bytes(known_rounds)
        weight = round_row.get("weight_factor")
        noise_norm = round_row.get("noise_clip_norm")
        now = utcnow()
        with self.session() as s, s.begin():
            if gap is not None:
                gaps = list(s.scalar(select(Audit.gaps).where(Audit.id == audit_id)) or [])
                extra["gaps"] = [*gaps, gap]
            if weight is not None:
                largest = s.scalar(select(Audit.max_weight_factor).where(Audit.id == audit_id))
                extra["max_weight_factor"] = max(float(weight), largest or float(weight))
                if int(round_row.get("num_canaries_inserted") or 0) > 0:
                    carried = s.scalar(
                        select(Audit.max_canary_weight_factor).where(Audit.id == audit_id)
                    )
                    extra["max_canary_weight_factor"] = max(float(weight), carried or float(weight))
            if noise_norm is not None and round_row.get("clip_norm"):
                factor = float(noise_norm) / float(round_row["clip_norm"])
                least = s.scalar(select(Audit.min_noise_clip_factor).where(Audit.id == audit_id))
                extra["min_noise_clip_factor"] = min(factor, factor if least is None else least)
            if not update_audit_if(
                s,
                audit_id,
                Audit.rounds_stored == t - 1,
                Audit.status == "running",
                rounds_stored=t,
                max_cosines=array_to_bytes(max_cosines),
                last_cosines=array_to_bytes(last_cosines),
                estimates=estimates,
                diagnostics=diagnostics,
                histograms=histograms,
                alerts=alerts,
                headline_epsilon=headline_epsilon,
                updated_at=now,
                last_round_at=now,
                last_contact_at=now,
                **extra,
            ):
                raise StaleRound(f"round {t} was not the next round or the audit is not running")
            s.add(
                AuditRound(
                    audit_id=audit_id,
                    received_at=now,
                    participants=array_to_bytes(participants, "<i4"),
                    **round_row,
                )
            )

    def store_final(
        self,
        audit_id: str,
        *,
        final_cosines: np.ndarray,
        final_model_cosines: np.ndarray,
        estimates: list[dict],
        diagnostics: list[dict],
        histograms: dict,
        alerts: list[dict],
        metrics: dict,
        headline_epsilon: float | None,
    ) -> None:
        now = utcnow()
        with self.session() as s, s.begin():
            if not update_audit_if(
                s,
                audit_id,
                Audit.has_final.is_(False),
                Audit.status == "running",
                has_final=True,
                final_cosines=array_to_bytes(final_cosines),
                final_model_cosines=array_to_bytes(final_model_cosines),
                estimates=estimates,
                diagnostics=diagnostics,
                histograms=histograms,
                alerts=alerts,
                metrics=metrics,
                headline_epsilon=headline_epsilon,
                status="succeeded",
                reason=None,
                finished_at=now,
                updated_at=now,
                run_token_hash=None,  # the run has ended: its token stops working
            ):
                raise StaleRound("final model already stored or the audit is not running")

    def list_rounds(self, audit_id: str) -> list[AuditRound]:
        with self.session() as s:
            return list(
                s.scalars(
                    select(AuditRound)
                    .where(AuditRound.audit_id == audit_id)
                    .order_by(AuditRound.round)
                )
            )

    def round_times(self, audit_id: str) -> list[datetime]:
        """When each stored round arrived, in round order (for the ETA)."""
        with self.session() as s:
            return list(
                s.scalars(
                    select(AuditRound.received_at)
                    .where(AuditRound.audit_id == audit_id)
                    .order_by(AuditRound.round)
                )
            )

    def get_round(self, audit_id: str, t: int) -> AuditRound | None:
        with self.session() as s:
            return s.scalar(
                select(AuditRound).where(AuditRound.audit_id == audit_id, AuditRound.round == t)
            )


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
