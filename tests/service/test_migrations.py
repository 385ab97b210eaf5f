"""Schema migrations (Alembic, service/migrations/): a database an earlier flaudit created (the
last release before Alembic, and the first release, whose tables lack the columns added since)
holding an audit with rounds is upgraded in place when the store opens it: the data survives and
the schema is the models' at the newest revision. A new database is created at that revision, a
database written by a newer flaudit is refused, and instances opening one database together do
not race. SQLite always; PostgreSQL with FLAUDIT_TEST_POSTGRES_URL (a private schema per test).

The old schemas are SQL files in ``schemas/``: the ``create_all`` of the old store's models,
written out once (their header names the commit)."""

from __future__ import annotations

import secrets
import threading
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from flaudit.service import migrations
from flaudit.service.store import Store
from flaudit.service.tables import Base

from .conftest import BACKENDS, CIPHER, POSTGRES_URL

SCHEMAS = Path(__file__).parent / "schemas"
SEED = 2**127 + 12345
AUDIT_ID = "old-audit-0001"
MAX_COSINES = np.array([0.25, -0.5, 0.125])


@pytest.fixture(params=BACKENDS)
def database(request, tmp_path):
    """(engine on an empty database, the URL and schema a Store opens it with); PostgreSQL: a
    fresh schema, dropped afterwards."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'old.db'}"
        engine = sa.create_engine(url)
        yield engine, url, None
        engine.dispose()
        return
    schema = "flaudit_migr_" + secrets.token_hex(6)
    engine = sa.create_engine(POSTGRES_URL, connect_args={"options": f"-csearch_path={schema}"})
    with engine.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    yield engine, POSTGRES_URL, schema
    with engine.begin() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    engine.dispose()


def _create_old_tables(engine: sa.Engine, release: str) -> None:
    ddl = (SCHEMAS / f"{release}_{engine.dialect.name}.sql").read_text()
    ddl = "\n".join(line for line in ddl.splitlines() if not line.startswith("--"))
    with engine.begin() as conn:
        for statement in filter(str.strip, ddl.split(";")):
            conn.exec_driver_sql(statement)


def _insert_old_audit(engine: sa.Engine, release: str) -> None:
    """A succeeded audit with two rounds, as the old store wrote it (the first release stored
    the seed in plain decimal; the last one encrypted)."""
    when = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
    with engine.begin() as conn:
        meta = sa.MetaData()
        audits = sa.Table("flaudit_audits", meta, autoload_with=conn)
        rounds = sa.Table("flaudit_rounds", meta, autoload_with=conn)
        conn.execute(
            audits.insert(),
            {
                "id": AUDIT_ID,
                "name": "before the upgrade",
                "status": "succeeded",
                "reason": None,
                "spec": {"name": "old", "num_rounds": 2, "noise_multiplier": 0.5},
                "canary_seed": str(SEED) if release == "first" else CIPHER.seal(SEED),
                "run_token_hash": None,
                "created_at": when,
                "started_at": when,
                "finished_at": when,
                "updated_at": when,
                "last_round_at": when,
                "dim": 400,
                "rounds_stored": 2,
                "has_final": True,
                "max_cosines": MAX_COSINES.astype("<f8").tobytes(),
                "estimates": [{"name": "eps_est", "epsilon": 1.5}],
                "headline_epsilon": 1.5,
            },
        )
        for t in (1, 2):
            conn.execute(
                rounds.insert(),
                {
                    "audit_id": AUDIT_ID,
                    "round": t,
                    "clip_norm": 1.0,
                    "cohort_size": 6,
                    "num_canaries_inserted": 1,
                    "num_failures": 0,
                    "noise_stddev": 0.5,
                    "estimates": [{"round": t}],
                    "received_at": when,
                },
            )


def _schema_differences(engine: sa.Engine) -> list:
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "version_table": migrations.VERSION_TABLE}
        )
        return compare_metadata(context, Base.metadata)


def _revision(engine: sa.Engine) -> str | None:
    with engine.connect() as conn:
        return migrations.current_revision(conn)


def test_a_new_database_is_created_at_the_newest_revision_as_the_models_say(database):
    engine, url, schema = database
    store = Store(url, schema=schema, cipher=CIPHER)
    try:
        assert store.revision == migrations.head_revision() == _revision(engine)
        assert _schema_differences(engine) == []
        again = Store(url, schema=schema, cipher=CIPHER)  # at the newest revision: nothing runs
        assert again.revision == store.revision
        again.dispose()
    finally:
        store.dispose()


@pytest.mark.parametrize("release", ["released", "first"])
def test_a_database_of_an_earlier_release_is_upgraded_in_place(database, release):
    engine, url, schema = database
    _create_old_tables(engine, release)
    _insert_old_audit(engine, release)
    assert _revision(engine) is None  # created before Alembic: no version table
    store = Store(url, schema=schema, cipher=CIPHER)
    try:
        assert store.revision == migrations.head_revision() == _revision(engine)
        differences = _schema_differences(engine)
        if release == "first" and engine.dialect.name == "sqlite":
            # SQLite neither enforces nor (without copying the table) changes a VARCHAR(48):
            # the first release's seed column keeps its declared type and holds long seeds
            assert [(d[0][0], d[0][3]) for d in differences] == [("modify_type", "canary_seed")], (
                differences
            )
        else:
            assert differences == []
        audit = store.get_audit(AUDIT_ID)
        assert (audit.name, audit.status, audit.rounds_stored, audit.has_final) == (
            "before the upgrade",
            "succeeded",
            2,
            True,
        )
        assert audit.spec["noise_multiplier"] == 0.5 and audit.headline_epsilon == 1.5
        assert audit.estimates == [{"name": "eps_est", "epsilon": 1.5}]
        assert audit.gaps is None and audit.flower_run_id is None  # the columns added since
        assert [
            (r.round, r.clip_norm, r.estimates, r.weight_factor)
            for r in store.list_rounds(AUDIT_ID)
        ] == [(1, 1.0, [{"round": 1}], None), (2, 1.0, [{"round": 2}], None)]
        assert store.canary_seed(AUDIT_ID) == SEED  # a plain seed was encrypted on opening
        with engine.connect() as conn:
            stored = conn.exec_driver_sql("SELECT canary_seed FROM flaudit_audits").scalar()
        assert stored.startswith("fernet:")
        np.testing.assert_array_equal(store.cosine_arrays(AUDIT_ID)["max_cosines"], MAX_COSINES)
        # the upgraded tables take new audits, rounds and the columns added since
        new = store.create_audit(name="after", spec={"engine": "deployment"}, canary_seed=7)
        assert store.mark_running(new.id, run_token="t" * 16, owner="host:1:x")
        assert store.set_flower_run(new.id, 2**64 - 1)
        assert store.get_audit(new.id).flower_run_id == str(2**64 - 1)
        assert store.delete_audit(AUDIT_ID) and store.list_rounds(AUDIT_ID) == []
    finally:
        store.dispose()


def test_a_database_written_by_a_newer_flaudit_is_refused(database):
    engine, url, schema = database
    Store(url, schema=schema).dispose()
    with engine.begin() as conn:
        conn.exec_driver_sql(f"UPDATE {migrations.VERSION_TABLE} SET version_num = 'ffff'")
    with pytest.raises(migrations.SchemaError, match="'ffff'"):
        Store(url, schema=schema)


def test_instances_opening_one_new_database_together_migrate_it_once(database):
    engine, url, schema = database
    barrier = threading.Barrier(4)
    opened, errors = [], []

    def open_store():
        barrier.wait()
        try:
            opened.append(Store(url, schema=schema))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=open_store) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    for store in opened:
        store.dispose()
    assert errors == [] and len(opened) == 4
    assert _revision(engine) == migrations.head_revision()
    assert _schema_differences(engine) == []
