"""The suite's order (tests/slow_first.py): the slowest files first, each file's tests together and
in their order, so the two xdist workers of scripts/test.sh finish together."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.slow_first import SECONDS, slowest_files_first

ROOT = Path(__file__).resolve().parents[1]


class Item:
    """What the reordering reads of a pytest item: its node id and its timeout mark."""

    def __init__(self, nodeid: str, timeout: float | None = None):
        self.nodeid = nodeid
        self.timeout = timeout

    def get_closest_marker(self, name: str):
        if name == "timeout" and self.timeout is not None:
            return pytest.mark.timeout(self.timeout).mark
        return None


def test_every_listed_file_exists():
    """A renamed or removed file would silently lose its place at the front."""
    missing = [path for path in SECONDS if not (ROOT / path).is_file()]
    assert not missing, missing


def test_listed_files_first_then_by_timeout_then_as_collected():
    slowest, second = sorted(SECONDS, key=SECONDS.__getitem__, reverse=True)[:2]
    items = [
        Item("tests/a/test_quick.py::test_1"),
        Item(f"{second}::test_x"),
        Item("tests/a/test_marked.py::test_1", timeout=120),
        Item("tests/a/test_quick.py::test_2"),
        Item(f"{slowest}::test_y"),
        Item("tests/a/test_other.py::test_1"),
        Item("tests/a/test_marked.py::test_2", timeout=600),
        Item(f"{second}::test_z"),
    ]
    slowest_files_first(items)
    assert [item.nodeid for item in items] == [
        f"{slowest}::test_y",
        f"{second}::test_x",
        f"{second}::test_z",
        "tests/a/test_marked.py::test_1",
        "tests/a/test_marked.py::test_2",
        "tests/a/test_quick.py::test_1",
        "tests/a/test_quick.py::test_2",
        "tests/a/test_other.py::test_1",
    ]


def test_this_session_runs_in_that_order(request):
    """The hook is installed (tests/conftest.py): the collected files come in the order it makes."""
    items = list(request.session.items)
    files = [item.nodeid.split("::", 1)[0] for item in items]
    ordered = list(items)
    slowest_files_first(ordered)
    assert [item.nodeid for item in ordered] == [item.nodeid for item in items]
    assert files == sorted(files, key=lambda f: files.index(f))  # each file contiguous
