"""``flaudit generate-secret-key``: print a new key for ``FLAUDIT_SECRET_KEY``."""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = "Save it where only the service can read it, e.g. .flaudit/secret-key (mode 600)."


def main(args: argparse.Namespace) -> int:
    from flaudit.auditor.service.sealing import generate_secret_key

    print(generate_secret_key())
    return 0
