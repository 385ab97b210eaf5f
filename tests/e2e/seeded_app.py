"""The real service app (``flaudit.service.app:create_app``) with reproducible canary
seeds, for the browser tests' uvicorn subprocess.

The service draws each audit's secret canary seed from the OS. The verdict tests feed real
audits whose outcome is random through the seed: a correct run ends refuted in about 1-4% of
runs (the alarm's own false-alarm level; docs/fidelity.md §7), an audit of 6 canaries in about
2%. That rate is measured by the benchmarks; a CI test must give the same answer every time.
So here the audits of one service get the seeds ``SEED_BASE, SEED_BASE + 1, ...`` in the order
they are created; nothing else of the service changes.
"""

from __future__ import annotations

import itertools

import flaudit.service.routers.audits as audits_router
from flaudit.service.app import create_app as _create_app

#: Large and secret-looking, like a drawn seed (128 bits).
SEED_BASE = 0x5EED_2026_1126_E2E0_7E57_0F1A_C0DE


def create_app():
    seeds = itertools.count(SEED_BASE)
    audits_router.new_master_seed = lambda: next(seeds)
    return _create_app()
