"""Files ``flaudit run`` writes beside its report (issue #30): ``--evidence FILE``, the audit's
evidence bundle (the service's format, unsigned: no service key signs a local run; check it with
``flaudit verify FILE --allow-unsigned``), and ``--junit FILE``, JUnit XML with one test case per
claim test, so CI systems show the audit like a test suite.
"""

from __future__ import annotations

import hashlib
import secrets
import sys
import xml.etree.ElementTree as ET
from datetime import UTC, datetime

from ..auditor.claims.alerts import first_alarm, spec_claim
from ..auditor.claims.evidence import (
    BUNDLE_FORMAT,
    COMMITMENT_SCHEME,
    cosine_summaries,
    jsonable,
    known_rounds_json,
    seed_commitment,
)
from ..service.evidence import versions

__all__ = ["commit", "junit_xml", "run_bundle"]


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def print_invalid_spec(what: str, error) -> None:
    """``flaudit run: invalid <what>:`` and one line per field of a pydantic ValidationError, on
    stderr."""
    print(f"flaudit run: invalid {what}:", file=sys.stderr)
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "spec"
        print(f"  {where}: {item['msg']}", file=sys.stderr)


def print_run_error(error: TimeoutError | ValueError) -> int:
    """Why the engine stopped, on stderr, and ``flaudit run``'s exit status for it: 1 for a
    timeout, 2 for a bad argument or a spec the engine cannot satisfy."""
    if isinstance(error, TimeoutError):
        print(f"flaudit run: {error}", file=sys.stderr)
        return 1
    print(f"flaudit run: error: {error}", file=sys.stderr)
    return 2


def commit(seed: int) -> dict:
    """A commitment to a run's seed, made before training (its salt kept for the bundle)."""
    salt = secrets.token_bytes(16)
    return {
        "scheme": COMMITMENT_SCHEME,
        "commitment": seed_commitment(seed, salt),
        "committed_at": _now(),
        "salt": salt.hex(),
    }


def run_bundle(
    *,
    spec,
    seed: int,
    commitment: dict,
    reporter,
    summary,
    estimates,
    alerts,
    verdict,
    bootstrap: int,
    started_at: str,
) -> dict:
    """The unsigned evidence bundle of one ``flaudit run`` (what
    :func:`flaudit.auditor.claims.evidence.recompute` reads)."""
    local = reporter.inner
    tracker, known = local.tracker, local.known_rounds
    rounds = [
        {
            "round": t,
            "clip_norm": m.clip_norm,
            "cohort_size": m.cohort_size,
            "num_canaries_inserted": m.num_canaries_inserted,
            "num_failures": m.num_failures,
            "clipped_fraction": m.clipped_fraction,
            "noise_stddev": m.noise_stddev,
            "weight_factor": m.weight_factor,
        }
        for t, m in local.rounds
    ]
    weights = [r["weight_factor"] for r in rounds if r["weight_factor"] is not None]
    reveal = bool(spec.reveal_seed)
    verdict_dict = jsonable(verdict.to_dict())
    claim = spec_claim(spec)
    statistics = jsonable(
        {
            "dim": tracker.dim,
            "scale_dof": tracker.scale_dof,
            "delta": spec.delta,
            "num_canaries": spec.num_canaries,
            "rounds_stored": tracker.num_rounds,
            "has_final": tracker.final_cosines is not None,
            "bootstrap": int(bootstrap),
            "seen": reporter.seen,
            "max_cosines": tracker.max_cosines,
            "last_cosines": None,
            "final_cosines": tracker.final_cosines,
            "final_model_cosines": tracker.final_model_cosines,
            "known_rounds": known_rounds_json(None if known is None else known.state()),
            "rounds": rounds,
            "gaps": [],
            "max_weight_factor": max(weights) if weights else None,
            # the look at which the alarm first fired during training: verify recomputes its
            # p-value from them instead of taking it as recorded
            "alarm_statistics": reporter.alarm_statistics,
        }
    )
    bundle = {
        "format": BUNDLE_FORMAT,
        "audit": {"id": None, "name": spec.name, "status": "succeeded", "reason": None},
        "spec": spec.model_dump(mode="json"),
        "claim": None
        if claim is None
        else {**claim, "read_from": "from the audit spec (flaudit run: flaudit's own DP-FedAvg)"},
        "statistics": {**statistics, "cosine_summaries": cosine_summaries(statistics)},
        "alarm": first_alarm(alerts),
        "verdict": verdict_dict,
        "estimates": jsonable([e.to_dict() for e in estimates]),
        "diagnostics": jsonable([d.to_dict() for d in summary.diagnostics]),
        "canary_seed": {
            **commitment,
            "salt": commitment["salt"] if reveal else None,
            "seed": str(seed) if reveal else None,
        },
        "versions": versions(),
        "times": {"created_at": started_at, "started_at": started_at, "finished_at": _now()},
    }
    return jsonable(bundle)


