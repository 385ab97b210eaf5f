"""Store tables of the evidence bundles (issue #30): the canary-seed commitments and the service's
Ed25519 signing keys. New tables, not new columns of the audit table; Alembic revision 0002
creates them (``service/migrations/versions/0002_weighting_and_evidence.py``).

The signing key's private half is sealed at rest like the canary seeds
(:class:`~flaudit.service.sealing.SeedCipher`, the operator's secret key): the database
alone does not let anyone sign. Rotation (:func:`rotate_signing_key`) retires the active key and
keeps its public half, so bundles it signed still verify.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from sqlalchemy import DateTime, ForeignKey, Integer, LargeBinary, String, Text, select, update
from sqlalchemy.orm import Mapped, mapped_column

from ..auditor.claims.evidence import seed_commitment
from .store import Store
from .tables import (
    Base,
    array_to_bytes,
    bytes_to_array,
    known_rounds_from_bytes,
    known_rounds_to_bytes,
    utcnow,
)

__all__ = [
    "AlarmStatistics",
    "KeyInfo",
    "SeedCommitment",
    "SigningKey",
    "get_alarm_statistics",
    "save_alarm_statistics",
    "active_signing_key",
    "commit_seed",
    "ensure_tables",
    "get_commitment",
    "list_signing_keys",
    "public_key_b64",
    "rotate_signing_key",
    "sign",
]

#: A 32-byte Ed25519 private key sealed with the seed cipher (which seals integers).
_PLAIN_PREFIX = "plain:"


class SeedCommitment(Base):
    """The commitment to an audit's canary seed, published at creation; the salt is kept plain
    (it hides nothing without the 128-bit seed)."""

    __tablename__ = "flaudit_seed_commitments"

    audit_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("flaudit_audits.id", ondelete="CASCADE"), primary_key=True
    )
    commitment: Mapped[str] = mapped_column(String(64))
    salt: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class SigningKey(Base):
    """One Ed25519 key of the service: ``retired_at`` null for the active one."""

    __tablename__ = "flaudit_signing_keys"

    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    public_key: Mapped[str] = mapped_column(String(64))
    sealed_private_key: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    retired_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)

    def __repr__(self) -> str:  # never show the sealed key
        return f"SigningKey(key_id={self.key_id!r}, retired={self.retired_at is not None})"


class AlarmStatistics(Base):
    """The statistics of the look at which an audit's error alarm first fired (round t < T): the
    running max cosines and the known-rounds state after round t, so that ``flaudit verify``
    recomputes that look's claim tests (the audit row keeps only the latest of both)."""

    __tablename__ = "flaudit_alarm_statistics"

    audit_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("flaudit_audits.id", ondelete="CASCADE"), primary_key=True
    )
    round: Mapped[int] = mapped_column(Integer)
    max_cosines: Mapped[bytes] = mapped_column(LargeBinary)
    known_rounds_state: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)


@dataclass(frozen=True)
class KeyInfo:
    key_id: str
    public_key: str
    created_at: datetime
    retired_at: datetime | None


def ensure_tables(store: Store) -> None:
    """The evidence tables exist once the store is open: Alembic revision 0002 creates them
    (``service/migrations/versions/``). Kept for the callers that used to create them lazily."""


def commit_seed(store: Store, audit_id: str, seed: int) -> str:
    """Store and return the commitment to ``seed`` for a new audit."""
    salt = secrets.token_bytes(16)
    commitment = seed_commitment(seed, salt)
    ensure_tables(store)
    with store.session() as s, s.begin():
        s.add(
            SeedCommitment(
                audit_id=audit_id, commitment=commitment, salt=salt.hex(), created_at=utcnow()
            )
        )
    return commitment


def get_commitment(store: Store, audit_id: str) -> SeedCommitment | None:
    ensure_tables(store)
    with store.session() as s:
        return s.get(SeedCommitment, audit_id)


def public_key_b64(private: Ed25519PrivateKey) -> str:
    raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


