"""Persistence: SQLAlchemy 2 models and the repository functions the routes and runner use.

SQLite (a file) by default, PostgreSQL by URL (``postgresql+psycopg://...``). Numpy arrays
(per-canary running maxima, final cosines, the initial model) are stored as raw little-endian
float bytes. The secret canary seed lives in the column ``canary_seed`` that no schema
serializes; it is loaded only by :meth:`Store.load_secret_state` for the cosine tracker.

Every acknowledged ingest is one transaction: round row, tracker state and estimates are
committed together before the route replies 2xx.

Running audits carry an owner lease: the id of the service instance whose runner started the
worker (``owner_id``) and that instance's last heartbeat (``owner_heartbeat_at``). Restart
recovery fails running audits whose lease expired, and at once those whose owner is provably
gone (a previous process of this very instance: :func:`owner_is_gone`), so several instances can
share one database. A deployment audit is the exception: its Flower run trains on the
SuperLink without us, so a stopping instance releases it (:meth:`Store.release`) and the next
one takes it back (:meth:`Store.adopt_flower_runs`) instead of failing it. Columns added after
the first release are added on start-up (:func:`_add_columns`).

An external audit (the user's own Flower app) belongs to the run that declared its claim
(``run_id``); ``last_contact_at`` is when that run was last heard from (claim, any ingest, a
heartbeat): :meth:`Store.end_silent_external` ends it after a silence that follows its round
cadence (service/silence.py), or when it never starts.
``gaps`` lists the rounds the audit lacks (``[{round, kind, reason}]``): trained without
canaries (``no_canaries``) or trained but never reported (``not_reported``).
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    delete,
    event,
    func,
    inspect,
    or_,
    select,
    update,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, deferred, mapped_column, sessionmaker

from ..auditor.claims.known_rounds import KnownRoundsState
from .sealing import NO_SECRET_KEY, SecretKeyError, SeedCipher, is_sealed, open_unsealed
from .silence import silence_limit, start_limit

__all__ = [
    "ACTIVE_STATUSES",
    "ENDED_STATUSES",
    "Audit",
    "AuditRound",
    "Store",
    "SecretState",
    "StaleRound",
    "utcnow",
    "hash_token",
    "array_to_bytes",
    "bytes_to_array",
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


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def as_utc(value: datetime | None) -> datetime | None:
    """SQLite drops the zone: read naive timestamps back as UTC."""
    if value is None:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


def hash_token(token: str) -> str:
    """SHA-256 hex of a run token (only the hash is stored)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def array_to_bytes(array: np.ndarray | None, dtype: str = "<f8") -> bytes | None:
    if array is None:
        return None
    return np.ascontiguousarray(array, dtype=dtype).tobytes()


def bytes_to_array(data: bytes | None, dtype: str = "<f8") -> np.ndarray | None:
    if data is None:
        return None
    return np.frombuffer(data, dtype=dtype).copy()


class Base(DeclarativeBase):
    pass


