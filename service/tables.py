"""The store's tables, in one place: every SQLAlchemy model of the service (``Base.metadata``),
how values are encoded in their columns, and the one conditional ``UPDATE`` of an audit.

A new table (or column) goes here, **and** in a new Alembic revision in
``service/migrations/versions/`` that creates it: the store opens a database by upgrading it to
the newest revision (``migrations.upgrade``), never with ``create_all``. The test
``tests/service/test_migrations.py`` fails when these models and the revisions disagree.

Numpy arrays (per-canary running maxima, final cosines, the initial model) are stored as raw
little-endian bytes. The secret canary seed lives in the column ``canary_seed`` that no schema
serializes (deferred: loaded only when asked for).
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

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
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, deferred, mapped_column

from ..auditor.claims.known_rounds import KnownRoundsState

__all__ = [
    "Base",
    "Audit",
    "AuditRound",
    "utcnow",
    "as_utc",
    "hash_token",
    "array_to_bytes",
    "bytes_to_array",
    "known_rounds_to_bytes",
    "known_rounds_from_bytes",
    "update_audit_if",
    "ended_values",
    "not_reported",
    "Webhook",
    "WebhookDelivery",
    "WEBHOOK_EVENTS",
    "queue_webhook_deliveries",
    "RecordAudit",
    "RecordClient",
    "RecordPlan",
    "RecordRound",
]

#: The events a webhook can subscribe to (docs/operations.md, "Alert webhooks").
WEBHOOK_EVENTS = ("alarm.fired", "audit.ended", "audit.failed", "gap.recorded")


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime | None) -> datetime | None:
    """SQLite drops the zone: read naive timestamps back as UTC."""
    if value is None:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


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
    # Takeovers of a running audit by another replica ([{at, from, to, after_round,
    # last_heartbeat_at, why}], at most OWNER_CHANGES_KEPT; service/leases.py).
    owner_changes: Mapped[list | None] = mapped_column(JSON, nullable=True)
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
    final_model_cosines: Mapped[bytes | None] = deferred(mapped_column(LargeBinary, nullable=True))
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
    last_contact_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
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
    # The smallest round noise_clip_norm / clip_norm reported (issue #38; None: never
    # reported): below 1 a round was noised for a smaller clip norm than its updates had.
    min_noise_clip_factor: Mapped[float | None] = mapped_column(Float, nullable=True)

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
    # The clip norm the round's noise was calibrated for (None: not reported, clip_norm)
    noise_clip_norm: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Secret until the audit ended (never served): the round's canary participants, <i4.
    participants: Mapped[bytes | None] = deferred(mapped_column(LargeBinary, nullable=True))
    estimates: Mapped[list | None] = mapped_column(JSON, nullable=True)
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


#: Ends a known-rounds state that carries ``round_factors`` (a negative ``<i8`` never ends the
#: older layouts, whose last value is a round count >= 1).
_FACTORS_TRAILER = -0x464C415544495401


def known_rounds_to_bytes(state: KnownRoundsState) -> bytes:
    """``sums`` (<f8) and ``counts`` (<i8) per canary, then ``round_sums`` (<f8) and
    ``round_counts`` (<i8) per round with a seen participant; ``num_rounds`` is the audit's
    ``rounds_stored``. A state with round signal factors (a weighted FedAvg, a round noised for
    a smaller clip norm) appends ``round_factors`` (<f8) and the trailer
    :data:`_FACTORS_TRAILER`; one without them is written as before."""
    out = (
        array_to_bytes(state.sums, "<f8")
        + array_to_bytes(state.counts, "<i8")
        + array_to_bytes(np.asarray(state.round_sums, dtype=np.float64), "<f8")
        + array_to_bytes(np.asarray(state.round_counts, dtype=np.int64), "<i8")
    )
    factors = np.asarray(state.round_factors, dtype=np.float64)
    if factors.size:
        out += array_to_bytes(factors, "<f8") + np.array([_FACTORS_TRAILER], "<i8").tobytes()
    return out


def known_rounds_from_bytes(
    data: bytes | None, num_rounds: int, num_canaries: int
) -> KnownRoundsState | None:
    """The inverse of :func:`known_rounds_to_bytes`. A state written before the per-round sums
    existed (``16 k`` bytes) loads with none: the exact claim test then counts only the rounds
    stored after the upgrade (less power, never a wrong rejection). One written before the
    round factors existed loads with none (every round at the claim, as it was tested)."""
    if data is None:
        return None
    k = int(num_canaries)
    head, rest = data[: 16 * k], data[16 * k :]
    factors = np.zeros(0)
    if len(rest) >= 8 and int(np.frombuffer(rest[-8:], "<i8")[0]) == _FACTORS_TRAILER:
        per_round = (len(rest) - 8) // 24
        factors = bytes_to_array(rest[16 * per_round : 24 * per_round], "<f8")
        rest = rest[: 16 * per_round]
    half = len(rest) // 2
    return KnownRoundsState(
        sums=bytes_to_array(head[: 8 * k], "<f8"),
        counts=bytes_to_array(head[8 * k :], "<i8"),
        num_rounds=int(num_rounds),
        round_sums=bytes_to_array(rest[:half], "<f8") if rest else np.zeros(0),
        round_counts=bytes_to_array(rest[half:], "<i8") if rest else np.zeros(0, dtype=np.int64),
        round_factors=factors,
    )


def ended_values(status: str, reason: str | None, now: datetime | None = None) -> dict:
    """The values of :func:`update_audit_if` that end an audit: ``status`` and ``reason``,
    ``finished_at`` (``now``, default :func:`utcnow`), and no run token (the run's token stops
    working)."""
    now = now or utcnow()
    return {
        "status": status,
        "reason": reason,
        "finished_at": now,
        "updated_at": now,
        "run_token_hash": None,
    }


def not_reported(first: int, last: int, reason: str) -> list[dict]:
    """The gaps (``{round, kind: "not_reported", reason}``) of rounds ``first`` to ``last``."""
    return [{"round": t, "kind": "not_reported", "reason": reason} for t in range(first, last + 1)]


def update_audit_if(session: Session, audit_id: str, *conditions, **values) -> bool:
    """``UPDATE`` audit ``audit_id`` with ``values`` where all ``conditions`` hold (optimistic
    concurrency: the conditions are checked by the database in the same statement); whether the
    row was updated."""
    result = session.execute(
        update(Audit).where(Audit.id == audit_id, *conditions).values(**values)
    )
    changed = result.rowcount > 0
    if changed and values.get("status") in ("succeeded", "failed", "cancelled"):
        # the webhooks' outbox: in the transaction that ends the audit (every path that ends one)
        event = "audit.failed" if values["status"] == "failed" else "audit.ended"
        queue_webhook_deliveries(session, event, audit_id, {"status": values["status"]})
    return changed


class Webhook(Base):
    """A subscription (``POST /webhooks``): ``events`` is stored as ``,a,b,`` (matched with
    ``LIKE``); ``audit_id`` NULL for every audit. The signing secret is sealed like the seeds."""

    __tablename__ = "flaudit_webhooks"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[str] = mapped_column(String(200))
    audit_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("flaudit_audits.id", ondelete="CASCADE"), nullable=True, index=True
    )
    format: Mapped[str] = mapped_column(String(16))
    link_base: Mapped[str] = mapped_column(Text)
    sealed_secret: Mapped[str] = deferred(mapped_column(Text, nullable=False))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    def __repr__(self) -> str:  # never show the secret
        return f"Webhook(id={self.id!r})"


class WebhookDelivery(Base):
    """One event to deliver to one webhook: ``pending`` until ``delivered`` or ``failed``
    (attempts exhausted). ``payload`` is the JSON body, fixed at the first attempt."""

    __tablename__ = "flaudit_webhook_deliveries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    webhook_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("flaudit_webhooks.id", ondelete="CASCADE"), index=True
    )
    audit_id: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)
    event: Mapped[str] = mapped_column(String(32))
    data: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    payload: Mapped[str | None] = mapped_column(Text, nullable=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    attempts: Mapped[int] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


def queue_webhook_deliveries(
    session: Session, event: str, audit_id: str | None, data: dict
) -> None:
    """Add a pending delivery of ``event`` for every webhook subscribed to it (for this audit
    or for all audits), in ``session``'s transaction."""
    ids = session.scalars(
        select(Webhook.id).where(
            Webhook.events.like(f"%,{event},%"),
            or_(Webhook.audit_id.is_(None), Webhook.audit_id == audit_id),
        )
    ).all()
    now = utcnow()
    if ids:
        session.execute(
            insert(WebhookDelivery),
            [
                {
                    "webhook_id": i,
                    "audit_id": audit_id,
                    "event": event,
                    "data": data,
                    "status": "pending",
                    "attempts": 0,
                    "created_at": now,
                    "next_attempt_at": now,
                }
                for i in ids
            ],
        )


