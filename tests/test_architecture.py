"""The code's shape, as docs/architecture.md states it: parts import one way (import-linter's
contracts in pyproject.toml), imports inside the project are relative and name files that exist,
none hides inside a function, and no source file grows past what a reader can hold."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARTS = ["auditor", "protocol", "service", "server", "clients", "commands"]
MAX_LINES = 700


def _sources():
    for part in PARTS:
        yield from sorted((ROOT / part).rglob("*.py"))


def _in_type_checking(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            lines.update(range(node.lineno, node.end_lineno + 1))
    return lines


def test_lint_imports_keeps_every_contract():
    lint = Path(sys.executable).with_name("lint-imports")
    env = dict(os.environ, LINT_IMPORTS=str(lint))
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "lint-imports.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout
    assert done.stdout.count("KEPT") >= 4


def test_ruff_lint_and_format_pass():
    """ruff's rules and format ([tool.ruff] in pyproject.toml) hold on the whole tree: what
    `bash scripts/lint.sh` checks, here so that CI runs it."""
    ruff = Path(sys.executable).with_name("ruff")
    failures = []
    for command in ("check", "format --check"):
        args = [*command.split(), "--no-cache", "--output-format", "concise", "."]
        done = subprocess.run(
            [str(ruff), *args], cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            lines = (done.stdout + done.stderr).splitlines()
            failures.append("\n".join([f"$ ruff {command} .", *lines[-60:]]))
    if failures:
        pytest.fail("\n".join(failures), pytrace=False)


def test_project_imports_are_relative_and_name_files_that_exist():
    problems = []
    for path in _sources():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                problems += [
                    f"{path.relative_to(ROOT)}:{node.lineno} import {a.name}"
                    for a in node.names
                    if a.name.split(".")[0] == "flaudit"
                ]
            elif isinstance(node, ast.ImportFrom):
                if node.level == 0:
                    if (node.module or "").split(".")[0] == "flaudit":
                        problems.append(
                            f"{path.relative_to(ROOT)}:{node.lineno} absolute {node.module}"
                        )
                    continue
                base = path.parent
                for _ in range(node.level - 1):
                    base = base.parent
                if base == ROOT and not node.module:
                    base = ROOT / "flaudit"  # `from .. import __version__`: the package itself
                target = base.joinpath(*(node.module or "").split(".")) if node.module else base
                if not (target.with_suffix(".py").is_file() or (target / "__init__.py").is_file()):
                    problems.append(
                        f"{path.relative_to(ROOT)}:{node.lineno} names no file: "
                        f"{'.' * node.level}{node.module or ''}"
                    )
    assert not problems, "\n".join(problems)


def _private_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, name)`` of each ``_private`` name (not a ``__dunder__``) imported from a project
    module: a relative import, or one from ``flaudit.``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (
            node.level > 0 or (node.module or "").split(".")[0] == "flaudit"
        ):
            found += [
                (node.lineno, a.name)
                for a in node.names
                if a.name.startswith("_")
                and not (a.name.startswith("__") and a.name.endswith("__"))
            ]
    return found


def test_the_private_import_check_sees_one():
    tree = ast.parse(
        "from .x import _hidden, shown, __version__\n"
        "from flaudit.server.y import _also as ok\nfrom os import _exit\n"
    )
    assert _private_imports(tree) == [(1, "_hidden"), (2, "_also")]


def test_no_private_name_crosses_a_module():
    """A ``_name`` stays inside its module: if another module needs it, it is an API (named
    without the underscore, with a docstring) or it lives in the wrong module."""
    crossing = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in _sources()
        for line, name in _private_imports(ast.parse(path.read_text()))
    ]
    assert not crossing, "private names imported across modules:\n" + "\n".join(crossing)


def test_no_project_import_hides_inside_a_function():
    hidden = []
    for path in _sources():
        text = path.read_text()
        tree, lines = ast.parse(text), text.splitlines()
        guarded = _in_type_checking(tree)
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ImportFrom)
                and node.level > 0
                and id(node) not in top
                and node.lineno not in guarded
                and not _deferred(lines, node.lineno)
            ):
                hidden.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not hidden, "project imports inside functions:\n" + "\n".join(hidden)


def _deferred(lines: list[str], lineno: int) -> bool:
    """A function-level import is allowed only under a ``# deferred: <why>`` comment (start-up
    cost, e.g. Flower and torch for a command that may not train), never to dodge a cycle: the
    contracts above would fail on a cycle whether the import is deferred or not."""
    above = lines[max(0, lineno - 6) : lineno - 1]
    return any("# deferred:" in line for line in above)


def test_no_source_file_is_longer_than_a_reader_can_hold():
    long = {
        str(p.relative_to(ROOT)): n
        for p in _sources()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"source files over {MAX_LINES} lines: {long}"


def test_no_source_file_is_named_like_a_test():
    """Flower leaves ``*_test.py`` and ``test_*.py`` out of an app bundle (FAB): such a module
    would be missing from the ServerApp on a SuperLink (seen: ``claim_test.py``)."""
    named = [
        str(p.relative_to(ROOT))
        for p in _sources()
        if p.name.endswith("_test.py") or p.name.startswith("test_")
    ]
    assert not named, named


@pytest.mark.parametrize(
    "path", [p for p in _sources() if p.stat().st_size > 0], ids=lambda p: str(p.relative_to(ROOT))
)
def test_every_module_says_what_it_owns(path):
    assert ast.get_docstring(ast.parse(path.read_text())), f"{path} has no module docstring"
