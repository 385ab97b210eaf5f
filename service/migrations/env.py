"""Alembic's environment for the store's migrations: run online on the connection that
:func:`flaudit.service.migrations.upgrade` (or :func:`~flaudit.service.migrations.alembic_config`)
put in the configuration, inside that connection's transaction. Loaded by Alembic from this
folder by path, never imported."""

from __future__ import annotations

from alembic import context

_config = context.config
_connection = _config.attributes["connection"]
context.configure(
    connection=_connection,
    target_metadata=_config.attributes.get("target_metadata"),
    version_table=_config.attributes["version_table"],
    render_as_batch=True,  # SQLite alters a column by copying its table
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
