"""Secrets: run tokens stop working when the audit ends, no bound parameter (the canary seed) in a
failing statement's log or error, security headers on the dashboard and the API."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from sqlalchemy.exc import IntegrityError

import flaudit.service.store as store_module
from flaudit.service.headers import CONTENT_SECURITY_POLICY
from flaudit.service.store import Store

from .conftest import AUTH, f32, start_run, submit


def _ingest_initial(client, audit_id, headers):
    return client.put(
        f"/audits/{audit_id}/initial-model", content=f32(np.zeros(8)), headers=headers
    )


@pytest.mark.parametrize("ending", ["succeeded", "failed", "cancelled"])
def test_run_token_is_revoked_when_the_audit_ends(client, store, ending):
    audit_id = submit(client)
    headers = start_run(store, audit_id)
    assert _ingest_initial(client, audit_id, headers).status_code == 200
    if ending == "succeeded":
        final = client.put(
            f"/audits/{audit_id}/final-model", content=f32(np.ones(8)), headers=headers
        )
        assert final.status_code == 200, final.text
    elif ending == "failed":
        assert store.finish(audit_id, status="failed", reason="x", only_if=("running",))
        client.app.state.read_cache.invalidate(audit_id)  # what the runner does after a failure
    else:
        assert client.post(f"/audits/{audit_id}/cancel", headers=AUTH).status_code == 200
    assert client.get(f"/audits/{audit_id}").json()["status"] == ending
    again = client.put(f"/audits/{audit_id}/final-model", content=f32(np.ones(8)), headers=headers)
    assert again.status_code == 401, again.text


def test_a_failing_insert_logs_no_bound_parameters(tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="sqlalchemy.engine")
    store = Store(f"sqlite:///{tmp_path / 'log.db'}")
    seed = 2**127 + 987654321
    monkeypatch.setattr(store_module.secrets, "token_urlsafe", lambda n: "same-id")
    store.create_audit(name="a", spec={}, canary_seed=seed)
    with pytest.raises(IntegrityError) as info:  # same primary key again
        store.create_audit(name="b", spec={}, canary_seed=seed)
    store.dispose()
    text = caplog.text + str(info.value)
    assert "INSERT INTO flaudit_audits" in text  # the statement is logged ...
    for form in (str(seed), hex(seed), format(seed, "x")):
        assert form not in text  # ... its parameters are not


def test_security_headers_on_dashboard_api_and_errors(client):
    for path in ("/ui/", "/audits", "/audits/nope", "/openapi.json"):
        response = client.get(path)
        assert response.headers["x-frame-options"] == "DENY", path
        assert response.headers["x-content-type-options"] == "nosniff", path
        assert response.headers["referrer-policy"] == "no-referrer", path
        assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY, path
    assert "'unsafe-inline'" not in CONTENT_SECURITY_POLICY
    big = client.post(
        "/audits", content=b" " * (1 << 17), headers={"Content-Type": "application/json"}
    )
    assert big.status_code == 413 and big.headers["x-frame-options"] == "DENY"


def test_dashboard_has_no_inline_script_or_style():
    """The CSP forbids inline code: the page must not need any."""
    from flaudit.service.app import STATIC_DIR

    html = (STATIC_DIR / "index.html").read_text()
    assert "<style" not in html and " style=" not in html and " on" + "click=" not in html
    for line in html.splitlines():
        if "<script" in line:
            assert 'src="' in line, line


# -- the canary seed at rest ------------------------------------------------------------------
def test_the_database_alone_does_not_reveal_the_seed(store):
    from sqlalchemy import text

    seed = 2**127 + 4242
    audit = store.create_audit(name="a", spec={}, canary_seed=seed)
    with store.engine.connect() as conn:
        raw = conn.execute(
            text("SELECT canary_seed FROM flaudit_audits WHERE id = :i"), {"i": audit.id}
        ).scalar_one()
    assert raw.startswith("fernet:")
    for form in (str(seed), hex(seed), format(seed, "x")):
        assert form not in raw
    assert store.canary_seed(audit.id) == seed


def test_a_wrong_or_missing_key_is_a_clear_error(tmp_path):
    from flaudit.service.sealing import SecretKeyError, SeedCipher, generate_secret_key

    url = f"sqlite:///{tmp_path / 'k.db'}"
    store = Store(url, cipher=SeedCipher([generate_secret_key()]))
    audit_id = store.create_audit(name="a", spec={}, canary_seed=7).id
    store.dispose()
    for cipher in (SeedCipher([generate_secret_key()]), None):
        other = Store(url, cipher=cipher)
        with pytest.raises(SecretKeyError, match="secret key") as info:
            other.canary_seed(audit_id)
        assert "7" not in str(info.value).replace("FLAUDIT", "")
        other.dispose()
    with pytest.raises(SecretKeyError, match="FLAUDIT_SECRET_KEY"):
        SeedCipher([])
    with pytest.raises(SecretKeyError, match="not a valid key"):
        SeedCipher(["not-a-key"])


def test_plain_seeds_of_an_old_database_are_encrypted_on_start_up(tmp_path):
    from flaudit.service.sealing import SeedCipher, generate_secret_key

    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = Store(url)  # no cipher: how a version without encryption stored seeds
    audit_id = old.create_audit(name="a", spec={}, canary_seed=123456789).id
    old.dispose()
    store = Store(url, cipher=SeedCipher([generate_secret_key()]))
    with store.session() as s:
        from flaudit.service.store import Audit

        assert s.get(Audit, audit_id).canary_seed.startswith("fernet:")
    assert store.canary_seed(audit_id) == 123456789
    store.dispose()


def test_rotate_secret_key_command_reencrypts_every_seed(tmp_path):
    from flaudit.commands.cli import main
    from flaudit.service.sealing import SecretKeyError, SeedCipher, generate_secret_key

    old_key, new_key = generate_secret_key(), generate_secret_key()
    (tmp_path / "old").write_text(old_key + "\n")
    (tmp_path / "new").write_text(new_key + "\n")
    url = f"sqlite:///{tmp_path / 'r.db'}"
    store = Store(url, cipher=SeedCipher([old_key]))
    seeds = {
        store.create_audit(name=str(i), spec={}, canary_seed=2**100 + i).id: 2**100 + i
        for i in range(3)
    }
    store.dispose()
    args = [
        "rotate-secret-key",
        "--database-url",
        url,
        "--old-key-file",
        str(tmp_path / "old"),
        "--new-key-file",
        str(tmp_path / "new"),
    ]
    assert main(args) == 0
    rotated = Store(url, cipher=SeedCipher([new_key]))
    assert {a: rotated.canary_seed(a) for a in seeds} == seeds
    rotated.dispose()
    stale = Store(url, cipher=SeedCipher([old_key]))
    with pytest.raises(SecretKeyError):
        stale.canary_seed(next(iter(seeds)))
    stale.dispose()
    # with the wrong old key (the seeds are under the new one now) nothing changes
    assert main(args[:5] + ["--new-key-file", str(tmp_path / "old")]) == 2
    again = Store(url, cipher=SeedCipher([new_key]))
    assert {a: again.canary_seed(a) for a in seeds} == seeds
    again.dispose()


def test_serve_refuses_to_start_without_a_secret_key(tmp_path, monkeypatch, capsys):
    from flaudit.commands.cli import main

    for name in ("FLAUDIT_SECRET_KEY", "FLAUDIT_SECRET_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert main(["serve", "--database-url", f"sqlite:///{tmp_path / 'x.db'}"]) == 2
    out = capsys.readouterr().out
    assert "FLAUDIT_SECRET_KEY" in out and "generate-secret-key" in out
    monkeypatch.setenv("FLAUDIT_SECRET_KEY", "not-a-key")
    assert main(["serve", "--database-url", f"sqlite:///{tmp_path / 'x.db'}"]) == 2
    assert "not a valid key" in capsys.readouterr().out
    assert not (tmp_path / "x.db").exists()  # stopped before touching the database


def test_a_corrupt_stored_seed_is_refused_without_echoing_it():
    from flaudit.service.sealing import (
        SEALED_PREFIX,
        SecretKeyError,
        SeedCipher,
        generate_secret_key,
    )

    cipher = SeedCipher([generate_secret_key()])
    secret = "12345678901234567890x"  # not an integer: int() would quote it
    sealed = SEALED_PREFIX + cipher._keyring.encrypt(secret.encode()).decode()
    for stored in (secret, sealed):
        with pytest.raises(SecretKeyError, match="corrupt") as error:
            cipher.open(stored)
        assert "12345678901234567890" not in str(error.value)
