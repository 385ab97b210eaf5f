"""Typed results: every number says which estimator, threat model, variance treatment,
correction and confidence produced it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import Enum, StrEnum
from typing import Any

import numpy as np

__all__ = [
    "ThreatModel",
    "Estimator",
    "VarianceTreatment",
    "Correction",
    "EpsilonResult",
    "Diagnostic",
    "jsonable",
    "number",
]


class ThreatModel(StrEnum):
    """What the adversary sees, for every number the audit reports (one type everywhere).

    A spec chooses among ``final_model`` and ``all_iterates``; claims add the accountants' models
    (``known_rounds``: a canary in known rounds; ``poisson_subsampled``: Poisson-sampled
    DP-FedAvg), and the Gaussian-mechanism audit reports ``gaussian_mechanism``.
    """

    final_model = "final_model"
    all_iterates = "all_iterates"
    known_rounds = "known_rounds"
    poisson_subsampled = "poisson_subsampled"
    gaussian_mechanism = "gaussian_mechanism"


class Estimator(str, Enum):
    two_gaussian = "two_gaussian"  # Andrew et al. §3.2 between fitted Gaussians
    lower_bound = "lower_bound"  # epsilon_lo, Andrew et al. §5.1 (Jeffreys intervals)
    one_run = "one_run"  # Steinke et al. 2023 Thm 3.1
    analytic = "analytic"  # dp-accounting
    sequential = "sequential"  # González et al. 2025 test by betting
    gdp_lower_bound = "gdp_lower_bound"  # mu_lo from threshold tests, read as epsilon at delta
    fdp_one_run = "fdp_one_run"  # Mahloujifar, Melis & Chaudhuri 2025 guessing game, GDP curves
    normal_scores = "normal_scores"  # mu_lo from the normal-score claim test (exact null)


class VarianceTreatment(str, Enum):
    fitted = "fitted"  # sigma-hat fitted to the seen canaries
    null = "null"  # sigma-hat^2 = 1/d (Thm 3.3 limit)
    not_applicable = "n/a"


class Correction(str, Enum):
    none = "none"  # max over thresholds, no correction (the paper's)
    bonferroni = "bonferroni"  # over the thresholds / (k+, k-) grid tried
    split = "split"  # threshold chosen on one half, bound computed on the other
    not_applicable = "n/a"


@dataclass(frozen=True)
class EpsilonResult:
    """One epsilon with its provenance. ``epsilon`` may be ``math.inf`` (nothing private) or
    0.0 (no evidence of leakage); never NaN."""

    epsilon: float
    estimator: Estimator
    threat_model: ThreatModel | str  # a ThreatModel; an accountant name for analytic results
    delta: float
    variance: VarianceTreatment = VarianceTreatment.not_applicable
    correction: Correction = Correction.not_applicable
    confidence: float | None = None  # e.g. 0.95 for lower bounds; None for point estimates
    method: str = ""  # one line a user can read
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if math.isnan(self.epsilon):
            raise ValueError("epsilon must not be NaN")

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict (:func:`jsonable`: inf becomes the string "inf")."""
        out = asdict(self)
        for key in ("estimator", "variance", "correction"):
            out[key] = getattr(self, key).value
        out["epsilon"] = jsonable(self.epsilon)
        out["details"] = jsonable(self.details)
        return out


@dataclass(frozen=True)
class Diagnostic:
    """A check of the estimators' assumptions, with a plain-language hint."""

    name: str
    value: float
    ok: bool
    hint: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["value"] = jsonable(self.value)
        out["details"] = jsonable(self.details)
        return out


# -- the one JSON convention for numbers --------------------------------------------------------
# Every dict the project hands to JSON (results, claim tests, verdicts, evidence bundles, API
# responses) goes through ``jsonable``: JSON has no NaN or Infinity, so a non-finite float is
# written as the string "inf", "-inf" or "nan". ``number`` reads such a value back: infinities
# are numbers (an unbounded epsilon says something), NaN is no number (None), as is anything
# that is not a number (a bool, None, another string).


def jsonable(value: Any) -> Any:
    """``value`` as strict JSON data: numpy scalars and arrays to Python numbers and lists,
    tuples to lists, enums to their values, mapping keys to strings, and non-finite floats to
    the strings ``"inf"``, ``"-inf"``, ``"nan"``; everything else unchanged."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return [jsonable(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def number(value: Any, *, finite: bool = False) -> float | None:
    """The float a JSON value written by :func:`jsonable` stands for, or None.

    An int or float (not a bool) is itself, the strings ``"inf"`` and ``"-inf"`` are the
    infinities; NaN (the float or ``"nan"``) and any other value are None: no number.
    ``finite=True``: the infinities are None too (a value to plot or add up).
    """
    numeric = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, bool
    )
    if not numeric and not (isinstance(value, str) and value in ("inf", "-inf")):
        return None
    out = float(value)
    return None if math.isnan(out) or (finite and math.isinf(out)) else out
