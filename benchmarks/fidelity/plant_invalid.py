"""Checked from outside: plant invalid procedures and see the validity tests fail (issue #39).

Each plant swaps one shipped procedure for an invalid one in a pytest run of the tests that
should catch it; a plant is *caught* when at least one of those tests fails. Two kinds:

* **coin** plants make the true rate at least 8% by construction: the procedure decides as
  shipped, and in addition (seeded coin, probability 0.08 per run) fires / rejects / returns a
  bound far above the truth. The validity tests are designed to catch a true 8% with
  probability >= 0.9 (docs/fidelity.md, "Validity tests"), so each should be caught.
* **natural** plants are the mistakes one could make: a level 1.6 x too large (alpha 0.08 where
  0.05 is claimed), a confidence of 0.92 where 0.95 is claimed, a 3% bias in the estimate. Their
  true rate is 8% only where the procedure is exact (the normal-score test); where it is
  conservative (Bonferroni, union bounds, betting) the true rate stays lower, and a miss is
  reported as such.

Run (a few minutes on one idle core; the test runs of each plant are listed)::

    PYTHONPATH=. python -m benchmarks.fidelity.plant_invalid            # every plant
    PYTHONPATH=. python -m benchmarks.fidelity.plant_invalid alarm_coin_8pct

The same module is the pytest plugin that applies a plant (``-p
benchmarks.fidelity.plant_invalid`` with ``FLAUDIT_PLANT=<name>``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import subprocess
import sys
import time

import numpy as np

from flaudit.auditor.claims import alarm, curve_tests, tradeoff
from flaudit.auditor.claims.normal_scores import NormalScoreTest
from flaudit.auditor.estimators import fitted, gdp, lower_bound
from flaudit.auditor.estimators.sequential import SequentialDPTest

_ENV = "FLAUDIT_PLANT"
_COIN = 0.08
_rng = np.random.default_rng(39)


def _coin() -> bool:
    return bool(_rng.random() < _COIN)


def _swap(original, replacement) -> None:
    """Replace ``original`` by ``replacement`` wherever a flaudit or benchmark module holds it
    (the defining module and every ``from x import y``)."""
    for mod in list(sys.modules.values()):
        name = getattr(mod, "__name__", "")
        if not name.startswith(("flaudit", "benchmarks", "auditor")):
            continue
        for attr, value in list(vars(mod).items()):
            if value is original:
                setattr(mod, attr, replacement)


# -- the plants ---------------------------------------------------------------------------------


def _alarm_level_x16():
    original = alarm.look_level

    def look_level(test, look, num_looks, *, alpha=alarm.ALARM_ALPHA):
        return original(test, look, num_looks, alpha=1.6 * alpha)

    _swap(original, look_level)


def _alarm_coin():
    original = alarm.decide_alarm

    def decide_alarm(tests, *, look, num_looks, **kw):
        decision = original(tests, look=look, num_looks=num_looks, **kw)
        if look == num_looks and decision.status == "ok" and _coin():
            return dataclasses.replace(decision, status="error")
        return decision

    _swap(original, decide_alarm)


def _normal_score_size():
    p_value, mu_lo = NormalScoreTest.p_value.fget, NormalScoreTest.mu_lo
    NormalScoreTest.p_value = property(lambda self: p_value(self) / 1.6)  # size 8% at 5%
    NormalScoreTest.mu_lo = lambda self, level: mu_lo(self, min(1.6 * level, 0.5))


def _claim_test(transform):
    original = curve_tests.claim_test

    def claim_test(*args, **kw):
        result = original(*args, **kw)
        return dataclasses.replace(result, p_value=transform(result.p_value))

    _swap(original, claim_test)


def _bound_confidence():
    for module, name in (
        (gdp, "gdp_lower_bound"),
        (lower_bound, "epsilon_lower_bound"),
        (curve_tests, "fdp_one_run_lower_bound"),
    ):
        original = getattr(module, name)

        def planted(*args, _f=original, confidence=0.95, **kw):
            return _f(*args, confidence=confidence - 0.03, **kw)

        _swap(original, planted)


def _bound_coin():
    """With probability 0.08 the bound is computed on seen scores moved far up (a bound far
    above the truth); otherwise as shipped."""

    def shifted(seen, d):
        seen = np.asarray(seen, dtype=float)
        if d is None:
            return seen + 10.0 * max(float(np.std(seen)), 1e-9)
        return np.minimum(seen + 10.0 / math.sqrt(d), 0.999)

    for module, name in ((gdp, "gdp_lower_bound"), (lower_bound, "epsilon_lower_bound")):
        original = getattr(module, name)

        def planted(seen, *args, _f=original, **kw):
            if _coin():
                seen = shifted(seen, kw.get("d"))
            return _f(seen, *args, **kw)

        _swap(original, planted)
    original = curve_tests.fdp_one_run_lower_bound

    def fdp_one_run_lower_bound(scores, seen_mask, **kw):
        if _coin():
            scores = np.asarray(scores, dtype=float) + 100.0 * np.asarray(seen_mask, dtype=float)
        return original(scores, seen_mask, **kw)

    _swap(original, fdp_one_run_lower_bound)


def _sequential_alpha():
    init = SequentialDPTest.__init__

    def __init__(self, *args, alpha=0.05, **kw):
        init(self, *args, alpha=1.6 * alpha, **kw)

    SequentialDPTest.__init__ = __init__


def _band_confidence():
    original = tradeoff.tradeoff_picture

    def tradeoff_picture(*args, confidence=0.95, **kw):
        return original(*args, confidence=confidence - 0.03, **kw)

    _swap(original, tradeoff_picture)


def _sequential_coin():
    """Each test object is, with probability 0.08, one that rejects whatever it sees."""
    init, rejected = SequentialDPTest.__init__, SequentialDPTest.rejected.fget

    def __init__(self, *args, **kw):
        init(self, *args, **kw)
        self._planted_reject = _coin()

    SequentialDPTest.__init__ = __init__
    SequentialDPTest.rejected = property(
        lambda self: getattr(self, "_planted_reject", False) or rejected(self)
    )


def _band_coin():
    original = tradeoff.tradeoff_picture

    def tradeoff_picture(*args, **kw):
        picture = original(*args, **kw)
        if picture.get("band") is not None and picture.get("claim") is not None and _coin():
            picture = dict(picture, band=[min(1.0, c + 0.01) for c in picture["claim"]])
        return picture

    _swap(original, tradeoff_picture)


def _estimate_bias():
    original = fitted.final_model_epsilon

    def final_model_epsilon(seen, d, delta, **kw):
        return original(np.asarray(seen, dtype=float) * 1.03, d, delta, **kw)

    _swap(original, final_model_epsilon)


_ALARM = [
    "tests/auditor/test_alarm.py::test_false_alarm_rate_over_every_look_on_the_claim",
    "tests/fidelity/test_fidelity_alarm.py::test_a_laplace_mechanism_on_its_claim_rarely_alarms",
]
_CLAIM = ["tests/auditor/test_gdp.py::test_claim_test_and_mu_lo_valid_on_the_claim"]
_BOUNDS = [
    "tests/auditor/test_gdp.py::test_claim_test_and_mu_lo_valid_on_the_claim",
    "tests/auditor/test_gdp.py::test_exact_null_mu_lo_valid_at_epsilon_zero",
    "tests/auditor/test_gdp.py::test_fdp_one_run_valid_and_powerful",
    "tests/auditor/test_lower_bound.py::test_split_covers_the_true_epsilon",
    "tests/fidelity/test_fidelity_validity.py::test_valid_lower_bounds_rarely_exceed_true_epsilon",
    "tests/fidelity/test_fidelity_peer.py::test_a_true_claim_is_rarely_refuted_by_ours_but_often_by_the_peer_as_shipped",
]

#: name: (kind, what is planted, how, the tests that should catch it)
PLANTS = {
    "alarm_coin_8pct": (
        "coin",
        "decide_alarm also fires at the final look with probability 0.08",
        _alarm_coin,
        _ALARM,
    ),
    "alarm_level_x1.6": (
        "natural",
        "every look's level 1.6 x (alpha 0.08 spent)",
        _alarm_level_x16,
        _ALARM,
    ),
    "normal_score_size_8pct": (
        "natural",
        (
            "normal-score p-value / 1.6 and mu_lo at 1.6 x its "
            "level (exact test: size and non-coverage 8%)"
        ),
        _normal_score_size,
        [
            "tests/auditor/test_studentized.py::test_the_final_model_test_has_its_level_where_summed_scores_did_not",
            "tests/auditor/test_studentized.py::test_the_known_rounds_test_has_its_level_over_rounds_and_repeats",
            "tests/fidelity/test_fidelity_alarm.py::test_mu_lo_rarely_exceeds_the_truth",
        ],
    ),
    "claim_test_coin_8pct": (
        "coin",
        "claim_test also rejects (p = 0) with probability 0.08",
        lambda: _claim_test(lambda p: 0.0 if _coin() else p),
        _CLAIM,
    ),
    "claim_test_level_x1.6": (
        "natural",
        "claim_test p-value / 1.6",
        lambda: _claim_test(lambda p: p / 1.6),
        _CLAIM,
    ),
    "bound_coin_8pct": (
        "coin",
        (
            "gdp/epsilon/f-DP lower bounds computed on seen scores moved "
            "far up with probability 0.08"
        ),
        _bound_coin,
        _BOUNDS,
    ),
    "bound_confidence_0.92": (
        "natural",
        ("gdp/epsilon/f-DP lower bounds at confidence 0.92 where 0.95 is asked"),
        _bound_confidence,
        _BOUNDS,
    ),
    "sequential_alpha_x1.6": (
        "natural",
        "SequentialDPTest at alpha 0.08 where 0.05 is asked",
        _sequential_alpha,
        [
            "tests/auditor/test_sequential.py::test_same_distribution_rarely_rejects",
            "tests/auditor/test_sequential.py::test_calibrated_gaussian_mechanism_rarely_rejects",
            "tests/auditor/test_sequential.py::test_tight_randomized_response_rarely_rejects_but_a_smaller_claim_is_caught",
        ],
    ),
    "sequential_coin_8pct": (
        "coin",
        ("a SequentialDPTest rejects whatever it sees with probability 0.08"),
        _sequential_coin,
        [
            "tests/auditor/test_sequential.py::test_same_distribution_rarely_rejects",
            "tests/auditor/test_sequential.py::test_calibrated_gaussian_mechanism_rarely_rejects",
            "tests/auditor/test_sequential.py::test_tight_randomized_response_rarely_rejects_but_a_smaller_claim_is_caught",
        ],
    ),
    "band_coin_8pct": (
        "coin",
        ("the trade-off band is moved above the claim curve with probability 0.08"),
        _band_coin,
        ["tests/auditor/test_tradeoff.py::test_band_covers_the_true_curve_at_every_alpha_at_once"],
    ),
    "band_confidence_0.92": (
        "natural",
        "trade-off band at confidence 0.92 where 0.95 is asked",
        _band_confidence,
        ["tests/auditor/test_tradeoff.py::test_band_covers_the_true_curve_at_every_alpha_at_once"],
    ),
    "estimate_bias_3pct": (
        "natural",
        "final_model_epsilon reads the seen cosines 3% too large",
        _estimate_bias,
        [
            "tests/auditor/test_fitted_and_null.py::test_final_model_estimate_recovers_the_calibrated_epsilon",
            "tests/auditor/test_gaussian.py::test_table2_setting_small_sample",
        ],
    ),
}


def pytest_configure(config):  # the plugin side: apply the plant named in the environment
    name = os.environ.get(_ENV)
    if name:
        PLANTS[name][2]()


def run(name: str) -> dict:
    kind, what, _, tests = PLANTS[name]
    env = dict(os.environ, **{_ENV: name})
    start = time.time()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "benchmarks.fidelity.plant_invalid",
            *tests,
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    failed = sorted(set(re.findall(r"^FAILED (\S+)", proc.stdout, flags=re.MULTILINE)))
    errors = re.findall(r"^ERROR (\S+)", proc.stdout, flags=re.MULTILINE)
    return {
        "plant": name,
        "kind": kind,
        "what": what,
        "tests": len(tests),
        "failed": failed,
        "errors": errors,
        "caught": bool(failed) and not errors,
        "seconds": time.time() - start,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plants", nargs="*", default=list(PLANTS))
    args = ap.parse_args(argv)
    print("| plant | kind | planted | caught | failing tests |")
    print("|---|---|---|---|---|")
    missed = 0
    for name in args.plants:
        res = run(name)
        missed += not res["caught"] and res["kind"] == "coin"
        names = ", ".join(f.split("::")[-1] for f in res["failed"]) or "none"
        if res["errors"]:
            names += f" (errors: {', '.join(res['errors'])})"
        print(
            f"| {name} | {res['kind']} | {res['what']} | {'yes' if res['caught'] else 'NO'} "
            f"| {names} |",
            flush=True,
        )
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
