"""Add the clip norm each round's noise was calibrated for (issue #38).

Flower's adaptive-clipping wrappers add the noise for the clip norm after its geometric update,
not for the norm the round's updates were clipped to: the round row keeps both
(``flaudit_rounds.noise_clip_norm`` beside ``clip_norm``) and the audit the smallest ratio
(``flaudit_audits.min_noise_clip_factor``). Additive only: older rows keep NULL."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("flaudit_rounds", sa.Column("noise_clip_norm", sa.Float, nullable=True))
    op.add_column("flaudit_audits", sa.Column("min_noise_clip_factor", sa.Float, nullable=True))


def downgrade() -> None:
    op.drop_column("flaudit_audits", "min_noise_clip_factor")
    op.drop_column("flaudit_rounds", "noise_clip_norm")
