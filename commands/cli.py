"""The ``flaudit`` console script. Each subcommand lives in ``commands/<name>.py`` and
exposes ``configure(parser)`` and ``main(args) -> int``; they are imported lazily so that
``flaudit gaussian`` does not pay for importing Flower or FastAPI."""

from __future__ import annotations

import argparse
import importlib
import sys

from .. import __version__

SUBCOMMANDS = {
    "serve": "Run the audit service (REST API + dashboard).",
    "run": "Run one audit end to end in the Flower simulation engine and print the estimates.",
    "gaussian": "Audit the Gaussian mechanism with random canaries (Andrew et al. Alg. 1).",
    "attach": "Create an audit for your own Flower app and print the environment it needs.",
    "generate-secret-key": "Print a new key for FLAUDIT_SECRET_KEY (encrypts canary seeds at rest).",
    "rotate-secret-key": "Re-encrypt every stored canary seed with a new secret key.",
    "verify": "Check an evidence bundle offline: recompute every number, check its signature.",
    "rotate-signing-key": "Retire the service's evidence signing key and make a new one.",
}


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to an option's help unless the help already names its default
    or there is none to show (None, False, a suppressed default)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text.lower()
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or not action.option_strings
            or isinstance(action, argparse._VersionAction)
        ):
            return text
        if isinstance(default, (list, tuple)):
            shown = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in default)
        elif isinstance(default, float):
            shown = f"{default:g}"
        else:
            shown = str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


def _version() -> str:
    from importlib import metadata

    try:
        flwr = metadata.version("flwr")
    except metadata.PackageNotFoundError:
        flwr = "not installed"
    return f"flaudit {__version__} (Python {sys.version.split()[0]}, flwr {flwr})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flaudit",
        description="Empirical privacy auditing of DP-FedAvg with random canary clients.",
        formatter_class=DefaultsHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in SUBCOMMANDS.items():
        module = importlib.import_module(f"flaudit.commands.{name.replace('-', '_')}")
        sub_parser = sub.add_parser(
            name, help=help_text, description=help_text, formatter_class=DefaultsHelpFormatter
        )
        module.configure(sub_parser)
        sub_parser.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args._module.main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
