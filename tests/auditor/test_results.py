"""The one JSON convention for numbers (auditor/results.py): ``jsonable`` writes non-finite
floats as strings, ``number`` reads them back (NaN: no number)."""

from __future__ import annotations

import json
import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from flaudit.auditor.results import Estimator, jsonable, number


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_a_float_survives_strict_json_except_nan(x):
    written = json.loads(json.dumps(jsonable({"x": x}), allow_nan=False))["x"]
    back = number(written)
    if math.isnan(x):
        assert written == "nan" and back is None
    else:
        assert back == x
        assert number(written, finite=True) == (x if math.isfinite(x) else None)


def test_what_is_and_is_not_a_number():
    assert number(3) == 3.0 and number(np.float32(2.5)) == 2.5 and number(np.int64(4)) == 4.0
    assert number("-inf") == -math.inf and number(math.inf) == math.inf
    for nothing in (True, None, "nan", float("nan"), "1.5", [1.0], np.array([1.0, 2.0])):
        assert number(nothing) is None


def test_jsonable_converts_containers_numpy_and_enums():
    out = jsonable({1: (np.float64(-np.inf), np.array([np.nan, 1.0])), "e": Estimator.fdp_one_run})
    assert out == {"1": ["-inf", ["nan", 1.0]], "e": Estimator.fdp_one_run.value}
