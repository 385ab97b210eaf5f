"""Store each record-level round's claimed signals (issue #37, the exact claim test).

``flaudit_record_rounds.signals``: every canary's claimed signal at the round's look (``<f8``),
the weights of the exact record-level claim test, so that ``flaudit verify`` recomputes the looks
of a record-level audit the service ran. Additive only: rows of older rounds keep NULL."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("flaudit_record_rounds", sa.Column("signals", sa.LargeBinary, nullable=True))


def downgrade() -> None:
    op.drop_column("flaudit_record_rounds", "signals")
