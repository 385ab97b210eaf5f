"""``flaudit generate-secret-key``: print a new key for ``FLAUDIT_SECRET_KEY``."""

from __future__ import annotations

import argparse

from ..service.sealing import generate_secret_key


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Save it where only the service can read it, e.g. .flaudit/secret-key (mode 600)."
    )


def main(args: argparse.Namespace) -> int:

    print(generate_secret_key())
    return 0
