"""The ``flaudit`` console script as a user meets it (#20 item 4): clear one-line errors instead of
tracebacks or raw pydantic text, ``--version``, defaults shown in ``--help``, and a valid bound in
``flaudit gaussian``'s table."""

from __future__ import annotations

import argparse
import json

import pytest

from flaudit import __version__
from flaudit.auditor.bugs import InjectedBug
from flaudit.commands import cli


def _run(argv, capsys):
    code = cli.main(argv)
    return code, capsys.readouterr()


def test_attach_with_a_missing_key_file_says_so_without_a_traceback(capsys, tmp_path):
    code, out = _run(["attach", "--api-key-file", str(tmp_path / "nope")], capsys)
    assert code == 2
    assert "cannot read --api-key-file" in out.err and "nope" in out.err
    assert "Traceback" not in out.err + out.out


def test_attach_with_an_empty_key_file_says_so(capsys, tmp_path):
    empty = tmp_path / "key"
    empty.write_text("# no key here\n\n")
    code, out = _run(["attach", "--api-key-file", str(empty)], capsys)
    assert code == 2 and "holds no key" in out.err


def test_an_unknown_injected_bug_is_named_with_the_choices_not_pydantic_text(capsys):
    code, out = _run(["run", "examples/audit.toml", "--inject-bug", "foo"], capsys)
    assert code == 2
    assert "unknown bug 'foo'" in out.err and "noise_scale[=FACTOR]" in out.err
    for raw in ("validation error", "errors.pydantic.dev", "input_value", "type=enum"):
        assert raw not in out.err
    with pytest.raises(ValueError, match="noise_scale needs a factor") as info:
        InjectedBug.parse("noise_scale=1")
    assert "pydantic" not in str(info.value)


def test_rotate_secret_key_error_has_no_stray_field_name(capsys, tmp_path):
    code, out = _run(
        [
            "rotate-secret-key",
            "--old-key-file",
            str(tmp_path / "old"),
            "--new-key-file",
            str(tmp_path / "new"),
        ],
        capsys,
    )
    assert code == 2
    assert "key_file:" not in out.err + out.out
    assert out.err.startswith("flaudit rotate-secret-key: error: cannot read --old-key-file")


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith(f"flaudit {__version__} ")


def test_help_shows_every_default():
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            if (
                not action.option_strings
                or action.default in (None, False, argparse.SUPPRESS)
                or action.help is None
            ):
                continue
            help_text = " ".join(sub.formatter_class("x")._get_help_string(action).split())
            assert "default" in help_text.lower(), (name, action.dest)
    assert "(default: 50)" in " ".join(subparsers.choices["gaussian"].format_help().split())


def test_gaussian_table_shows_the_valid_bound_labelled(capsys):
    code, out = _run(
        ["gaussian", "--d", "1e4", "--k", "200", "--eps", "3", "--runs", "2", "--seed", "3"], capsys
    )
    assert code == 0
    assert "valid eps_lo 95%" in out.out and "not a valid bound" in out.out
    code, out = _run(
        [
            "gaussian",
            "--d",
            "1e4",
            "--k",
            "200",
            "--eps",
            "3",
            "--runs",
            "4",
            "--seed",
            "3",
            "--json",
        ],
        capsys,
    )
    row = json.loads(out.out)["rows"][0]
    # Bonferroni over 20 thresholds at alpha/20 never beats the uncorrected maximum
    assert row["epsilon_lo_valid"]["mean"] <= row["epsilon_lo_uncorrected"]["mean"]
    assert 0 < row["epsilon_lo_valid"]["mean"] < row["analytic_epsilon"]
