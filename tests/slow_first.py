"""The slowest test files run first (issue #39, "Time").

``scripts/test.sh`` runs the suite on two pytest-xdist workers, each test file on one worker
(``--dist loadfile``) and in the order of the collection (``--no-loadscope-reorder``; xdist's
default order puts the files with the most tests first, which left the one-test real-Flower
files of 2-4 minutes each for the very end, where one worker ran them while the other had
nothing left). Here the collection is reordered file by file, the longest first, so that the
last files handed out are short ones and both workers finish together; a file's tests keep
their order, so its module fixtures are set up once as before.

The files listed in :data:`SECONDS` (measured) come first, longest first; then the others by
their longest ``@pytest.mark.timeout`` (sized from ``--durations``: a new slow test carries one);
then the rest, as collected."""

from __future__ import annotations

import pytest

#: Seconds the slowest files take on an idle 2-core machine: README "Tests" (the idle `.ci/run`
#: of 2026-12-06), and for the files it does not list the loaded run's `--durations` halved;
#: the order matters, the values only roughly.
SECONDS = {
    "tests/integration/test_record_opacus_app.py": 190,
    "tests/deployment/test_topology.py": 100,
    "tests/integration/test_byo_weighted_app.py": 125,
    "tests/integration/test_service_outage.py": 103,
    "tests/integration/test_byo_auto_sizing.py": 89,
    "tests/integration/test_byo_flower_app.py": 60,
    "tests/auditor/test_studentized.py": 60,
    "tests/integration/test_sklearn_adaptive_app.py": 40,
    "tests/integration/test_flower_simulation.py": 35,
    "tests/integration/test_flower_deployment.py": 27,
}


def expected_seconds(items: list[pytest.Item]) -> tuple[float, float]:
    """One file's sort key: its measured seconds (0 when not listed), then its longest timeout."""
    path = items[0].nodeid.split("::", 1)[0]
    marks = [m.args[0] for item in items if (m := item.get_closest_marker("timeout")) and m.args]
    return float(SECONDS.get(path, 0)), float(max(marks, default=0))


def slowest_files_first(items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place: whole files, the longest expected first (ties: as
    collected); within a file, as collected."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    ordered = sorted(files.values(), key=expected_seconds, reverse=True)  # stable for ties
    items[:] = [item for group in ordered for item in group]
