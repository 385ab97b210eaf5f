"""tests/every_test_runs.py: schemathesis's cases each run under pytest-xdist, and a run in which
a collected test never reports fails naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.processes import run_pytest

# Three API operations, so three cases from one @schema.parametrize() function, and a test that
# is skipped and one expected to fail (both report, so neither counts as "never ran").
MODULE = """
import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import settings

app = FastAPI()


@app.get("/a")
def get_a(n: int = 0):
    return {"n": n}


@app.post("/b")
def post_b(n: int):
    return {"n": n}


@app.get("/c/{name}")
def get_c(name: str):
    return {"name": name}


schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@schema.parametrize()
@settings(max_examples=3, deadline=None)
def test_api(case):
    assert case.call().status_code < 500


@pytest.mark.skip(reason="a reported skip")
def test_skipped():
    pass


@pytest.mark.xfail(reason="a reported expected failure", strict=True)
def test_expected_failure():
    assert False
"""

# Clashing ids made after the plugin gave each test its own: xdist's file-by-file scheduling
# (scripts/test.sh's `--dist loadfile`) then runs one of the two tests.
CLASHING_CONFTEST = """
import pytest

from tests.every_test_runs import _set_node_id


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    cases = [item for item in items if item.name.startswith("test_api[")]
    _set_node_id(cases[1], cases[0].nodeid)
"""


def _pytest(tmp_path: Path, *args: str, conftest: str | None = None):
    (tmp_path / "test_module.py").write_text(MODULE)
    if conftest is not None:
        (tmp_path / "conftest.py").write_text(conftest)
    plugins = ("-p", "tests.every_test_runs", "-p", "no:cacheprovider", "-rA")
    return run_pytest(tmp_path, *plugins, *args)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "workers", [["-n", "2", "--dist", "loadfile"], ["-p", "no:xdist"]], ids=["xdist", "one"]
)
def test_each_schemathesis_case_runs_with_its_own_id(tmp_path, workers):
    result = _pytest(tmp_path, *workers)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    final = out.strip().splitlines()[-1]
    assert "3 passed" in final and "1 skipped" in final and "1 xfailed" in final, final
    for operation in ("GET /a", "POST /b", "GET /c/{name}"):
        assert f"PASSED test_module.py::test_api[{operation}]" in out, operation
    assert "NEVER RAN" not in out


@pytest.mark.timeout(180)
def test_a_collected_test_that_never_reports_fails_the_run(tmp_path):
    result = _pytest(tmp_path, "-n", "2", "--dist", "loadfile", conftest=CLASHING_CONFTEST)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "NEVER RAN: 1 of 5 collected tests reported no result" in out, out
    assert "test_module.py::test_api[" in out[out.index("NEVER RAN") :]
    # every test that did run passed: the failure is the missing one alone
    assert "2 passed" in out.strip().splitlines()[-1], out
