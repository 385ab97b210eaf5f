"""Add the record-level audits fed by a Flower app (issue #37, the service's transport).

``flaudit_record_audits`` (one row per record-level audit: dimension, rounds reported, looks,
design, claim, cause, verdict), ``flaudit_record_clients`` (per client: its Flower node id, its
claim so far, the running sum of its updates), ``flaudit_record_plans`` (which steps of the
seed's stream each client-round's canary plan used) and ``flaudit_record_rounds`` (each
acknowledged round's look and per-canary scores). Models in ``service/tables.py``. Additive only."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_TIME = sa.DateTime(timezone=True)


def _audit_id() -> sa.Column:
    return sa.Column(
        "audit_id",
        sa.String(32),
        sa.ForeignKey("flaudit_audits.id", ondelete="CASCADE"),
        primary_key=True,
    )


def upgrade() -> None:
    op.create_table(
        "flaudit_record_audits",
        _audit_id(),
        sa.Column("dim", sa.Integer, nullable=True),
        sa.Column("rounds_reported", sa.Integer, nullable=False),
        sa.Column("last_round", sa.Integer, nullable=False),
        sa.Column("looks", sa.JSON, nullable=True),
        sa.Column("design", sa.JSON, nullable=True),
        sa.Column("claim", sa.JSON, nullable=True),
        sa.Column("cause", sa.JSON, nullable=True),
        sa.Column("verdict", sa.JSON, nullable=True),
    )
    op.create_table(
        "flaudit_record_clients",
        _audit_id(),
        sa.Column("client_index", sa.Integer, primary_key=True),
        sa.Column("client_key", sa.String(200), nullable=False),
        sa.Column("state", sa.JSON, nullable=False),
        sa.Column("totals", sa.LargeBinary, nullable=True),
        sa.UniqueConstraint("audit_id", "client_key"),
    )
    op.create_table(
        "flaudit_record_plans",
        _audit_id(),
        sa.Column("client_index", sa.Integer, primary_key=True),
        sa.Column("round", sa.Integer, primary_key=True),
        sa.Column("offset", sa.Integer, nullable=False),
        sa.Column("steps", sa.Integer, nullable=False),
        sa.Column("sample_rate", sa.Float, nullable=False),
    )
    op.create_table(
        "flaudit_record_rounds",
        _audit_id(),
        sa.Column("round", sa.Integer, primary_key=True),
        sa.Column("created_at", _TIME, nullable=False),
        sa.Column("clients", sa.JSON, nullable=False),
        sa.Column("look", sa.JSON, nullable=False),
        sa.Column("scores", sa.LargeBinary, nullable=False),
        sa.Column("noise_units", sa.LargeBinary, nullable=False),
        sa.Column("shift_units", sa.LargeBinary, nullable=False),
    )


def downgrade() -> None:
    for table in (
        "flaudit_record_rounds",
        "flaudit_record_plans",
        "flaudit_record_clients",
        "flaudit_record_audits",
    ):
        op.drop_table(table)
