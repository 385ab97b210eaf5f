"""Schema migrations of the store with Alembic, run when the store opens a database.

:func:`upgrade` brings a database to the newest revision in ``versions/`` (configured in code:
no ``alembic.ini``, no ``alembic`` command for users). What it finds decides what runs:

* an empty database: every revision, from the baseline ``0001`` (which creates the tables);
* a database an earlier flaudit created before Alembic (its tables, no version table): the
  baseline ``0001`` recognises the tables and completes them instead of creating them (the
  columns later versions added, ``canary_seed`` widened to ``TEXT`` on PostgreSQL: what the old
  start-up ``ALTER TABLE … ADD COLUMN`` did), then the later revisions run. No manual ``stamp``;
* a database under Alembic: the revisions after its own.

The revision is recorded in the table ``flaudit_alembic_version`` (not Alembic's default name, so
flaudit can share a database or schema with another application's Alembic). The whole upgrade is
one transaction and one migrator at a time: PostgreSQL takes an advisory transaction lock, SQLite
starts with ``BEGIN IMMEDIATE`` on a connection of its own; several instances starting together
on one database wait for each other, and the ones after the first find it at the newest revision.
A database at a revision this code does not know (written by a newer flaudit) is refused with
:class:`SchemaError`: an older service must not run on a newer schema.

A new revision: add the model to ``service/tables.py`` and a file to ``versions/`` whose
``down_revision`` is the current head (``0004`` now). Alembic can write a draft from the models::

    from alembic import command
    from flaudit.service.migrations import alembic_config
    with engine.connect() as conn:  # a database at the current head
        command.revision(alembic_config(conn), message="...", rev_id="0004", autogenerate=True)
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import NullPool

from ..tables import Base

__all__ = [
    "VERSION_TABLE",
    "SchemaError",
    "alembic_config",
    "current_revision",
    "head_revision",
    "upgrade",
]

#: Where Alembic records the database's revision.
VERSION_TABLE = "flaudit_alembic_version"
#: ``pg_advisory_xact_lock`` key held while one instance migrates ("flaudit" in ASCII).
_LOCK_KEY = 0x666C6175646974
_HERE = Path(__file__).resolve().parent


class SchemaError(RuntimeError):
    """The database cannot be brought to this code's schema (a newer flaudit wrote it)."""


def alembic_config(connection: Connection) -> Config:
    """Alembic's configuration for ``connection``: the scripts shipped in this package, the
    version table, the models (for ``autogenerate``); ``env.py`` reads them."""
    config = Config()
    config.set_main_option("script_location", str(_HERE).replace("%", "%%"))
    config.attributes["connection"] = connection
    config.attributes["version_table"] = VERSION_TABLE
    config.attributes["target_metadata"] = Base.metadata
    return config


def head_revision() -> str:
    """The newest revision this code knows."""
    script = ScriptDirectory(str(_HERE))
    return script.get_current_head()


def current_revision(connection: Connection) -> str | None:
    """The revision recorded in the database (None: none, empty or created before Alembic)."""
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def upgrade(engine: Engine) -> str:
    """Bring the database of ``engine`` to the newest revision (see the module's docstring);
    returns that revision."""
    database = engine.url.database
    if engine.dialect.name == "sqlite" and database and database != ":memory:":
        # pysqlite opens no transaction before DDL: a connection of our own that does, and
        # takes the write lock at once, so two instances never migrate the same file together
        migrator = create_engine(
            engine.url, poolclass=NullPool, connect_args={"check_same_thread": False, "timeout": 30}
        )
        event.listen(migrator, "connect", _no_implicit_transactions)
        event.listen(migrator, "begin", _begin_immediate)
        try:
            return _upgrade(migrator)
        finally:
            migrator.dispose()
    return _upgrade(engine)


def _upgrade(engine: Engine) -> str:
    head = head_revision()
    with engine.connect() as conn, conn.begin():
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_LOCK_KEY})")
        current = current_revision(conn)
        if current == head:
            return head
        config = alembic_config(conn)
        if current is not None:
            try:
                ScriptDirectory.from_config(config).get_revision(current)
            except CommandError as error:
                raise SchemaError(
                    f"the database is at schema revision {current!r}, which this flaudit does "
                    f"not know (its newest is {head!r}): a newer flaudit upgraded it; run that "
                    "version"
                ) from error
        command.upgrade(config, "head")
    return head


def _no_implicit_transactions(dbapi_connection, _record) -> None:
    dbapi_connection.isolation_level = None


def _begin_immediate(connection: Connection) -> None:
    connection.exec_driver_sql("BEGIN IMMEDIATE")
