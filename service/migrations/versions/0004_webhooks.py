"""Add the alert webhooks: subscriptions and their deliveries (issue #41).

``flaudit_webhooks`` holds the subscriptions (``POST /webhooks``; the signing secret sealed like
the canary seeds), ``flaudit_webhook_deliveries`` every event to deliver with its status,
attempts, last error and next attempt (models in ``service/tables.py``). Additive only."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "flaudit_webhooks",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("events", sa.String(200), nullable=False),
        sa.Column(
            "audit_id",
            sa.String(32),
            sa.ForeignKey("flaudit_audits.id", ondelete="CASCADE"),
            nullable=True,
        ),
        sa.Column("format", sa.String(16), nullable=False),
        sa.Column("link_base", sa.Text, nullable=False),
        sa.Column("sealed_secret", sa.Text, nullable=False),
        sa.Column("created_at", _TIME, nullable=False),
    )
    op.create_index("ix_flaudit_webhooks_audit_id", "flaudit_webhooks", ["audit_id"])
    op.create_table(
        "flaudit_webhook_deliveries",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "webhook_id",
            sa.String(32),
            sa.ForeignKey("flaudit_webhooks.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("audit_id", sa.String(32), nullable=True),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("data", sa.JSON, nullable=True),
        sa.Column("payload", sa.Text, nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("created_at", _TIME, nullable=False),
        sa.Column("next_attempt_at", _TIME, nullable=False),
        sa.Column("delivered_at", _TIME, nullable=True),
    )
    for column in ("webhook_id", "audit_id", "status"):
        op.create_index(
            f"ix_flaudit_webhook_deliveries_{column}", "flaudit_webhook_deliveries", [column]
        )


def downgrade() -> None:
    op.drop_table("flaudit_webhook_deliveries")
    op.drop_table("flaudit_webhooks")
