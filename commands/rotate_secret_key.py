"""``flaudit rotate-secret-key``: re-encrypt every stored canary seed with a new secret key, in one
transaction. Stop the service (or accept that it cannot read seeds until it restarts with the new
key), rotate, then start it with ``FLAUDIT_SECRET_KEY_FILE`` holding the new key.

A service may also run with both keys for a while: ``FLAUDIT_SECRET_KEY_FILE`` with the new key
on the first line and the old one on the second decrypts both (the first encrypts).
"""

from __future__ import annotations

import argparse
import sys

from ..service.sealing import SeedCipher
from ..service.settings import Settings, load_api_keys
from ..service.store import Store


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        default=None,
        help="SQLAlchemy URL (default $FLAUDIT_DATABASE_URL or sqlite:///.flaudit/flaudit.db).",
    )
    parser.add_argument(
        "--old-key-file",
        required=True,
        help="File with the key(s) the seeds are encrypted with now (one per line).",
    )
    parser.add_argument(
        "--new-key-file", required=True, help="File whose first line is the new key."
    )


def main(args: argparse.Namespace) -> int:

    try:
        old = load_api_keys(key_file=args.old_key_file, variable="--old-key-file")
        new = load_api_keys(key_file=args.new_key_file, variable="--new-key-file")
        if not new:
            raise ValueError("--new-key-file holds no key")
        cipher = SeedCipher(new[:1] + old)  # encrypt with the new key; decrypt with any
    except ValueError as exc:
        # load_api_keys names the settings field ("key_file: ..."); the option is named already
        print(
            f"flaudit rotate-secret-key: error: {str(exc).removeprefix('key_file: ')}",
            file=sys.stderr,
        )
        return 2
    database_url = args.database_url or Settings.from_env().database_url
    store = Store(database_url)  # no cipher: rotating must not first re-seal with it
    try:
        store.cipher = cipher
        count = store.reseal_seeds()
    except ValueError as exc:
        print(f"flaudit rotate-secret-key: error: {exc}; nothing was changed", file=sys.stderr)
        return 2
    finally:
        store.dispose()
    print(f"re-encrypted {count} canary seed(s) with the new key; start the service with it")
    return 0
