"""What a skipped test means (pytest hooks, registered by tests/conftest.py).

* ``FLAUDIT_REQUIRE_ALL=1`` (``.ci/run`` sets it): a skip is an error naming what was missing.
  CI installs or starts everything the suite tests (PostgreSQL, docker, chromium), so a skip
  there means a part was not tested, and a run that tested less must not look green.
* Otherwise (``bash scripts/test.sh`` on a user's machine): skips stay skips, and the summary
  ends with a section that counts them by reason and says the run did not test everything.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

REQUIRE_ALL_VAR = "FLAUDIT_REQUIRE_ALL"


def require_all() -> bool:
    return os.environ.get(REQUIRE_ALL_VAR, "").strip().lower() in ("1", "true", "yes")


def skip_reason(report) -> str:
    """The reason of a skipped report (a ``(path, line, reason)`` tuple in pytest's reports)."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
    else:
        reason = str(longrepr)
    return reason.removeprefix("Skipped: ").strip()


def _as_failure(report) -> None:
    reason = skip_reason(report)
    report.outcome = "failed"
    report.longrepr = f"skipped, but {REQUIRE_ALL_VAR}=1 (CI) requires every test to run: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if require_all() and report.skipped and not hasattr(report, "wasxfail"):
        _as_failure(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module skipped at import (``pytest.importorskip`` at module level) is an error too."""
    outcome = yield
    report = outcome.get_result()
    if require_all() and report.skipped:
        _as_failure(report)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if not hasattr(r, "wasxfail")]
    if not skipped:
        return
    reasons = Counter(skip_reason(r) for r in skipped)
    terminalreporter.section(f"NOT TESTED: {len(skipped)} skipped", sep="=", yellow=True, bold=True)
    for reason, count in reasons.most_common():
        terminalreporter.line(f"{count:5d} skipped: {reason}")
    terminalreporter.line(
        "This run did not test everything. PostgreSQL: set FLAUDIT_TEST_POSTGRES_URL (README, "
        f"'Tests'); .ci/run installs what is missing and sets {REQUIRE_ALL_VAR}=1, which turns "
        "every skip into an error."
    )
