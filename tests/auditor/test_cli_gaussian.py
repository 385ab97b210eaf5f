import argparse
import json
import subprocess
import sys

import pytest

from flaudit.commands import gaussian


def _run(argv, capsys):
    parser = argparse.ArgumentParser(prog="flaudit gaussian")
    gaussian.configure(parser)
    code = gaussian.main(parser.parse_args(argv))
    return code, capsys.readouterr()


def test_json_output(capsys):
    code, out = _run(
        ["--d", "1e5", "--k", "200", "--eps", "1,10", "--runs", "3", "--json", "--seed", "4"],
        capsys,
    )
    assert code == 0
    data = json.loads(out.out)
    assert [round(r["target_epsilon"]) for r in data["rows"]] == [1, 10]
    assert data["rows"][1]["sigma"] == pytest.approx(0.541, abs=1e-3)
    assert (
        data["rows"][1]["epsilon_est_null_variance"]["mean"]
        > data["rows"][0]["epsilon_est_null_variance"]["mean"]
    )
    assert "seed" not in out.out


def test_table_output(capsys):
    code, out = _run(["--d", "1e4", "--k", "50", "--eps", "3", "--runs", "2"], capsys)
    assert code == 0 and "analytic eps" in out.out and "eps_lo" in out.out


def test_bad_arguments_exit_with_message(capsys):
    parser = argparse.ArgumentParser(prog="flaudit gaussian")
    gaussian.configure(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--delta", "2"])
    assert "--delta" in capsys.readouterr().err


def test_module_does_not_import_heavy_packages():
    code = (
        "import sys, flaudit.commands.gaussian; "
        "print(any(m in sys.modules for m in ('flwr', 'torch', 'fastapi')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
