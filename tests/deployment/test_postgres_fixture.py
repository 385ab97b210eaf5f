"""The topology test's PostgreSQL fixture: when no cluster can be started it skips with the
tool's own message (never a bare failure), so a fresh machine's test run is not red."""

from __future__ import annotations

import glob

import pytest

from tests.deployment.test_topology import _run_or_skip, private_cluster


def test_a_failing_initdb_skips_with_its_stderr():
    initdbs = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not initdbs:
        pytest.skip("Debian's postgresql is not installed: no initdb to make fail")
    with pytest.raises(pytest.skip.Exception) as skipped:
        _run_or_skip([initdbs[-1], "-D", "/dev/null/pgdata", "-U", "postgres"], "initdb")
    message = str(skipped.value)
    assert "initdb exited with 1" in message
    assert "initdb: error" in message  # initdb's own stderr, not just the exit status
    assert "FLAUDIT_TEST_POSTGRES_URL" in message


def test_no_postgresql_installed_skips_with_the_reason(monkeypatch):
    monkeypatch.setattr(glob, "glob", lambda pattern: [])
    with pytest.raises(pytest.skip.Exception, match="no PostgreSQL"):
        with private_cluster():
            pass