class Audit(Base):
    __tablename__ = "flaudit_audits"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    spec: Mapped[dict] = mapped_column(JSON)
    # Secret: never part of any schema, log or repr. The 128-bit seed encrypted with the
    # service's secret key (``fernet:<token>``, see sealing.py); a plain decimal string only in
    # stores opened without a cipher (tests, library use).
    canary_seed: Mapped[str] = deferred(mapped_column(Text))
    run_token_hash: Mapped[str | None] = deferred(mapped_column(String(64), nullable=True))
    # Owner lease of a running audit: the instance that runs its worker and its last heartbeat.
    owner_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    owner_heartbeat_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), nullable=True
    )
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_round_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    dim: Mapped[int | None] = mapped_column(Integer, nullable=True)
    rounds_stored: Mapped[int] = mapped_column(Integer, default=0)
    has_final: Mapped[bool] = mapped_column(Boolean, default=False)
    initial_model: Mapped[bytes | None] = deferred(mapped_column(LargeBinary, nullable=True))
    max_cosines: Mapped[bytes | None] = deferred(mapped_column(LargeBinary, nullable=True))
    last_cosines: Mapped[bytes | None] = deferred(mapped_column(LargeBinary, nullable=True))
    final_cosines: Mapped[bytes | None] = deferred(mapped_column(LargeBinary, nullable=True))
    final_model_cosines: Mapped[bytes | None] = deferred(
        mapped_column(LargeBinary, nullable=True)
    )
    # Known-rounds statistic (flaudit.auditor.claims.known_rounds.KnownRoundsState): sums <f8 then counts <i8.
    known_rounds_state: Mapped[bytes | None] = deferred(mapped_column(LargeBinary, nullable=True))
    analytic: Mapped[list | None] = mapped_column(JSON, nullable=True)
    estimates: Mapped[list | None] = mapped_column(JSON, nullable=True)
    diagnostics: Mapped[list | None] = mapped_column(JSON, nullable=True)
    histograms: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    alerts: Mapped[list | None] = mapped_column(JSON, nullable=True)
    metrics: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    headline_epsilon: Mapped[float | None] = mapped_column(Float, nullable=True)
    # External audits: the run that owns the audit (declared the claim), when it was last heard
    # from, and the rounds the audit lacks ([{round, kind, reason}]).
    run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    last_contact_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), nullable=True
    )
    gaps: Mapped[list | None] = mapped_column(JSON, nullable=True)
    # Deployment audits: the Flower run on the SuperLink (decimal; Flower's run ids are 64-bit
    # unsigned). A service that stops leaves that run training and releases the audit; the next
    # instance to start takes it back (:meth:`Store.adopt_flower_runs`).
    flower_run_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # The largest round weight_factor reported (a user's weighted FedAvg; None: never reported,
    # as for equal weights in our own apps): the verdict says what the weighting does.
    max_weight_factor: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The largest weight_factor of a round that carried canaries: the heaviest influence the
    # canaries carried, where the claim tests run (docs/estimators.md, "Weighted FedAvg").
    max_canary_weight_factor: Mapped[float | None] = mapped_column(Float, nullable=True)

    def __repr__(self) -> str:  # never show secrets
        return f"Audit(id={self.id!r}, status={self.status!r})"


