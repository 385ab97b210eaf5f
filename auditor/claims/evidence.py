"""Evidence bundles, the pure part: canonical JSON, the seed commitment, and the recompute that
``flaudit verify`` runs on a bundle (issue #30; docs/evidence.md).

A bundle holds an ended audit's spec, claim, published per-canary statistics, recorded estimates,
alarm and verdict. :func:`recompute` runs the same code the service ran at the audit's final look
(:func:`flaudit.auditor.claims.summarize`, ``audit_analytic_epsilon``, the claim tests' alarm
and :func:`flaudit.auditor.claims.alerts.spec_verdict`) on the bundle's statistics and returns the
first field whose recorded value differs from the recomputed one by more than :data:`RTOL` /
:data:`ATOL`. Pure: a dict in, checks out; no files, no network, no keys.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..canaries import resolve_canary_family, seen_mask
from ..estimators import audit_analytic_epsilon
from ..estimators.gdp import gdp_epsilon
from ..noise_calibration import noise_clip_factor, signal_factor, with_noise_calibration
from ..results import ThreatModel, jsonable, number
from ..spec import AuditSpec
from ..statistics import scale_dof
from .alarm import ALARM_ALPHA, look_level
from .alerts import alarm_record, decide, num_looks, spec_claim, spec_verdict
from .curves import audit_claims
from .known_rounds import KnownRoundsState, KnownRoundsStatistic
from .summary import AuditLook, summarize

__all__ = [
    "ATOL",
    "BUNDLE_FORMAT",
    "CANONICALIZATION",
    "COMMITMENT_SCHEME",
    "RTOL",
    "Check",
    "Mismatch",
    "Recomputed",
    "COSINE_ARRAYS",
    "canonical_json",
    "cosine_summaries",
    "digest",
    "jsonable",
    "known_rounds_json",
    "recompute",
    "seed_commitment",
    "signed_part",
]

BUNDLE_FORMAT = "flaudit-evidence/1"
#: Relative and absolute tolerance of a recomputed number (another numpy/scipy build may differ in
#: the last digits of a root finder; a tampered number differs far more).
RTOL = 1e-6
ATOL = 1e-9
#: Bootstrap resamples of the service's final look (``live.summary_parts(final=True)``); a
#: bundle's ``statistics.bootstrap`` says how many its estimates used.
FINAL_BOOTSTRAP = 200
CANONICALIZATION = (
    "flaudit-jcs/1: UTF-8 JSON of the bundle without its 'signature' member, object keys sorted "
    "by code point, no whitespace, non-ASCII characters unescaped, numbers as Python's repr "
    "(shortest round-trip), non-finite numbers written as the strings 'inf', '-inf', 'nan' "
    "(RFC 8785 for every bundle whose numbers are integers or print alike in both)"
)
COMMITMENT_SCHEME = "sha256(salt || seed as 16 bytes big-endian), hex"
#: The per-canary statistics a bundle carries (``statistics.<name>``, k numbers each, or null).
COSINE_ARRAYS = ("max_cosines", "last_cosines", "final_cosines", "final_model_cosines")


def signed_part(bundle: dict) -> dict:
    """The bundle without its ``signature`` member: what the signature covers."""
    return {key: value for key, value in bundle.items() if key != "signature"}


def canonical_json(document: Any) -> bytes:
    """The canonical bytes of ``document`` (:data:`CANONICALIZATION`)."""
    return json.dumps(
        jsonable(document),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    ).encode("utf-8")


def digest(bundle: dict) -> str:
    """``sha256:<hex>`` of the canonical form of the signed part of ``bundle``."""
    return "sha256:" + hashlib.sha256(canonical_json(signed_part(bundle))).hexdigest()


def seed_commitment(seed: int, salt: bytes) -> str:
    """The commitment to a 128-bit canary seed (:data:`COMMITMENT_SCHEME`)."""
    return hashlib.sha256(bytes(salt) + int(seed).to_bytes(16, "big")).hexdigest()


def known_rounds_json(state: KnownRoundsState | None) -> dict | None:
    """A known-rounds state as a bundle carries it (``statistics.known_rounds``)."""
    if state is None:
        return None
    return {
        "sums": state.sums,
        "counts": state.counts,
        "num_rounds": state.num_rounds,
        "round_sums": state.round_sums,
        "round_counts": state.round_counts,
        # each round's signal factor under the claim (empty: all 1), issue #38
        "round_factors": state.round_factors,
    }


def _group_summary(values: np.ndarray) -> dict:
    if values.size == 0:
        return {"count": 0, "mean": None, "sd": None, "min": None, "max": None}
    with np.errstate(invalid="ignore"):  # (-inf before a canary's first round)
        return {
            "count": int(values.size),
            "mean": float(np.mean(values)),
            "sd": float(np.std(values)),
            "min": float(np.min(values)),
            "max": float(np.max(values)),
        }


def cosine_summaries(stats: dict) -> dict:
    """Per statistic of :data:`COSINE_ARRAYS` the bundle carries, the count, mean, standard
    deviation, smallest and largest value over the seen and over the unseen canaries (over
    ``all`` when the split is not in the bundle): what a reader compares at a glance, and what
    ``flaudit verify`` recomputes from the per-canary numbers, so that a number edited in any of
    them (``final_model_cosines`` and ``last_cosines`` included, which no estimate reads) shows
    as a mismatch even under a signature made after the edit (issue #40)."""
    seen = stats.get("seen")
    mask = None if seen is None else np.asarray(seen, dtype=bool)
    out: dict = {}
    for name in COSINE_ARRAYS:
        values = _array(stats.get(name))
        if values is None:
            continue
        if mask is None or mask.shape != values.shape:
            out[name] = {"all": _group_summary(values)}
        else:
            out[name] = {
                "seen": _group_summary(values[mask]),
                "unseen": _group_summary(values[~mask]),
            }
    return jsonable(out)


def _check_cosines(result: Recomputed, stats: dict) -> None:
    """The per-canary statistics against what they imply of each other and their summaries:
    a canary's last-round cosine is at most its maximum over rounds, the maxima at the alarm's
    look at most the final maxima (a running maximum only grows), and ``cosine_summaries``
    recomputed from the arrays."""
    maxima, last = _array(stats.get("max_cosines")), _array(stats.get("last_cosines"))
    at_look = stats.get("alarm_statistics") or {}
    for name, lower, upper, what in (
        ("statistics.last_cosines", last, maxima, "max_cosines"),
        (
            "statistics.alarm_statistics.max_cosines",
            _array(at_look.get("max_cosines")),
            maxima,
            "max_cosines",
        ),
    ):
        if lower is None or upper is None or not stats.get("rounds_stored"):
            continue
        if lower.shape != upper.shape:
            _check(result, f"{name} (length)", lower.size, upper.size)
            continue
        above = np.flatnonzero(lower > upper)
        result.checks.append(Check(f"{name} <= statistics.{what}", above.size == 0))
        if above.size and result.mismatch is None:
            j = int(above[0])
            result.mismatch = Mismatch(
                f"{name}[{j}] (at most statistics.{what}[{j}])",
                float(lower[j]),
                float(upper[j]),
            )
    if "cosine_summaries" not in stats:
        result.checks.append(
            Check(
                "statistics.cosine_summaries",
                None,
                "not in this bundle (made before they existed): final_model_cosines and "
                "last_cosines, which no estimate reads, are covered by the signature only",
            )
        )
        return
    _check(
        result,
        "statistics.cosine_summaries",
        stats.get("cosine_summaries"),
        cosine_summaries(stats),
        "recomputed from the per-canary statistics",
    )


@dataclass(frozen=True)
class Mismatch:
    """The first field whose recorded value is not the recomputed one."""

    field: str
    recorded: Any
    recomputed: Any

    def __str__(self) -> str:
        return f"{self.field}: recorded {self.recorded!r}, recomputed {self.recomputed!r}"


@dataclass(frozen=True)
class Check:
    """One part of a bundle checked (``ok``), or not checkable from the bundle (``ok=None``)."""

    name: str
    ok: bool | None
    note: str = ""


@dataclass
class Recomputed:
    """What :func:`recompute` found: the checks in order and the first mismatch (None: all the
    recomputed parts match)."""

    checks: list[Check] = field(default_factory=list)
    mismatch: Mismatch | None = None
    commitment_failed: bool = False

    @property
    def ok(self) -> bool:
        return self.mismatch is None


def _is_nan(value: Any) -> bool:
    return (isinstance(value, str) and value == "nan") or (
        isinstance(value, float) and math.isnan(value)
    )


def _close(a: float, b: float) -> bool:
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=RTOL, abs_tol=ATOL)


