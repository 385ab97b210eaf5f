"""``flaudit rotate-signing-key``: retire the service's active Ed25519 signing key and make a new
one (sealed at rest with the operator's secret key, like the canary seeds). Retired public keys
stay listed at ``GET /keys``, so bundles they signed still verify (docs/evidence.md).
"""

from __future__ import annotations

import argparse
import sys

from ..service.evidence_store import rotate_signing_key
from ..service.sealing import SeedCipher
from ..service.settings import Settings
from ..service.store import Store


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        default=None,
        help="SQLAlchemy URL (default $FLAUDIT_DATABASE_URL or sqlite:///.flaudit/flaudit.db).",
    )


def main(args: argparse.Namespace) -> int:
    try:
        settings = Settings.from_env()
        cipher = SeedCipher(list(settings.secret_keys))
    except ValueError as exc:
        print(f"flaudit rotate-signing-key: error: {exc}", file=sys.stderr)
        return 2
    store = Store(args.database_url or settings.database_url, cipher=cipher)
    try:
        new, retired = rotate_signing_key(store)
    finally:
        store.dispose()
    were = ", ".join(retired) if retired else "none"
    print(f"new signing key {new}; retired: {were} (still listed at GET /keys)")
    return 0
