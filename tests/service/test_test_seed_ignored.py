"""The test-only seed seam cannot seed production (issue #39): ``flaudit serve`` started
normally with ``FLAUDIT_TEST_SEED`` set draws its canary seeds from the OS, says once that it
ignores the variable, and shows the value nowhere; only the test suite's launcher
(``tests/seeded_service.py``) honours it, which the second half checks so that the first half
could fail."""

from __future__ import annotations

import httpx

from flaudit.service.app import TEST_SEED_VARIABLE
from flaudit.service.sealing import SeedCipher
from flaudit.service.store import Store
from tests.processes import TEST_SECRET_KEY
from tests.service.service_process import ServiceProcess

API_KEY = "test-seed-key-" + "k" * 16
#: Secret-looking, as a drawn seed is (128 bits)
SEED = 0x39_7E57_5EED_0000_1111_2222_3333_4444


def _serve_two_audits(tmp_path, name: str, **options) -> tuple[list[int], str, str]:
    """Start the service, attach two audits; their canary seeds (from the database), the
    service's log and every response body."""
    url = f"sqlite:///{tmp_path / f'{name}.db'}"
    service = ServiceProcess(url, tmp_path / f"{name}.log", api_key=API_KEY, **options)
    bodies = []
    try:
        with httpx.Client(
            base_url=service.url, timeout=30, headers={"Authorization": f"Bearer {API_KEY}"}
        ) as http:
            ids = []
            for _ in range(2):
                r = http.post("/audits", json={"engine": "external", "num_canaries": 8})
                assert r.status_code == 201, r.text
                bodies.append(r.text)
                ids.append(r.json()["id"])
            for path in ("/audits", *(f"/audits/{i}" for i in ids)):
                bodies.append(http.get(path).text)
    finally:
        service.stop()
    store = Store(url, cipher=SeedCipher([TEST_SECRET_KEY]))
    seeds = [store.canary_seed(i) for i in ids]
    return seeds, (tmp_path / f"{name}.log").read_text(), "\n".join(bodies)


def _shown(seed: int, text: str) -> bool:
    return any(form in text for form in (str(seed), hex(seed), hex(seed)[2:]))


def test_the_production_service_ignores_the_test_seed_and_never_shows_it(tmp_path):
    seeds, log, bodies = _serve_two_audits(
        tmp_path, "production", env={TEST_SEED_VARIABLE: str(SEED)}
    )
    assert all(s is not None for s in seeds) and seeds[0] != seeds[1]
    assert not {SEED, SEED + 1} & set(seeds), "the production service used the test seed"
    assert min(seeds).bit_length() > 64  # drawn (128 bits), not counted from somewhere
    warnings = [
        line for line in log.splitlines() if f"{TEST_SEED_VARIABLE} is set and ignored" in line
    ]
    assert len(warnings) == 1, log[-3000:]
    for seed in (SEED, *seeds):
        assert not _shown(seed, log) and not _shown(seed, bodies)


def test_only_the_test_launcher_honours_it(tmp_path):
    seeds, log, bodies = _serve_two_audits(tmp_path, "launcher", seed=SEED)
    assert seeds == [SEED, SEED + 1]
    assert f"{TEST_SEED_VARIABLE} is set" not in log  # the launcher took the variable away
    for seed in seeds:
        assert not _shown(seed, log) and not _shown(seed, bodies)
