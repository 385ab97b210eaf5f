"""The pure part of evidence bundles (auditor/claims/evidence.py): the canonical form does not depend on
key order or formatting, the comparison honours its stated tolerance, the commitment binds seed
and salt."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flaudit.auditor.claims.evidence import (
    ATOL,
    RTOL,
    canonical_json,
    digest,
    first_difference,
    seed_commitment,
)

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(_json)
def test_the_canonical_form_survives_reformatting_and_reordering(value):
    reformatted = json.loads(json.dumps(value, indent=3, sort_keys=False))
    if isinstance(value, dict):
        reformatted = dict(reversed(list(reformatted.items())))
    assert canonical_json(reformatted) == canonical_json(value)
    assert json.loads(canonical_json(value)) == value
    assert first_difference(value, reformatted, "x") is None


def test_the_canonical_form_is_compact_sorted_utf8_and_names_non_finite_numbers():
    assert (
        canonical_json({"b": [1, 2.5], "a": "μ", "c": math.inf})
        == '{"a":"μ","b":[1,2.5],"c":"inf"}'.encode()
    )
    assert digest({"x": 1, "signature": {"value": "ignored"}}) == digest({"x": 1})


@pytest.mark.parametrize("scale", [1.0, 1e-3, 1e6])
def test_a_difference_inside_the_tolerance_passes_and_outside_is_named(scale):
    x = 0.7 * scale
    assert first_difference({"e": [x]}, {"e": [x * (1 + RTOL / 2)]}, "r") is None
    found = first_difference({"e": [x]}, {"e": [x * (1 + 10 * RTOL) + 10 * ATOL]}, "r")
    assert found is not None and found.field == "r.e[0]" and found.recorded == x
    assert first_difference("inf", math.inf, "r") is None
    assert first_difference({"a": 1}, {"a": 1, "b": None}, "r") is None
    assert first_difference([1, 2], [1], "r").field == "r (length)"
    assert first_difference({"s": "a"}, {"s": "b"}, "r").field == "r.s"


@given(st.integers(0, 2**128 - 1), st.binary(min_size=16, max_size=16))
def test_the_commitment_binds_the_seed_and_the_salt(seed, salt):
    commitment = seed_commitment(seed, salt)
    assert len(commitment) == 64 and int(commitment, 16) >= 0
    assert seed_commitment((seed + 1) % 2**128, salt) != commitment
    assert seed_commitment(seed, bytes([salt[0] ^ 1]) + salt[1:]) != commitment