class RecordAudit(Base):
    """A record-level audit fed by a Flower app (issue #37; ``service/record.py``): the model's
    dimension, how many rounds were reported (the optimistic-concurrency counter of a round
    report), the looks so far, the design, and once ended the claim, cause and verdict."""

    __tablename__ = "flaudit_record_audits"

    audit_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("flaudit_audits.id", ondelete="CASCADE"), primary_key=True
    )
    dim: Mapped[int | None] = mapped_column(Integer, nullable=True)
    rounds_reported: Mapped[int] = mapped_column(Integer, default=0)
    last_round: Mapped[int] = mapped_column(Integer, default=0)
    looks: Mapped[list | None] = mapped_column(JSON, nullable=True)
    design: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    claim: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    cause: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    verdict: Mapped[dict | None] = mapped_column(JSON, nullable=True)


class RecordClient(Base):
    """One client of a record-level audit: its key (the Flower node id), its claim so far and
    the running sum of its updates (``<f8``, ``d`` values): what scoring after a restart needs,
    never each raw update."""

    __tablename__ = "flaudit_record_clients"
    __table_args__ = (UniqueConstraint("audit_id", "client_key"),)

    audit_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("flaudit_audits.id", ondelete="CASCADE"), primary_key=True
    )
    client_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    client_key: Mapped[str] = mapped_column(String(200))
    # rounds_trained, steps, planned_steps, noise_scale_sq, shift_scale, noise_multiplier
    # (smallest), sample_rate (largest), rounds: [{round, dp, planned_steps}]
    state: Mapped[dict] = mapped_column(JSON)
    totals: Mapped[bytes | None] = deferred(mapped_column(LargeBinary, nullable=True))