def _case_name(test: dict) -> str:
    claim = test.get("claim") or {}
    kind = (test.get("details") or {}).get("test") or test.get("method") or "claim test"
    return (
        f"{claim.get('threat_model') or claim.get('kind')} claim "
        f"({claim.get('description') or claim.get('kind')}): {kind} on the "
        f"{test.get('threat_model')} statistics"
    )


def junit_xml(*, spec, summary, alerts, verdict, seconds: float) -> bytes:
    """JUnit XML: one ``testcase`` per claim test of the final look (p-value, claim, statistic
    as properties). The test that refuted the claim (the alarm's ``refuted_by``; the first case if
    the alarm's test is not among them) fails with the verdict sentence; every other case
    passes, so a refuted claim shows as exactly one failure."""
    tests = [jsonable(t.to_dict()) for t in summary.claim_tests]
    verdict = jsonable(verdict.to_dict())
    alarm = first_alarm(alerts)
    refuted = verdict.get("status") == "claim_refuted"
    by = (alarm or {}).get("refuted_by") or {}
    failing = None
    if refuted:
        failing = next(
            (
                i
                for i, t in enumerate(tests)
                if (t.get("details") or {}).get("test") == by.get("test")
                and t.get("threat_model") == by.get("threat_model")
            ),
            None,
        )
        if failing is None:
            tests.append(
                {
                    "claim": {"kind": "dp_alarm", "description": "the DP alarm"},
                    "threat_model": by.get("threat_model"),
                    "p_value": by.get("p_value"),
                    "details": {"test": by.get("test")},
                }
            )
            failing = len(tests) - 1
    suite = ET.Element(
        "testsuite",
        {
            "name": f"flaudit audit {spec.name}",
            "tests": str(len(tests)),
            "failures": "1" if refuted else "0",
            "errors": "0",
            "skipped": "0",
            "time": f"{seconds:.3f}",
            "timestamp": _now(),
        },
    )
    properties = ET.SubElement(suite, "properties")
    for name, value in (
        ("verdict", verdict.get("status")),
        ("verdict_summary", verdict.get("summary")),
        ("spec_sha256", hashlib.sha256(spec.model_dump_json().encode("utf-8")).hexdigest()),
    ):
        ET.SubElement(properties, "property", {"name": name, "value": str(value)})
    for i, test in enumerate(tests):
        case = ET.SubElement(
            suite,
            "testcase",
            {"classname": f"flaudit.{spec.name}", "name": _case_name(test), "time": "0"},
        )
        props = ET.SubElement(case, "properties")
        for key in ("p_value", "threat_model"):
            ET.SubElement(props, "property", {"name": key, "value": str(test.get(key))})
        ET.SubElement(
            props,
            "property",
            {"name": "claim_mu", "value": str((test.get("claim") or {}).get("mu"))},
        )
        if i == failing:
            failure = ET.SubElement(
                case, "failure", {"message": str(verdict.get("summary")), "type": "claim_refuted"}
            )
            failure.text = str(verdict.get("summary"))
        else:
            ET.SubElement(
                case, "system-out"
            ).text = f"p = {test.get('p_value')}; verdict: {verdict.get('summary')}"
    return ET.tostring(ET.ElementTree(suite).getroot(), encoding="utf-8", xml_declaration=True)
