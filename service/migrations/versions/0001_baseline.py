"""Create the audit and round tables, or complete those an earlier flaudit made.

The baseline is the schema the last release before Alembic left (commit fe90206: its
``create_all`` plus every column its start-up ``_add_columns`` added).

On an empty database this creates ``flaudit_audits`` and ``flaudit_rounds``. On a database an
earlier flaudit created (the tables exist, no version table: a first-release schema, or a later
one) it completes them the way ``_add_columns`` did: each missing column is added, nullable and
without a default; a missing index is created; ``canary_seed`` of the first release
(``VARCHAR(48)``) becomes ``TEXT`` on PostgreSQL (an encrypted seed is ~150 characters; SQLite does
not enforce lengths). The columns are written out here, frozen: later changes to the models in
``service/tables.py`` go in later revisions.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_TIME = sa.DateTime(timezone=True)


def _audit_columns() -> list[sa.Column]:
    return [
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("canary_seed", sa.Text, nullable=True),
        sa.Column("run_token_hash", sa.String(64), nullable=True),
        sa.Column("owner_id", sa.String(64), nullable=True),
        sa.Column("owner_heartbeat_at", _TIME, nullable=True),
        sa.Column("created_at", _TIME, nullable=False),
        sa.Column("started_at", _TIME, nullable=True),
        sa.Column("finished_at", _TIME, nullable=True),
        sa.Column("updated_at", _TIME, nullable=False),
        sa.Column("last_round_at", _TIME, nullable=True),
        sa.Column("dim", sa.Integer, nullable=True),
        sa.Column("rounds_stored", sa.Integer, nullable=False),
        sa.Column("has_final", sa.Boolean, nullable=False),
        sa.Column("initial_model", sa.LargeBinary, nullable=True),
        sa.Column("max_cosines", sa.LargeBinary, nullable=True),
        sa.Column("last_cosines", sa.LargeBinary, nullable=True),
        sa.Column("final_cosines", sa.LargeBinary, nullable=True),
        sa.Column("final_model_cosines", sa.LargeBinary, nullable=True),
        sa.Column("known_rounds_state", sa.LargeBinary, nullable=True),
        sa.Column("analytic", sa.JSON, nullable=True),
        sa.Column("estimates", sa.JSON, nullable=True),
        sa.Column("diagnostics", sa.JSON, nullable=True),
        sa.Column("histograms", sa.JSON, nullable=True),
        sa.Column("alerts", sa.JSON, nullable=True),
        sa.Column("metrics", sa.JSON, nullable=True),
        sa.Column("headline_epsilon", sa.Float, nullable=True),
        sa.Column("run_id", sa.String(64), nullable=True),
        sa.Column("last_contact_at", _TIME, nullable=True),
        sa.Column("gaps", sa.JSON, nullable=True),
        sa.Column("flower_run_id", sa.String(32), nullable=True),
        sa.Column("max_weight_factor", sa.Float, nullable=True),
    ]


def _round_columns() -> list[sa.Column]:
    return [
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "audit_id",
            sa.String(32),
            sa.ForeignKey("flaudit_audits.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("round", sa.Integer, nullable=False),
        sa.Column("clip_norm", sa.Float, nullable=False),
        sa.Column("cohort_size", sa.Integer, nullable=False),
        sa.Column("num_canaries_inserted", sa.Integer, nullable=False),
        sa.Column("num_failures", sa.Integer, nullable=False),
        sa.Column("clipped_fraction", sa.Float, nullable=True),
        sa.Column("noise_stddev", sa.Float, nullable=True),
        sa.Column("train_loss", sa.Float, nullable=True),
        sa.Column("accuracy", sa.Float, nullable=True),
        sa.Column("delta_norm", sa.Float, nullable=True),
        sa.Column("weight_factor", sa.Float, nullable=True),
        sa.Column("participants", sa.LargeBinary, nullable=True),
        sa.Column("estimates", sa.JSON, nullable=True),
        sa.Column("received_at", _TIME, nullable=False),
    ]


#: (table, its columns, its extra constraints, its indexes: name -> column)
_TABLES = (
    ("flaudit_audits", _audit_columns, (), {"ix_flaudit_audits_status": "status"}),
    (
        "flaudit_rounds",
        _round_columns,
        (lambda: sa.UniqueConstraint("audit_id", "round", name="uq_flaudit_rounds_audit_round"),),
        {"ix_flaudit_rounds_audit_id": "audit_id"},
    ),
)


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    for name, columns, constraints, indexes in _TABLES:
        if not inspector.has_table(name):
            op.create_table(name, *columns(), *(make() for make in constraints))
            for index, column in indexes.items():
                op.create_index(index, name, [column])
            continue
        present = {column["name"]: column for column in inspector.get_columns(name)}
        for column in columns():
            if column.name not in present:  # as _add_columns did: nullable, no default
                op.add_column(name, sa.Column(column.name, column.type, nullable=True))
        have = {index["name"] for index in inspector.get_indexes(name)}
        for index, column in indexes.items():
            if index not in have:
                op.create_index(index, name, [column])
        seed = present.get("canary_seed")
        if (
            seed is not None
            and op.get_bind().dialect.name == "postgresql"
            and getattr(seed["type"], "length", None) is not None
        ):
            op.alter_column(name, "canary_seed", type_=sa.Text, existing_nullable=True)


def downgrade() -> None:
    op.drop_table("flaudit_rounds")
    op.drop_table("flaudit_audits")
