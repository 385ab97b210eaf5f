"""Add the canaries' largest weight and the evidence tables (commitments, signing keys).

Weighted FedAvg and evidence bundles (issues #28 and #30): the audit's heaviest influence a
canary carried (``flaudit_audits.max_canary_weight_factor``), and the evidence tables -- the seed
commitments, the service's signing keys and the statistics of the look where the alarm first
fired (models in ``service/evidence_store.py``). Additive only: older rows keep NULL."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("flaudit_audits", sa.Column("max_canary_weight_factor", sa.Float, nullable=True))
    op.create_table(
        "flaudit_seed_commitments",
        sa.Column(
            "audit_id",
            sa.String(32),
            sa.ForeignKey("flaudit_audits.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("commitment", sa.String(64), nullable=False),
        sa.Column("salt", sa.String(64), nullable=False),
        sa.Column("created_at", _TIME, nullable=False),
    )
    op.create_table(
        "flaudit_signing_keys",
        sa.Column("key_id", sa.String(32), primary_key=True),
        sa.Column("public_key", sa.String(64), nullable=False),
        sa.Column("sealed_private_key", sa.Text, nullable=False),
        sa.Column("created_at", _TIME, nullable=False),
        sa.Column("retired_at", _TIME, nullable=True),
    )
    op.create_table(
        "flaudit_alarm_statistics",
        sa.Column(
            "audit_id",
            sa.String(32),
            sa.ForeignKey("flaudit_audits.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("round", sa.Integer, nullable=False),
        sa.Column("max_cosines", sa.LargeBinary, nullable=False),
        sa.Column("known_rounds_state", sa.LargeBinary, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("flaudit_alarm_statistics")
    op.drop_table("flaudit_signing_keys")
    op.drop_table("flaudit_seed_commitments")
    op.drop_column("flaudit_audits", "max_canary_weight_factor")
