"""Every collected test runs and reports, or the run fails (issue #39, "no green by skipping").

pytest-xdist hands tests to its workers by node id, one run per id: two tests that share an id
run once and the run still looks green. schemathesis's ``@schema.parametrize()`` gives all of its
cases (one per API operation) the test function's id, so ``tests/service/test_fuzz.py`` fuzzed 1
of its 31 operations under ``scripts/test.sh`` (1726 tests collected, 1696 reported) until this
plugin. It does two things (tests/conftest.py registers it):

* at collection, a test whose node id another test has too gets its own, from its name
  (``test_no_server_errors[GET /audits]``); ids that still clash stop the run with a usage error;
* at the end, in the process that prints the summary (xdist's controller, or the only one), the
  tests that reported a result are counted against those collected. Fewer (a run not stopped
  early, by ``-x``, a signal or a collection error) fails the run and names what never ran.
"""

from __future__ import annotations

from collections import Counter

import pytest


def unique_node_ids(items: list[pytest.Item]) -> None:
    """Give each test whose node id is shared its own id, ``<file>::<its name>``."""
    seen: dict[str, int] = {}
    for item in items:
        seen[item.nodeid] = seen.get(item.nodeid, 0) + 1
    for item in items:
        if seen[item.nodeid] > 1:
            _set_node_id(item, f"{item.nodeid.split('::', 1)[0]}::{item.name}")
    ids = [item.nodeid for item in items]
    clashing = sorted({nodeid for nodeid in ids if ids.count(nodeid) > 1})
    if clashing:
        raise pytest.UsageError(
            f"{len(clashing)} node ids are shared by several tests, which pytest-xdist runs once: "
            + ", ".join(clashing[:5])
        )


def _set_node_id(item: pytest.Item, nodeid: str) -> None:
    # pytest has no public setter. Since 9.2 a node keeps a structured id (`_id`) built from the
    # function's original name and its parametrize ids, which schemathesis's items lack: that is
    # how its cases came to share one id. Before 9.2 the id was the string `_nodeid`.
    if hasattr(item, "_id"):
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(nodeid)
    else:
        item._nodeid = nodeid


def pytest_collection_modifyitems(items):
    unique_node_ids(items)


class _Counter:
    """Counts collected tests and the tests that reported (in the controller, under xdist)."""

    def __init__(self) -> None:
        self.collected: list[str] | None = None
        self.reported: Counter[str] = Counter()
        self.never_reported: list[str] = []

    def pytest_collection_finish(self, session):
        self.collected = [item.nodeid for item in session.items]

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        self.collected = list(ids)  # every worker collects the same list (xdist checks it)

    def pytest_runtest_logreport(self, report):
        # a test reports its call, or a setup that did not pass (failed, errored or skipped)
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self.reported[report.nodeid] += 1

    def pytest_sessionfinish(self, session, exitstatus):
        stopped_early = session.shouldstop or session.shouldfail
        ran_none = session.config.option.collectonly  # --collect-only runs nothing by design
        if self.collected is None or stopped_early or ran_none or exitstatus not in (0, 1):
            return
        # counted with multiplicity: a test that shares its id with another is one of two to run
        unreported = Counter(self.collected) - self.reported
        self.never_reported = sorted(unreported.elements())
        if self.never_reported:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        if not self.never_reported:
            return
        missing = self.never_reported
        terminalreporter.section(
            f"NEVER RAN: {len(missing)} of {len(self.collected)} collected tests reported no result",
            sep="=",
            red=True,
            bold=True,
        )
        for nodeid in missing[:20]:
            terminalreporter.line(nodeid)
        if len(missing) > 20:
            terminalreporter.line(f"... and {len(missing) - 20} more")
        terminalreporter.line("The run fails: a test that never ran is not a passed test.")


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # xdist's workers report to the controller
        config.pluginmanager.register(_Counter(), "flaudit-every-test-runs-counter")