def first_difference(recorded: Any, recomputed: Any, path: str) -> Mismatch | None:
    """The first place (depth first, keys sorted) where two JSON values differ beyond the
    tolerance."""
    if _is_nan(recorded) and _is_nan(recomputed):
        return None
    a, b = number(recorded), number(recomputed)
    if a is not None and b is not None:
        return None if _close(a, b) else Mismatch(path, recorded, recomputed)
    if isinstance(recorded, dict) and isinstance(recomputed, dict):
        for key in sorted(set(recorded) | set(recomputed)):
            found = first_difference(recorded.get(key), recomputed.get(key), f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(recorded, list) and isinstance(recomputed, list):
        if len(recorded) != len(recomputed):
            return Mismatch(f"{path} (length)", len(recorded), len(recomputed))
        for i, (x, y) in enumerate(zip(recorded, recomputed)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    return None if recorded == recomputed else Mismatch(path, recorded, recomputed)


def _array(values, dtype=np.float64) -> np.ndarray | None:
    if values is None:
        return None
    return np.asarray([float(v) if isinstance(v, str) else v for v in values], dtype=dtype)


def _known_rounds(stats: dict, k: int, dim: int, dof: int):
    state = stats.get("known_rounds")
    if state is None:
        return None
    return KnownRoundsStatistic(
        k,
        dim=dim,
        scale_dof=dof,
        state=KnownRoundsState(
            sums=_array(state["sums"]),
            counts=_array(state["counts"], np.int64),
            num_rounds=int(state["num_rounds"]),
            round_sums=_array(state["round_sums"]),
            round_counts=_array(state["round_counts"], np.int64),
            round_factors=_array(state.get("round_factors") or []),
        ),
    )


def _check(result: Recomputed, name: str, recorded: Any, recomputed: Any, note: str = "") -> bool:
    found = first_difference(recorded, recomputed, name)
    result.checks.append(Check(name, found is None, note))
    if found is not None and result.mismatch is None:
        result.mismatch = found
    return found is None


def _check_seed(result: Recomputed, bundle: dict, seen: np.ndarray, k: int) -> None:
    canary_seed = bundle.get("canary_seed") or {}
    commitment, salt, seed = (
        canary_seed.get("commitment"),
        canary_seed.get("salt"),
        canary_seed.get("seed"),
    )
    if commitment is None:
        result.checks.append(
            Check(
                "canary_seed",
                None,
                "no commitment (audit created before "
                "commitments existed): the split is not checked",
            )
        )
        return
    if seed is None:
        result.checks.append(
            Check(
                "canary_seed",
                None,
                "seed not revealed (spec reveal_seed off): the seen/unseen split is not checked",
            )
        )
        return
    if seed_commitment(int(seed), bytes.fromhex(salt)) != commitment:
        result.commitment_failed = True
        _check(
            result,
            "canary_seed.commitment",
            commitment,
            seed_commitment(int(seed), bytes.fromhex(salt)),
        )
        return
    _check(
        result,
        "statistics.seen",
        [bool(x) for x in seen],
        [bool(x) for x in seen_mask(int(seed), k)],
        "the revealed seed matches its commitment and gives this split",
    )


def _recompute_early_alarm(
    result: Recomputed,
    spec: AuditSpec,
    alarm: dict,
    at_look: dict,
    seen: np.ndarray,
    dim: int,
    stats: dict,
) -> None:
    """The alarm of look t < T from the statistics the service kept of that look: the
    all-iterates claim tests as the service ran them after round t (``live.ingest_round``)."""
    t, k = int(at_look["round"]), spec.num_canaries
    family = resolve_canary_family(spec.canary_family, num_canaries=k, dim=dim)
    dof = scale_dof(family, num_canaries=k, dim=dim)
    known = _known_rounds(at_look, k, dim, dof)
    tests: list = []
    if ThreatModel.all_iterates in spec.threat_models:
        tests = list(
            summarize(
                AuditLook(
                    seen=seen,
                    dim=dim,
                    delta=spec.delta,
                    max_cosines=_array(at_look["max_cosines"]),
                    final_cosines=None,
                    threat_models=[ThreatModel.all_iterates.value],
                    one_run=True,
                    bootstrap=0,
                    known_rounds_scores=None if known is None else known.scores,
                    known_rounds_participations=None if known is None else known.num_participations,
                    known_rounds_rounds=None
                    if known is None
                    else known.rounds_at(_influence(stats, upto=t)),
                    canary_repeats=spec.canary_repeats,
                    claims=audit_claims(
                        spec,
                        weight_factor=_canary_weight(stats, upto=t),
                        noise_clip_factor=_least_noise_factor(stats, upto=t),
                    ),
                    num_rounds=t,
                    scale_dof=dof,
                )
            ).claim_tests
        )
    recomputed = jsonable(
        alarm_record(
            decide(
                spec,
                tests,
                look=t,
                weight_factor=_canary_weight(stats, upto=t),
                noise_clip_factor=_least_noise_factor(stats, upto=t),
            ),
            round=t,
        )
    )
    _check(
        result,
        "alarm",
        alarm,
        recomputed,
        f"fired at round {t}: recomputed from that look's statistics",
    )


def _check_early_alarm(result: Recomputed, spec: AuditSpec, alarm: dict) -> None:
    """An alarm of look t < T: its p-value came from round t's statistics, which the bundle does
    not hold (only their running maxima); what follows from the spec is checked: the number of
    looks, the level of the test at that look, the p-value under it, the confidence and the ε of
    its μ_lo at the spec's δ."""
    by = alarm.get("refuted_by") or {}
    looks = num_looks(spec)
    recorded = {
        "num_looks": alarm.get("num_looks"),
        "level": by.get("level"),
        "confidence": by.get("confidence"),
        "epsilon_lo": by.get("epsilon_lo"),
        "p_value_within_level": by.get("p_value") is not None
        and by.get("level") is not None
        and by["p_value"] <= by["level"],
    }
    try:
        level = look_level(by.get("test"), int(alarm.get("look")), looks)
    except (TypeError, ValueError):
        level = None
    mu_lo = by.get("mu_lo")
    recomputed = {
        "num_looks": looks,
        "level": level,
        "confidence": 1.0 - ALARM_ALPHA,
        "epsilon_lo": None if mu_lo is None else float(gdp_epsilon(mu_lo, spec.delta)),
        "p_value_within_level": True,
    }
    found = first_difference(recorded, recomputed, "alarm.refuted_by")
    result.checks.append(
        Check(
            "alarm",
            found is None,
            (
                f"fired at round {alarm['round']}: its p-value came from that round's statistics, which "
                "the bundle does not hold, so the p-value is taken as recorded; its look, level, "
                "confidence and ε are recomputed"
            ),
        )
    )
    result.mismatch = result.mismatch or found


def recompute(bundle: dict) -> Recomputed:
    """Recompute every checkable part of ``bundle`` from its spec and statistics.

    Parameters
    ----------
    bundle : dict
        A parsed evidence bundle (format :data:`BUNDLE_FORMAT`).

    Returns
    -------
    Recomputed
        The checks in order and the first mismatch.

    Raises
    ------
    ValueError
        If the bundle is not an evidence bundle or its spec is invalid.
    """
    if bundle.get("format") != BUNDLE_FORMAT:
        raise ValueError(f"not an evidence bundle of format {BUNDLE_FORMAT!r}")
    result = Recomputed()
    spec = AuditSpec.model_validate(bundle["spec"])
    stats = bundle["statistics"]
    k, dim = spec.num_canaries, stats.get("dim")
    seen = np.asarray(stats["seen"], dtype=bool) if stats.get("seen") is not None else None
    if seen is not None:
        _check_seed(result, bundle, seen, k)
    claim, recorded_claim = spec_claim(spec), bundle.get("claim")
    if claim is None or recorded_claim is None:
        _check(result, "claim", recorded_claim, claim)
    else:  # the numbers first: a changed spec shows as the claim's mu it implies
        found = next(
            (
                m
                for m in (
                    first_difference(recorded_claim.get(key), claim[key], f"claim.{key}")
                    for key in ("mu", "epsilon", "delta", "description")
                )
                if m is not None
            ),
            None,
        )
        result.checks.append(Check("claim", found is None, "recomputed from the spec"))
        result.mismatch = result.mismatch or found
    _check(result, "statistics.delta", stats.get("delta"), spec.delta)
    analytic = jsonable([e.to_dict() for e in audit_analytic_epsilon(spec)])
    recorded_estimates = bundle.get("estimates") or []
    estimates = recorded_estimates
    tests: list = []
    if dim and seen is not None and stats.get("has_final"):
        family = resolve_canary_family(spec.canary_family, num_canaries=k, dim=int(dim))
        dof = scale_dof(family, num_canaries=k, dim=int(dim))
        _check(result, "statistics.scale_dof", stats.get("scale_dof"), dof)
        max_cosines = _array(stats.get("max_cosines")) if stats.get("rounds_stored") else None
        wanted = [tm.value for tm in spec.threat_models]
        if max_cosines is None:
            wanted = [tm for tm in wanted if tm != ThreatModel.all_iterates.value]
        known = None
        if ThreatModel.all_iterates.value in wanted:
            known = _known_rounds(stats, k, int(dim), dof)
        computed: list = []
        diagnostics: list = []
        if wanted:
            summary = summarize(
                AuditLook(
                    seen=seen,
                    dim=int(dim),
                    delta=spec.delta,
                    max_cosines=max_cosines if ThreatModel.all_iterates.value in wanted else None,
                    final_cosines=_array(stats.get("final_cosines"))
                    if ThreatModel.final_model.value in wanted
                    else None,
                    threat_models=wanted,
                    one_run=True,
                    bootstrap=int(stats.get("bootstrap", FINAL_BOOTSTRAP)),
                    known_rounds_scores=None if known is None else known.scores,
                    known_rounds_participations=None if known is None else known.num_participations,
                    known_rounds_rounds=None
                    if known is None
                    else known.rounds_at(_influence(stats)),
                    canary_repeats=spec.canary_repeats,
                    claims=audit_claims(
                        spec,
                        weight_factor=_canary_weight(stats),
                        noise_clip_factor=_least_noise_factor(stats),
                    ),
                    num_rounds=int(stats.get("rounds_stored") or 0),
                    scale_dof=dof,
                )
            )
            computed = jsonable([e.to_dict() for e in summary.estimates])
            diagnostics = jsonable([d.to_dict() for d in summary.diagnostics])
            tests = list(summary.claim_tests)
        estimates = computed + analytic
        _check(result, "estimates", recorded_estimates, estimates)
        _check(result, "diagnostics", bundle.get("diagnostics") or [], diagnostics)
    else:
        result.checks.append(
            Check(
                "estimates",
                None,
                "the run ended before its final model: "
                "the estimates of its last round are not recomputed",
            )
        )
        _check(
            result,
            "estimates (analytic)",
            [e for e in recorded_estimates if e.get("estimator") == "analytic"],
            analytic,
        )
    alarm = bundle.get("alarm")
    at_look = stats.get("alarm_statistics")
    if (
        alarm is not None
        and alarm.get("round") is not None
        and at_look is not None
        and dim
        and seen is not None
    ):
        _recompute_early_alarm(result, spec, alarm, at_look, seen, int(dim), stats)
    elif alarm is not None and alarm.get("round") is not None:
        _check_early_alarm(result, spec, alarm)
    elif dim and seen is not None and stats.get("has_final"):
        final = alarm_record(
            decide(
                spec,
                tests,
                look=num_looks(spec),
                weight_factor=_canary_weight(stats),
                noise_clip_factor=_least_noise_factor(stats),
            ),
            round=None,
        )
        _check(result, "alarm", alarm, jsonable(final))
        alarm = final
    gaps = stats.get("gaps") or []
    weights = [
        r.get("weight_factor")
        for r in stats.get("rounds") or []
        if r.get("weight_factor") is not None
    ]
    _check(
        result,
        "statistics.max_weight_factor",
        stats.get("max_weight_factor"),
        max(weights) if weights else None,
    )
    if "max_canary_weight_factor" in stats:
        _check(
            result,
            "statistics.max_canary_weight_factor",
            stats.get("max_canary_weight_factor"),
            _canary_weight(stats),
        )
    verdict = spec_verdict(
        spec,
        alarm=alarm,
        estimates=estimates,
        state=bundle["audit"]["status"],
        rounds_received=int(stats.get("rounds_stored") or 0),
        missing_rounds=[g["round"] for g in gaps if g.get("kind") == "not_reported"],
        rounds_without_canaries=[g["round"] for g in gaps if g.get("kind") == "no_canaries"],
        weight_factor=stats.get("max_weight_factor"),
        canary_weight_factor=_canary_weight(stats),
        dim=stats.get("dim"),
        noise_clip_factor=_least_noise_factor(stats),
    )
    least = _least_noise_factor(stats)
    if "min_noise_clip_factor" in stats:
        _check(
            result, "statistics.min_noise_clip_factor", stats.get("min_noise_clip_factor"), least
        )
    _check(
        result,
        "verdict",
        bundle.get("verdict"),
        jsonable(with_noise_calibration(verdict.to_dict(), spec, least)),
    )
    _check_cosines(result, stats)  # last: an estimate or alarm an edit changed is named first
    return result


def _canary_weight(stats: dict, upto: int | None = None) -> float | None:
    """The heaviest influence a canary carried (rounds ``<= upto``): the largest weight factor
    of a round that inserted canaries; the claim tests run there (docs/estimators.md,
    "Weighted FedAvg: two answers")."""
    weights = [
        float(r["weight_factor"])
        for r in stats.get("rounds") or []
        if r.get("weight_factor") is not None
        and int(r.get("num_canaries_inserted") or 0) > 0
        and (upto is None or int(r.get("round") or 0) <= upto)
    ]
    return max(weights) if weights else None


def check_field(
    result: Recomputed, name: str, recorded: Any, recomputed: Any, note: str = ""
) -> bool:
    """Compare one recorded field with its recomputation into ``result`` (the first mismatch is
    kept): for other bundles' recomputations (the record-level one,
    :mod:`flaudit.auditor.claims.record_evidence`)."""
    return _check(result, name, recorded, recomputed, note)


def check_seed(result: Recomputed, bundle: dict, seen: np.ndarray, k: int) -> None:
    """The revealed seed against its commitment, then the seen set it gives, into ``result``
    (not checked without a commitment or a revealed seed)."""
    _check_seed(result, bundle, seen, k)


def _least_noise_factor(stats: dict, upto: int | None = None) -> float | None:
    """The smallest round ``noise_clip_norm / clip_norm`` (rounds ``<= upto``; None: none
    reported), as the service keeps it (``min_noise_clip_factor``)."""
    factors = [
        noise_clip_factor(r.get("clip_norm"), r.get("noise_clip_norm"))
        for r in stats.get("rounds") or []
        if upto is None or int(r.get("round") or 0) <= upto
    ]
    return min((f for f in factors if f is not None), default=None)


def _influence(stats: dict, upto: int | None = None) -> float:
    """The influence the claims were tested at (rounds ``<= upto``): the heaviest weight a
    canary carried over the smallest noise factor (:func:`signal_factor`), as the service did."""
    return signal_factor(_canary_weight(stats, upto), _least_noise_factor(stats, upto))
