"""Pydantic schemas of the evidence routes (``/audits/{id}/evidence``, ``/audits/{id}/commitment``,
``/keys``); they document and validate what those routes return (docs/evidence.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CommitmentOut", "EvidenceOut", "KeyOut", "KeyList", "SignatureOut"]


class CommitmentOut(BaseModel):
    """The commitment to an audit's canary seed, published at creation."""

    scheme: str = Field(
        description="How the commitment is computed.",
        examples=["sha256(salt || seed as 16 bytes big-endian), hex"],
    )
    commitment: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="Hex SHA-256; null for an audit created before commitments existed.",
    )
    committed_at: datetime | None = Field(None, description="When the commitment was made.")
    salt: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{32}$",
        description="Revealed with the seed only: an ended audit whose spec sets "
        "reveal_seed, in its evidence bundle.",
    )
    seed: str | None = Field(
        None,
        pattern=r"^[0-9]{1,40}$",
        description="The canary seed in decimal: only in the evidence bundle of an ended audit "
        "whose spec sets reveal_seed; null everywhere else.",
    )


class SignatureOut(BaseModel):
    algorithm: str = Field(examples=["Ed25519"])
    key_id: str = Field(pattern=r"^[0-9a-f]{16}$", description="Listed at GET /keys.")
    public_key: str = Field(description="Raw Ed25519 public key, base64.")
    canonicalization: str = Field(description="How the signed bytes are formed.")
    digest: str = Field(
        pattern=r"^sha256:[0-9a-f]{64}$",
        description="SHA-256 of the canonical bytes (the evidence hash).",
    )
    value: str = Field(description="The Ed25519 signature of the canonical bytes, base64.")


class EvidenceOut(BaseModel):
    """A signed evidence bundle (format flaudit-evidence/1; docs/evidence.md). Check it with
    `flaudit verify FILE --url <service>`."""

    model_config = ConfigDict(extra="forbid")

    format: str = Field(examples=["flaudit-evidence/1"])
    audit: dict[str, Any] = Field(description="id, name, status, reason.")
    spec: dict[str, Any] = Field(description="The AuditSpec that ran (with the declared claim).")
    claim: dict[str, Any] | None = Field(
        description="The alarming claim (mu, epsilon, delta, description) and read_from: how "
        "it was read (the spec, or the app's Flower strategy)."
    )
    statistics: dict[str, Any] = Field(
        description="Every number the estimates are computed from: per-canary cosines (as "
        "/cosines gives them) and seen labels, the known-rounds sums, the rounds' metadata "
        "(weight factors), gaps, dim and the scale's degrees of freedom."
    )
    alarm: dict[str, Any] | None = Field(description="The first error alarm (null: none fired).")
    verdict: dict[str, Any] = Field(description="As GET /audits/{id} gives it.")
    estimates: list[dict[str, Any]] = Field(description="Every estimate, analytic included.")
    diagnostics: list[dict[str, Any]]
    canary_seed: CommitmentOut
    versions: dict[str, str | None] = Field(
        description="flaudit, numpy, scipy, flwr, dp-accounting, cryptography, python."
    )
    times: dict[str, str | None] = Field(description="created_at, started_at, finished_at.")
    signature: SignatureOut


class RecordEvidenceOut(BaseModel):
    """A signed evidence bundle of a record-level audit fed by a Flower app (``"level":
    "record"``, issue #37): every look's per-canary scores and projections, the clients' claims
    at each look, the seen set (the audit has ended), design, claim, looks, cause, verdict."""

    model_config = ConfigDict(extra="forbid")

    format: str
    level: Literal["record"]
    audit: dict[str, Any]
    spec: dict[str, Any]
    statistics: dict[str, Any]
    design: dict[str, Any] | None
    claim: dict[str, Any] | None
    looks: list[dict[str, Any]]
    cause: dict[str, Any] | None
    verdict: dict[str, Any] | None
    canary_seed: CommitmentOut
    versions: dict[str, str | None]
    times: dict[str, str | None]
    signature: SignatureOut


class KeyOut(BaseModel):
    key_id: str = Field(pattern=r"^[0-9a-f]{16}$", examples=["3f1c0a9be27d4410"])
    algorithm: str = Field("Ed25519", examples=["Ed25519"])
    public_key: str = Field(description="Raw Ed25519 public key, base64.")
    created_at: datetime
    retired_at: datetime | None = Field(
        None,
        description="Null for the active key; a retired key signs nothing new but "
        "its bundles still verify.",
    )


class KeyList(BaseModel):
    keys: list[KeyOut] = Field(description="Every signing key, oldest first.")
