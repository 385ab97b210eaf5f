"""The evidence of a record-level audit (issue #37): what ``flaudit run --evidence`` writes for a
record-level spec and what ``flaudit verify`` recomputes from it.

The bundle (``"level": "record"``, format :data:`flaudit.auditor.claims.evidence.BUNDLE_FORMAT`)
carries the spec, the claim, the design, and per look every canary's score with its projections
in noise and shift units and its claimed signal (the alarm's test weights: the inclusions of the
seen canaries, hence published only with the seen set); the seen set, secret while the audit
runs, is in the bundle only once it has ended, and the canary seed with its salt only when the
spec sets ``reveal_seed`` (then its commitment, printed before training, is checked and the seen
set recomputed from it).
:func:`recompute_record` recomputes the design, the claim (dp-accounting; Opacus's accountant is
reported, not recomputed), every look's alarm, the cause and the verdict.
"""

from __future__ import annotations

import math

import numpy as np

from ..estimators.record_level import record_level_epsilon
from ..record_spec import RecordLevelSpec, RecordServiceSpec
from .evidence import BUNDLE_FORMAT, Check, Recomputed, check_field, check_seed
from .record_alarm import RecordLooks, record_design
from .record_external import (
    record_external_cause,
    record_external_look,
    record_external_verdict,
)

__all__ = ["is_record_bundle", "recompute_record"]


def is_record_bundle(bundle: object) -> bool:
    """Whether ``bundle`` is the evidence of a record-level audit."""
    return isinstance(bundle, dict) and bundle.get("level") == "record"


def _floats(values) -> np.ndarray:
    return np.asarray([float(v) if isinstance(v, str) else v for v in values], dtype=np.float64)


def recompute_record(bundle: dict) -> Recomputed:
    """Recompute every checkable part of a record-level bundle (ValueError: not one)."""
    if bundle.get("format") != BUNDLE_FORMAT or not is_record_bundle(bundle):
        raise ValueError(f"not a record-level evidence bundle of format {BUNDLE_FORMAT!r}")
    if bundle.get("spec", {}).get("engine") == "external":
        return _recompute_service(bundle)
    result = Recomputed()
    spec = RecordLevelSpec.model_validate(bundle["spec"])
    stats = bundle["statistics"]
    k, z = spec.num_canaries, spec.noise_multiplier
    seen = np.asarray(stats["seen"], dtype=bool)
    if seen.size != k:
        raise ValueError(f"statistics.seen has {seen.size} entries for {k} canaries")
    check_seed(result, bundle, seen, k)
    if result.commitment_failed:
        return result
    q, per_round = float(stats["sample_rate"]), int(stats["steps_per_round"])
    num_looks = spec.num_rounds + 1
    design = record_design(
        num_canaries=k,
        noise_multiplier=z,
        sample_rate=q,
        steps=per_round * spec.num_rounds,
        delta=spec.delta,
        num_looks=num_looks,
    )
    check_field(result, "design", bundle["design"], design)
    claim = []
    if z > 0:
        claim = [
            e.to_dict()
            for e in record_level_epsilon(
                z, q, per_round, spec.delta, rounds_trained=spec.num_rounds
            )
        ]
        recorded = [row for row in bundle["claim"] if row.get("accountant") != "opacus_rdp"]
        check_field(result, "claim", recorded, claim)
        result.checks.append(
            Check("claim (Opacus's accountant)", None, "reported beside, not recomputed")
        )
    judged = RecordLooks(
        seen,
        np.arange(k) % spec.num_clients,  # canary j lives in client j mod N
        noise_multiplier=z,
        sample_rate=q,
        num_looks=num_looks,
        delta=spec.delta,
    )
    for entry in stats["looks"]:
        judged.add(
            entry["round"],
            int(entry["look"]),
            cosines=_floats(entry["scores"]),
            signals=_floats(entry["signals"]),
            dim=int(stats["dim"]),
            steps=int(entry["steps"]),
            noise_units=_floats(entry["noise_units"]),
            shift_units=_floats(entry["shift_units"]),
        )
    check_field(result, "looks", bundle["looks"], judged.looks)
    check_field(result, "cause", bundle.get("cause"), judged.cause)
    run_epsilon = min((row["epsilon"] for row in claim), default=math.inf)
    verdict = judged.verdict(design=design, run_epsilon=run_epsilon)
    check_field(result, "verdict", bundle["verdict"], verdict)
    return result


def _recompute_service(bundle: dict) -> Recomputed:
    """A record-level audit the service ran for a Flower app (``"engine": "external"``): every
    look from its stored scores and claimed signals (the exact claim test's weights) and the
    clients' claims at that look (each client with its own DP parameters,
    :mod:`flaudit.auditor.claims.record_external`), the cause at the first
    alarm, the design from its recorded inputs, the claim over the run and the verdict."""
    result = Recomputed()
    spec = RecordServiceSpec.model_validate(bundle["spec"])
    stats = bundle["statistics"]
    k = spec.num_canaries
    seen = np.asarray(stats["seen"], dtype=bool)
    owner = np.asarray(stats["owner"], dtype=np.int64)
    if seen.size != k or owner.size != k:
        raise ValueError(f"statistics.seen and owner must have {k} entries")
    check_seed(result, bundle, seen, k)
    if result.commitment_failed:
        return result
    recorded_design = bundle.get("design")
    design = None
    if recorded_design is not None and "inputs" in recorded_design:
        inputs = recorded_design["inputs"]
        design = {**record_design(**inputs), "inputs": inputs}
        check_field(result, "design", recorded_design, design)
    by_round = {int(r["round"]): r for r in stats["rounds"]}
    last = by_round[max(by_round)] if by_round else None
    looks, cause = [], None
    for entry in bundle["looks"]:
        source = last if entry["round"] is None else by_round[int(entry["round"])]
        claims = entry["claims"]
        if source.get("signals") is None:
            raise ValueError(
                f"statistics.rounds of round {source['round']} has no signals: the exact claim "
                "test cannot be recomputed"
            )
        look = record_external_look(
            _floats(source["scores"]),
            seen,
            owner,
            claims,
            signals=_floats(source["signals"]),
            dim=int(stats["dim"]),
            look=int(entry["look"]),
            num_looks=spec.num_rounds + 1,
            delta=spec.delta,
        )
        look["round"] = entry["round"]
        look["claims"] = claims
        looks.append(look)
        if cause is None and look["status"] == "error":
            cause = record_external_cause(
                _floats(source["noise_units"]), _floats(source["shift_units"]), seen, owner, look
            )
    check_field(result, "looks", bundle["looks"], looks)
    check_field(result, "cause", bundle.get("cause"), cause)
    final_claims = looks[-1]["claims"] if looks else []
    claim, verdict = record_external_verdict(
        looks, final_claims, cause=cause, design=design, delta=spec.delta
    )
    check_field(result, "claim", bundle["claim"], claim)
    check_field(result, "verdict", bundle["verdict"], verdict)
    return result
