"""Record when a running audit changed owner (issue #41, replicas behind one URL).

Several service replicas share one database; a running audit's owner lease (``owner_id``,
``owner_heartbeat_at``) names the replica that holds its in-memory state. When another replica
takes the audit over (the owner's lease expired, or the proxy now sends the audit's requests to
it), ``flaudit_audits.owner_changes`` keeps what happened, so the audit names the interruption:
``[{at, from, to, after_round, last_heartbeat_at, why}]``. Additive only: older rows keep NULL."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("flaudit_audits", sa.Column("owner_changes", sa.JSON, nullable=True))


def downgrade() -> None:
    op.drop_column("flaudit_audits", "owner_changes")