def key_id_of(public_b64: str) -> str:
    """The key id: the first 16 hex digits of SHA-256 of the raw public key."""
    return hashlib.sha256(base64.b64decode(public_b64)).hexdigest()[:16]


def _seal(store: Store, private: Ed25519PrivateKey) -> str:
    raw = private.private_bytes_raw()
    if store.cipher is None:
        return _PLAIN_PREFIX + raw.hex()
    return store.cipher.seal(int.from_bytes(raw, "big"))


def _open(store: Store, sealed: str) -> Ed25519PrivateKey:
    if sealed.startswith(_PLAIN_PREFIX):
        return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(sealed[len(_PLAIN_PREFIX) :]))
    if store.cipher is None:
        raise ValueError("the signing key is sealed and no secret key is configured")
    return Ed25519PrivateKey.from_private_bytes(store.cipher.open(sealed).to_bytes(32, "big"))


def _new_key(store: Store) -> SigningKey:
    private = Ed25519PrivateKey.generate()
    public = public_key_b64(private)
    return SigningKey(
        key_id=key_id_of(public),
        public_key=public,
        sealed_private_key=_seal(store, private),
        created_at=utcnow(),
    )


def active_signing_key(store: Store) -> tuple[str, Ed25519PrivateKey]:
    """The active key's id and private key, made on first use."""
    ensure_tables(store)
    with store.session() as s, s.begin():
        row = s.scalars(
            select(SigningKey)
            .where(SigningKey.retired_at.is_(None))
            .order_by(SigningKey.created_at.desc())
        ).first()
        if row is None:
            row = _new_key(store)
            s.add(row)
        key_id, sealed = row.key_id, row.sealed_private_key
    return key_id, _open(store, sealed)


def rotate_signing_key(store: Store) -> tuple[str, list[str]]:
    """Retire every active key and make a new one; returns (new key id, retired key ids)."""
    ensure_tables(store)
    now = utcnow()
    with store.session() as s, s.begin():
        retired = list(s.scalars(select(SigningKey.key_id).where(SigningKey.retired_at.is_(None))))
        s.execute(update(SigningKey).where(SigningKey.retired_at.is_(None)).values(retired_at=now))
        row = _new_key(store)
        s.add(row)
        key_id = row.key_id
    return key_id, retired


def list_signing_keys(store: Store) -> list[KeyInfo]:
    """Every key, active and retired, oldest first (public halves only)."""
    ensure_tables(store)
    with store.session() as s:
        rows = s.scalars(select(SigningKey).order_by(SigningKey.created_at)).all()
        return [KeyInfo(r.key_id, r.public_key, r.created_at, r.retired_at) for r in rows]


def sign(store: Store, payload: bytes) -> tuple[str, str, str]:
    """Sign ``payload`` with the active key: (key id, public key, signature), base64."""
    key_id, private = active_signing_key(store)
    signature = base64.b64encode(private.sign(payload)).decode("ascii")
    return key_id, public_key_b64(private), signature


def save_alarm_statistics(
    store: Store, audit_id: str, *, round: int, max_cosines, known_rounds=None
) -> None:
    """Keep the statistics of the look where the alarm first fired (once per audit)."""
    ensure_tables(store)
    with store.session() as s, s.begin():
        if s.get(AlarmStatistics, audit_id) is None:
            s.add(
                AlarmStatistics(
                    audit_id=audit_id,
                    round=int(round),
                    max_cosines=array_to_bytes(max_cosines),
                    known_rounds_state=None
                    if known_rounds is None
                    else known_rounds_to_bytes(known_rounds),
                )
            )


def get_alarm_statistics(store: Store, audit_id: str) -> dict | None:
    """``{"round", "max_cosines", "known_rounds"}`` of the alarm's look, or None."""
    ensure_tables(store)
    with store.session() as s:
        row = s.get(AlarmStatistics, audit_id)
        if row is None:
            return None
        max_cosines = bytes_to_array(row.max_cosines)
        known = known_rounds_from_bytes(
            row.known_rounds_state, row.round, num_canaries=max_cosines.size
        )
        return {"round": row.round, "max_cosines": max_cosines, "known_rounds": known}
