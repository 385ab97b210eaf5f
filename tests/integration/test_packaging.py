"""Installing flaudit (not editable) into a Flower app's environment: the wheel built from this
repository carries every module, the dashboard's static files and the ``flaudit`` command, and
a ServerApp imports ``CanaryAuditStrategy`` from the installed copy, away from the source tree.

The full ``pip install /path/to/flaudit`` into a fresh venv (dependencies from the registry) is
the same wheel plus its dependencies; docs/flower.md step 1 gives the command.
"""

from __future__ import annotations

import configparser
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.processes import ROOT

pytestmark = pytest.mark.slow


def _tracked_modules() -> set[str]:
    """The wheel paths of the repository's modules: ``auditor/x.py`` installs as
    ``flaudit/auditor/x.py`` (one import package, no generic top-level names)."""
    listed = subprocess.run(
        [
            "git",
            "ls-files",
            "flaudit",
            "auditor",
            "protocol",
            "service",
            "server",
            "clients",
            "commands",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {
        p if p.startswith("flaudit/") else f"flaudit/{p}"
        for p in listed
        if p.endswith((".py", ".mako")) or p.startswith("service/static/")
    }


@pytest.mark.timeout(300)
def test_the_wheel_installs_a_working_flaudit_outside_the_source_tree(tmp_path):
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(tmp_path / "dist"),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("flaudit-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path / "site")
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = configparser.ConfigParser()
        scripts.read_string(archive.read(entry_points).decode())
    missing = _tracked_modules() - names
    assert not missing, f"not in the wheel: {sorted(missing)}"
    assert scripts["console_scripts"]["flaudit"] == "flaudit.commands.cli:main"
    assert not any(n.startswith(("tests/", "docs/", "docker/")) for n in names)
    top_level = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top_level == {"flaudit"}, f"import names installed besides flaudit: {top_level}"

    # Import as a ServerApp would, with the installed copy first and no .pth processing (-S:
    # the development venv's editable finder stays out), from a directory outside the repo.
    site = sysconfig.get_paths()["purelib"]
    code = (
        "import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
        "import flaudit.server.wrapper, flaudit.service.app, flaudit.commands.cli\n"
        "from flaudit.server.wrapper import CanaryAuditStrategy\n"
        "from importlib.resources import files\n"
        "assert files('flaudit.service').joinpath('static').is_dir()\n"
        "print(flaudit.server.wrapper.__file__)\n"
        "from flaudit.service import migrations\n"  # the schema migrations ship in the wheel
        "from flaudit.service.store import Store\n"
        "assert migrations.__file__.startswith(sys.argv[1])\n"
        "assert Store('sqlite:///' + sys.argv[3]).revision == migrations.head_revision() != None\n"
        "sys.argv = ['flaudit', 'attach', '--help']\n"
        "flaudit.commands.cli.main()\n"
    )
    run = subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            code,
            str(tmp_path / "site"),
            site,
            str(tmp_path / "flaudit.db"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert "--format" in run.stdout, run.stderr[-2000:]
    assert Path(run.stdout.splitlines()[0]).is_relative_to(tmp_path / "site")
