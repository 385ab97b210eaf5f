"""Test-only launcher: ``flaudit serve`` with reproducible canary seeds.

``python -m tests.seeded_service serve ...`` (what ``ServiceProcess(seed=...)`` runs) reads the
seed from ``FLAUDIT_TEST_SEED``, removes the variable, and gives the service's audits the canary
seeds ``seed, seed + 1, ...`` in the order they are created; then it runs the production CLI
unchanged. Only this module, which lives in the test suite and is not installed with flaudit,
honours the variable: ``flaudit serve`` and every other production entry point ignore it (and
warn that they do, without the value; tests/service/test_test_seed_ignored.py).
"""

from __future__ import annotations

import itertools
import os
import sys

import flaudit.service.routers.audits as audits_router
from flaudit.commands.cli import main
from flaudit.service.app import TEST_SEED_VARIABLE


def install_seeds(base: int) -> None:
    """The audits created from now on get the canary seeds ``base, base + 1, ...``."""
    seeds = itertools.count(int(base))
    audits_router.new_master_seed = lambda: next(seeds)


if __name__ == "__main__":
    install_seeds(int(os.environ.pop(TEST_SEED_VARIABLE)))
    sys.exit(main())
