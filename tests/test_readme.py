"""Every Python snippet in README.md runs as written (#20 item 5): each ```python block is
extracted and run in a fresh interpreter from the repository root."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_snippets(text: str) -> list[str]:
    """The bodies of the ```python blocks, dedented (README lists indent them)."""
    out = []
    for match in re.finditer(r"^([ \t]*)```python\n(.*?)^\1```", text, re.S | re.M):
        indent = match.group(1)
        lines = [
            line[len(indent) :] if line.startswith(indent) else line
            for line in match.group(2).splitlines()
        ]
        out.append("\n".join(lines) + "\n")
    return out


SNIPPETS = python_snippets(README.read_text(encoding="utf-8"))


def test_the_readme_has_python_snippets():
    assert SNIPPETS, "no ```python block found in README.md"


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_python_snippet_runs(index, tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": str(README.parent),
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_HOME": str(tmp_path),
    }
    result = subprocess.run(
        [sys.executable, "-c", SNIPPETS[index]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, (
        f"README snippet {index} failed:\n{SNIPPETS[index]}\n{result.stderr}"
    )