class RecordPlan(Base):
    """The canary plan given to one client for one round: its steps in the seed's stream of
    per-step draws (``offset`` from the client's own start), their number and the Poisson rate.
    The plan itself is regenerated from the seed, never stored."""

    __tablename__ = "flaudit_record_plans"

    audit_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("flaudit_audits.id", ondelete="CASCADE"), primary_key=True
    )
    client_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    round: Mapped[int] = mapped_column(Integer, primary_key=True)
    offset: Mapped[int] = mapped_column(Integer)
    steps: Mapped[int] = mapped_column(Integer)
    sample_rate: Mapped[float] = mapped_column(Float)


class RecordRound(Base):
    """One acknowledged round of a record-level audit: the clients with their DP parameters, the
    look, and every canary's score, projections and claimed signal (``<f8``; NaN: not scored) for
    the evidence."""

    __tablename__ = "flaudit_record_rounds"

    audit_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("flaudit_audits.id", ondelete="CASCADE"), primary_key=True
    )
    round: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    clients: Mapped[list] = mapped_column(JSON)
    look: Mapped[dict] = mapped_column(JSON)
    scores: Mapped[bytes] = deferred(mapped_column(LargeBinary, nullable=False))
    noise_units: Mapped[bytes] = deferred(mapped_column(LargeBinary, nullable=False))
    shift_units: Mapped[bytes] = deferred(mapped_column(LargeBinary, nullable=False))
    # every canary's claimed signal at this look (the exact test's weights; migration 0007)
    signals: Mapped[bytes | None] = deferred(mapped_column(LargeBinary, nullable=True))
