"""Issue #21's minor defects: booleans refused for number fields, the 400 for an unparsable
body documented, and a 405/OPTIONS ``Allow`` that names every method of the path."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from flaudit.auditor.spec import AuditClaim, AuditSpec

from .conftest import AUTH


@pytest.mark.parametrize("field", ["data_seed", "num_rounds", "num_canaries", "noise_multiplier"])
@pytest.mark.parametrize("value", [False, True])
def test_booleans_are_not_numbers(field, value):
    with pytest.raises(
        ValidationError, match=f"{field}[\\s\\S]*expected a number, got the boolean"
    ):
        AuditSpec.model_validate({field: value})
    assert AuditSpec.model_validate({"data_seed": 0}).data_seed == 0


def test_a_boolean_data_seed_gets_a_422_naming_it(client):
    r = client.post("/audits", json={"data_seed": False}, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "data_seed"
    with pytest.raises(ValidationError, match="num_rounds"):
        AuditClaim.model_validate(
            {
                "noise_multiplier": 1.0,
                "clip_norm": 1.0,
                "num_rounds": True,
                "num_clients": 3,
                "clients_per_round": 3,
            }
        )


def test_the_400_for_an_unparsable_body_is_documented(client):
    r = client.post(
        "/audits", content=b'{"name": "\xff"}', headers={**AUTH, "Content-Type": "application/json"}
    )
    assert r.status_code == 400
    paths = client.get("/openapi.json").json()["paths"]
    assert "400" in paths["/audits"]["post"]["responses"]
    assert "400" in paths["/audits/{audit_id}/claim"]["put"]["responses"]


def test_allow_names_every_method_of_the_path(client):
    audit_id = client.post(
        "/audits", json={"engine": "external", "num_canaries": 8}, headers=AUTH
    ).json()["id"]
    r = client.options(f"/audits/{audit_id}")
    assert r.status_code == 405
    allowed = {m.strip() for m in r.headers["allow"].split(",")}
    assert {"GET", "DELETE"} <= allowed
    assert client.delete(f"/audits/{audit_id}", headers=AUTH).status_code in (200, 204)