class AuditRound(Base):
    __tablename__ = "flaudit_rounds"
    __table_args__ = (UniqueConstraint("audit_id", "round", name="uq_flaudit_rounds_audit_round"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    audit_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("flaudit_audits.id", ondelete="CASCADE"), index=True
    )
    round: Mapped[int] = mapped_column(Integer)
    clip_norm: Mapped[float] = mapped_column(Float)
    cohort_size: Mapped[int] = mapped_column(Integer)
    num_canaries_inserted: Mapped[int] = mapped_column(Integer)
    num_failures: Mapped[int] = mapped_column(Integer)
    clipped_fraction: Mapped[float | None] = mapped_column(Float, nullable=True)
    noise_stddev: Mapped[float | None] = mapped_column(Float, nullable=True)
    train_loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    accuracy: Mapped[float | None] = mapped_column(Float, nullable=True)
    delta_norm: Mapped[float | None] = mapped_column(Float, nullable=True)  # API: update_norm
    weight_factor: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Secret until the audit ended (never served): the round's canary participants, <i4.
    participants: Mapped[bytes | None] = deferred(mapped_column(LargeBinary, nullable=True))
    estimates: Mapped[list | None] = mapped_column(JSON, nullable=True)
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


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


class Store:
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
                import os

                parent = os.path.dirname(os.path.abspath(db))
                os.makedirs(parent, exist_ok=True)
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
        Base.metadata.create_all(self.engine)
        _add_columns(self.engine)
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
            result = s.execute(delete(Audit).where(Audit.id == audit_id))
            return result.rowcount > 0

    def mark_running(self, audit_id: str, *, run_token: str, owner: str | None = None) -> bool:
        """queued -> running with a fresh run-token hash, owned by instance ``owner`` (its lease
        starts now); False if the audit is no longer queued."""
        now = utcnow()
        with self.session() as s, s.begin():
            return _update_audit_if(
                s, audit_id, Audit.status == "queued",
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
            return _update_audit_if(
                s, audit_id, Audit.status == "running", Audit.started_at.is_(None),
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
            return _update_audit_if(
                s, audit_id, Audit.status == "running", Audit.started_at.is_not(None), owner,
                run_id=run_id, last_contact_at=now, updated_at=now,
            )

    def touch(self, audit_id: str) -> bool:
        """The run was heard from now (heartbeat); False if the audit is not running."""
        with self.session() as s, s.begin():
            return _update_audit_if(
                s, audit_id, Audit.status == "running", last_contact_at=utcnow()
            )

    def store_missing_round(self, audit_id: str, *, t: int, reason: str) -> bool:
        """Record round ``t`` as trained but not reported (a gap) and move past it; False if
        ``t`` is not the next round or the audit is not running."""
        now = utcnow()
        with self.session() as s, s.begin():
            gaps = list(s.scalar(select(Audit.gaps).where(Audit.id == audit_id)) or [])
            gaps.append({"round": int(t), "kind": "not_reported", "reason": reason})
            return _update_audit_if(
                s, audit_id, Audit.rounds_stored == t - 1, Audit.status == "running",
                Audit.has_final.is_(False),
                rounds_stored=int(t), gaps=gaps, updated_at=now, last_contact_at=now,
            )

    def end_silent_external(self, *, since: datetime, now: datetime | None = None) -> list[str]:
        """Fail running external audits whose run has not been heard from (claim, ingest,
        heartbeat) for longer than their silence limit (:func:`.silence.silence_limit`: from the
        run's round cadence, at most ``timeout_seconds``), counted from the later of the last
        contact and ``since`` (this instance's start: a service outage is not the run's
        silence). An audit still waiting for its claim ends "the run never started" after
        :func:`.silence.start_limit`, counted from its creation. The reason says when the run
        was last heard from and what never arrived (rounds, the final model)."""
        now = now or utcnow()
        since = as_utc(since)
        with self.session() as s:
            rows = s.execute(
                select(Audit.id, Audit.spec, Audit.last_contact_at, Audit.started_at,
                       Audit.created_at, Audit.rounds_stored, Audit.gaps, Audit.has_final).where(
                    Audit.status == "running", Audit.run_token_hash.is_not(None)
                )
            ).all()
        ended = []
        for row in rows:
            spec = row.spec or {}
            if spec.get("engine") != "external":
                continue
            contact = as_utc(row.last_contact_at or row.started_at or row.created_at)
            if row.started_at is None:
                limit = start_limit(spec)
                if (now - max(contact, since)).total_seconds() <= limit.seconds:
                    continue
                reason = (f"the run never started: no Flower run declared its claim within "
                          f"{limit.seconds:g} s of the audit's creation ({limit.rule}); start the "
                          "Flower app with the printed environment sooner, or create the audit "
                          "with a larger start_timeout_seconds (flaudit attach --start-timeout)")
                with self.session() as s, s.begin():
                    if _update_audit_if(
                        s, row.id, Audit.status == "running", Audit.started_at.is_(None),
                        status="failed", reason=reason, finished_at=now, updated_at=now,
                        run_token_hash=None,
                    ):
                        ended.append(row.id)
                continue
            limit = silence_limit(spec, self.round_times(row.id))
            if (now - max(contact, since)).total_seconds() <= limit.seconds:
                continue
            num_rounds = int(spec.get("num_rounds") or 0)
            stored = int(row.rounds_stored or 0)
            gaps = list(row.gaps or [])
            missing = ""
            if stored < num_rounds:
                span = (f"round {stored + 1}" if stored + 1 == num_rounds
                        else f"rounds {stored + 1}-{num_rounds}")
                missing = f"; {span} and the final model were never reported"
                gaps.extend({"round": t, "kind": "not_reported",
                             "reason": "the run stopped reporting"}
                            for t in range(stored + 1, num_rounds + 1))
            elif not row.has_final:
                missing = "; the final model was never reported"
            reason = (
                f"the run stopped reporting: nothing heard for more than {limit.seconds:g} s "
                f"({limit.rule}; last contact {contact.isoformat(timespec='seconds')}) after "
                f"{stored} of {num_rounds} rounds{missing}"
            )
            with self.session() as s, s.begin():  # re-checked: the run may just have reported
                contacted = or_(Audit.last_contact_at.is_(None),
                                Audit.last_contact_at == row.last_contact_at)
                if _update_audit_if(
                    s, row.id, Audit.status == "running", contacted,
                    Audit.rounds_stored == stored,
                    status="failed", reason=reason, finished_at=now, updated_at=now,
                    run_token_hash=None, gaps=gaps,
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
            row = s.execute(select(Audit.spec, Audit.gaps, Audit.rounds_stored)
                            .where(Audit.id == audit_id)).one_or_none()
            if row is None:
                return False
            num_rounds = int((row.spec or {}).get("num_rounds") or 0)
            gaps = list(row.gaps or [])
            gaps.extend({"round": r, "kind": "not_reported", "reason": reason[:300]}
                        for r in range(int(t), num_rounds + 1))
            return _update_audit_if(
                s, audit_id, Audit.status == "running", Audit.rounds_stored == row.rounds_stored,
                status="failed", reason=reason, finished_at=now, updated_at=now,
                run_token_hash=None, gaps=gaps,
            )

    # -- deployment audits across service restarts ---------------------------------------
    def set_flower_run(self, audit_id: str, flower_run_id: int | str) -> bool:
        """Record the Flower run of a running deployment audit (once the SuperLink accepted
        it); False if the audit is not running."""
        with self.session() as s, s.begin():
            return _update_audit_if(
                s, audit_id, Audit.status == "running",
                flower_run_id=str(int(flower_run_id)), updated_at=utcnow(),
            )

    def release(self, audit_id: str, *, owner: str) -> bool:
        """``owner`` stops watching the running audit but leaves its Flower run training (a
        service shutdown): the lease ends now, so the next instance to start (or any live one)
        takes the audit back at once. The run token stays valid: the run's buffered reports are
        accepted when they arrive. False if the audit is not running or not ``owner``'s."""
        with self.session() as s, s.begin():
            return _update_audit_if(
                s, audit_id, Audit.status == "running", Audit.owner_id == owner,
                Audit.flower_run_id.is_not(None),
                owner_id=None, owner_heartbeat_at=None, updated_at=utcnow(),
            )

    def adopt_flower_runs(self, owner: str, *, lease_seconds: float) -> list[tuple[str, str]]:
        """Take over running deployment audits whose Flower run is known and whose owner is
        gone (released, lease expired, or provably dead as seen from ``owner``:
        :func:`owner_is_gone`). Returns
        ``[(audit_id, flower_run_id)]`` now owned by ``owner``, whose runner watches those runs
        again. Each take-over is one conditional ``UPDATE`` (the owner and heartbeat read), so
        two instances never both adopt an audit."""
        expired = utcnow() - timedelta(seconds=lease_seconds)
        with self.session() as s:
            rows = s.execute(
                select(Audit.id, Audit.spec, Audit.owner_id, Audit.owner_heartbeat_at,
                       Audit.flower_run_id).where(
                    Audit.status == "running", Audit.flower_run_id.is_not(None)
                )
            ).all()
        adopted = []
        for row in rows:
            if (row.spec or {}).get("engine") != "deployment" or row.owner_id == owner:
                continue
            heartbeat = as_utc(row.owner_heartbeat_at)
            gone = (
                row.owner_id is None
                or heartbeat is None
                or heartbeat < expired
                or owner_is_gone(row.owner_id, owner)
            )
            if not gone:
                continue
            same_owner = (Audit.owner_id.is_(None) if row.owner_id is None
                          else Audit.owner_id == row.owner_id)
            same_beat = (Audit.owner_heartbeat_at.is_(None) if row.owner_heartbeat_at is None
                         else Audit.owner_heartbeat_at == row.owner_heartbeat_at)
            now = utcnow()
            with self.session() as s, s.begin():
                if _update_audit_if(
                    s, row.id, Audit.status == "running", same_owner, same_beat,
                    owner_id=owner, owner_heartbeat_at=now, updated_at=now,
                ):
                    adopted.append((row.id, row.flower_run_id))
        return adopted

    def rotate_run_token(self, audit_id: str, *, run_token: str) -> bool:
        """Replace the run token of a running audit (the old one stops working at once)."""
        now = utcnow()
        with self.session() as s, s.begin():
            return _update_audit_if(
                s, audit_id, Audit.status == "running", Audit.run_token_hash.is_not(None),
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

    def finish(
        self, audit_id: str, *, status: str, reason: str | None, only_if: tuple[str, ...]
    ) -> bool:
        """Move an audit to an ended status if its status is in ``only_if``."""
        if status not in ENDED_STATUSES:
            raise ValueError(f"status must be one of {ENDED_STATUSES}, got {status!r}")
        now = utcnow()
        with self.session() as s, s.begin():
            return _update_audit_if(
                s, audit_id, Audit.status.in_(only_if),
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
            known_rounds=None if max_cosines is None else known_rounds_from_bytes(
                row.known_rounds_state, row.rounds_stored, num_canaries=max_cosines.size),
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
        self, audit_id: str, *, model: np.ndarray, analytic: list[dict], estimates: list[dict],
        alerts: list[dict],
    ) -> None:
        now = utcnow()
        with self.session() as s, s.begin():
            if not _update_audit_if(
                s, audit_id, Audit.initial_model.is_(None),
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
        now = utcnow()
        with self.session() as s, s.begin():
            if gap is not None:
                gaps = list(s.scalar(select(Audit.gaps).where(Audit.id == audit_id)) or [])
                extra["gaps"] = [*gaps, gap]
            if weight is not None:
                largest = s.scalar(select(Audit.max_weight_factor).where(Audit.id == audit_id))
                extra["max_weight_factor"] = max(float(weight), largest or float(weight))
                if int(round_row.get("num_canaries_inserted") or 0) > 0:
                    carried = s.scalar(select(Audit.max_canary_weight_factor)
                                       .where(Audit.id == audit_id))
                    extra["max_canary_weight_factor"] = max(float(weight),
                                                            carried or float(weight))
            if not _update_audit_if(
                s, audit_id, Audit.rounds_stored == t - 1, Audit.status == "running",
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
            s.add(AuditRound(
                audit_id=audit_id, received_at=now,
                participants=array_to_bytes(participants, "<i4"), **round_row,
            ))

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
            if not _update_audit_if(
                s, audit_id, Audit.has_final.is_(False), Audit.status == "running",
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
            return list(s.scalars(
                select(AuditRound.received_at)
                .where(AuditRound.audit_id == audit_id)
                .order_by(AuditRound.round)
            ))

    def get_round(self, audit_id: str, t: int) -> AuditRound | None:
        with self.session() as s:
            return s.scalar(
                select(AuditRound).where(AuditRound.audit_id == audit_id, AuditRound.round == t)
            )

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
                        or_(Audit.owner_heartbeat_at.is_(None), Audit.owner_heartbeat_at < expired,
                            Audit.id.in_(gone)),
                    )
                )
            )
        for audit_id in orphans:
            audit = self.get_audit(audit_id)
            if audit is None or audit.spec.get("engine") == "external":
                continue  # the user's own run goes on without us: it may keep reporting
            if audit.spec.get("engine") == "deployment" and audit.flower_run_id is not None:
                continue  # its Flower run trains on: adopt_flower_runs takes it back
            reason = (
                f"service restarted during the run; {audit.rounds_stored} rounds were stored"
            )
            lease_held = Audit.owner_heartbeat_at.is_not(None) & (
                Audit.owner_heartbeat_at >= expired
            )
            if audit_id in gone:
                lease_held = Audit.owner_id != audit.owner_id  # re-check: still that owner
            with self.session() as s, s.begin():  # re-checked: a heartbeat may have come in
                if _update_audit_if(
                    s, audit_id, Audit.status == "running", ~lease_held,
                    status="failed", reason=reason, finished_at=utcnow(), updated_at=utcnow(),
                    run_token_hash=None,
                ):
                    failed.append(audit_id)
        return failed


def owner_is_gone(owner_id: str, instance_id: str) -> bool:
    """Whether the instance ``owner_id`` (``host:pid:random``, :func:`default_instance_id`) is
    provably dead, seen from the live instance ``instance_id``: on the same host, either its
    process no longer exists or it had this very pid (a restarted container's pid 1) with
    another random part. Other hosts and unknown formats: not provable (the lease decides)."""
    import os

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


def known_rounds_to_bytes(state: KnownRoundsState) -> bytes:
    """``sums`` (<f8) and ``counts`` (<i8) per canary, then ``round_sums`` (<f8) and
    ``round_counts`` (<i8) per round with a seen participant; ``num_rounds`` is the audit's
    ``rounds_stored``."""
    return (array_to_bytes(state.sums, "<f8") + array_to_bytes(state.counts, "<i8")
            + array_to_bytes(np.asarray(state.round_sums, dtype=np.float64), "<f8")
            + array_to_bytes(np.asarray(state.round_counts, dtype=np.int64), "<i8"))


def known_rounds_from_bytes(data: bytes | None, num_rounds: int,
                            num_canaries: int) -> KnownRoundsState | None:
    """The inverse of :func:`known_rounds_to_bytes`. A state written before the per-round sums
    existed (``16 k`` bytes) loads with none: the exact claim test then counts only the rounds
    stored after the upgrade (less power, never a wrong rejection)."""
    if data is None:
        return None
    k = int(num_canaries)
    head, rest = data[: 16 * k], data[16 * k :]
    half = len(rest) // 2
    return KnownRoundsState(
        sums=bytes_to_array(head[: 8 * k], "<f8"),
        counts=bytes_to_array(head[8 * k :], "<i8"),
        num_rounds=int(num_rounds),
        round_sums=bytes_to_array(rest[:half], "<f8") if rest else np.zeros(0),
        round_counts=bytes_to_array(rest[half:], "<i8") if rest else np.zeros(0, dtype=np.int64),
    )


def _update_audit_if(session: Session, audit_id: str, *conditions, **values) -> bool:
    """``UPDATE`` audit ``audit_id`` with ``values`` where all ``conditions`` hold (optimistic
    concurrency: the conditions are checked by the database in the same statement); whether the
    row was updated."""
    result = session.execute(update(Audit).where(Audit.id == audit_id, *conditions).values(**values))
    return result.rowcount > 0


def _add_columns(engine: Engine) -> None:
    """Additive migration: columns of :class:`Audit` and :class:`AuditRound` missing from older
    tables are added (nullable, no default), so a database created by an earlier version keeps
    working."""
    inspector = inspect(engine)
    for table in (Audit.__table__, AuditRound.__table__):
        present = {column["name"]: column for column in inspector.get_columns(table.name)}
        missing = [column for column in table.columns if column.name not in present]
        seed_type = present.get("canary_seed", {}).get("type")
        widen = engine.dialect.name == "postgresql" and getattr(seed_type, "length", None) is not None
        if not missing and not widen:
            continue
        with engine.begin() as conn:
            for column in missing:
                kind = column.type.compile(dialect=engine.dialect)
                conn.exec_driver_sql(f'ALTER TABLE {table.name} ADD COLUMN "{column.name}" {kind}')
            if widen:  # VARCHAR(48) of the first release: an encrypted seed needs ~150 characters
                conn.exec_driver_sql(f"ALTER TABLE {table.name} ALTER COLUMN canary_seed TYPE TEXT")


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
