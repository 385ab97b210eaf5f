"""tests/skip_policy.py: under FLAUDIT_REQUIRE_ALL=1 (CI) every kind of skip is an error naming
the reason; without it skips stay skips and the summary counts them by reason."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.processes import run_pytest

SKIPPING = """
import pytest

needs_thing = pytest.mark.skipif(True, reason="the thing is not installed")


@needs_thing
def test_marked():
    pass


def test_skips_inside():
    pytest.skip("no server for this test")


@pytest.fixture
def server():
    pytest.skip("no server for this fixture")


def test_fixture_skips(server):
    pass


@pytest.mark.xfail(reason="known bug", strict=True)
def test_expected_failure():
    assert False


def test_passes():
    assert True
"""

SKIPPED_MODULE = """
import pytest

pytest.importorskip("surely_no_such_module_here")


def test_never_collected():
    pass
"""


def _pytest(
    tmp_path: Path, *, require_all: str | None, module: str = SKIPPING
) -> subprocess.CompletedProcess:
    (tmp_path / "test_module.py").write_text(module)
    plugins = ["tests.skip_policy", "no:cacheprovider", "no:schemathesis", "no:hypothesispytest"]
    args = [arg for plugin in [*plugins, "no:anyio"] for arg in ("-p", plugin)]
    return run_pytest(tmp_path, *args, "-rA", require_all=require_all, timeout=120)


@pytest.mark.timeout(180)
def test_under_require_all_every_skip_is_an_error_naming_the_reason(tmp_path):
    result = _pytest(tmp_path, require_all="1")
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    final = out.strip().splitlines()[-1]
    assert "skipped" not in final, final
    assert "1 passed" in final and "1 xfailed" in final, final
    # the marked test and the fixture skip fail in setup (errors), the body skip in the call
    assert "1 failed" in final and "2 errors" in final, final
    for reason in (
        "the thing is not installed",
        "no server for this test",
        "no server for this fixture",
    ):
        assert reason in out, reason
    assert out.count("FLAUDIT_REQUIRE_ALL=1 (CI) requires every test to run") >= 3, out
    assert "NOT TESTED" not in out


@pytest.mark.timeout(180)
def test_under_require_all_a_module_skipped_at_import_stops_the_run(tmp_path):
    result = _pytest(tmp_path, require_all="1", module=SKIPPED_MODULE)
    out = result.stdout
    assert result.returncode == 2, out + result.stderr  # a collection error interrupts pytest
    assert "ERROR collecting test_module.py" in out
    assert "requires every test to run: could not import 'surely_no_such_module_here'" in out
    assert "skipped" not in out.strip().splitlines()[-1]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("value", [None, "0"])
def test_without_require_all_skips_are_skips_and_counted_in_the_summary(tmp_path, value):
    result = _pytest(tmp_path, require_all=value)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    final = out.strip().splitlines()[-1]
    assert "1 passed" in final and "3 skipped" in final and "1 xfailed" in final, final
    section = out[out.index("NOT TESTED: 3 skipped") :]
    assert "1 skipped: the thing is not installed" in section
    assert "1 skipped: no server for this test" in section
    assert "1 skipped: no server for this fixture" in section
    assert "This run did not test everything" in section


@pytest.mark.timeout(180)
def test_without_require_all_a_module_skipped_at_import_is_counted(tmp_path):
    result = _pytest(tmp_path, require_all=None, module=SKIPPED_MODULE)
    out = result.stdout
    assert result.returncode == 5, out + result.stderr  # nothing ran: pytest's "no tests"
    assert "1 skipped: could not import 'surely_no_such_module_here'" in out
