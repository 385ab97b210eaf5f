"""The alarm as an audit spec sees it, and its words: looks, the guarantee sentence, the alerts,
the record of where the error alarm fired, and the verdict of a spec. Moved out of the
service's ``live.py`` (issue #20: the service, the CLI and the page only render these).
Pure: a spec, claim tests and estimates in; dicts and sentences out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from ..bugs import InjectedBug
from ..canaries import resolve_canary_family
from ..estimators import interference_warning
from ..spec import AuditSpec, Participation
from . import AlarmDecision, alarm_guarantee, audit_claims, audit_design, decide_alarm
from .verdict import TEST_NAMES, Verdict, audit_verdict, clause

__all__ = [
    "alarm_alert",
    "alarm_record",
    "build_alerts",
    "bug_label",
    "decide",
    "design_warning",
    "first_alarm",
    "num_looks",
    "spec_alarm_guarantee",
    "spec_claim",
    "spec_verdict",
]


def _spec(spec: AuditSpec | Mapping) -> AuditSpec:
    return spec if isinstance(spec, AuditSpec) else AuditSpec.model_validate(spec)


def _alarming_claims(spec: AuditSpec) -> list:
    """The alarming claims only: the known-rounds one (the Poisson-subsampled claim is tested and
    reported, not alarming), built without the Poisson curve (its PLD costs ~0.3-2 s per spec,
    and every read asks for the guarantee and the verdict)."""
    return audit_claims(spec.model_copy(update={"participation": Participation.uniform}))


def num_looks(spec: AuditSpec) -> int:
    """Looks of the DP alarm, declared in advance: after every round and at the end."""
    return spec.num_rounds + 1


def bug_label(spec: AuditSpec | Mapping) -> str | None:
    """``"bug injected: noise_scale=0.5 (...)"`` for a spec with ``inject_bug``, else None."""
    raw = spec.inject_bug if isinstance(spec, AuditSpec) else (spec or {}).get("inject_bug")
    if raw is None:
        return None
    bug = raw if isinstance(raw, InjectedBug) else InjectedBug.model_validate(raw)
    return f"bug injected: {bug.label} (testing only; the claim does not know about it)"


def spec_alarm_guarantee(
    spec: AuditSpec | Mapping, *, canary_weight_factor: float | None = None
) -> str:
    """One sentence: what the DP alarm guarantees for this spec, or "No DP claim: ...";
    ``canary_weight_factor`` above 1 (a weighted FedAvg): one more, saying the claim tests run
    at the heaviest influence the canaries carried."""
    spec = _spec(spec)
    claims = _alarming_claims(spec)
    text = alarm_guarantee(claims, num_looks=num_looks(spec))
    if (
        canary_weight_factor is not None
        and canary_weight_factor > 1 + 1e-6
        and any(c.is_claim for c in claims)
    ):
        heavy = audit_claims(
            spec.model_copy(update={"participation": Participation.uniform}),
            weight_factor=canary_weight_factor,
        )[0]
        text += (
            f" Weighted aggregation: the claim tests run at the heaviest influence the "
            f"canaries carried ({canary_weight_factor:.3g}× C/n), i.e. against "
            f"{heavy.mu:.3g}-Gaussian DP, what the claimed noise gives a canary that heavy."
        )
    return text


def decide(
    spec: AuditSpec,
    claim_tests: list,
    *,
    look: int,
    weight_factor: float | None = None,
    noise_clip_factor: float | None = None,
) -> AlarmDecision:
    """The alarm at ``look`` of :func:`num_looks` over this look's claim tests (its
    ``refuted_by`` reads ``mu_lo`` as ε at the spec's δ); ``weight_factor``: the heaviest
    influence the canaries carried so far, and ``noise_clip_factor``: the smallest round
    ``noise_clip_norm / clip_norm`` so far, those the tests were run at
    (:func:`~flaudit.auditor.claims.audit_claims`)."""
    return decide_alarm(
        claim_tests,
        look=look,
        num_looks=num_looks(spec),
        claims=audit_claims(spec, weight_factor=weight_factor, noise_clip_factor=noise_clip_factor),
        delta=spec.delta,
    )


def alarm_record(decision: AlarmDecision, *, round: int | None) -> dict | None:
    """What the audit keeps of an error-level alarm: where it fired (``round``; None for the
    final look) and why (``refuted_by``). None for any other status."""
    if decision.status != "error":
        return None
    return {
        "status": "error",
        "round": round,
        "look": decision.look,
        "num_looks": decision.num_looks,
        "refuted_by": decision.refuted_by,
    }


def first_alarm(alerts: Iterable[Mapping[str, Any]] | None) -> dict | None:
    """The stored record of the first error alarm (kept in its alert's ``details.alarm``)."""
    for alert in alerts or []:
        record = (alert.get("details") or {}).get("alarm")
        if record is not None:
            return dict(record)
    return None


def alarm_alert(alarm: AlarmDecision, *, round: int | None = None) -> dict | None:
    """The error/warning/info alert of an alarm decision (None when it is ``ok``)."""
    if alarm.status == "no_dp_claim":
        return {"level": "info", "message": alarm.guarantee}
    if alarm.status not in ("error", "warning"):
        return None
    kind = "known_rounds" if alarm.status == "error" else "poisson_subsampled"
    rejected = [t for t in alarm.rejected if (t.get("claim") or {}).get("threat_model") == kind]
    claim = (rejected[0].get("claim") or {}) if rejected else {}
    what = claim.get("description") or claim.get("kind") or kind
    if alarm.status == "error":

        def name(t):
            test = (t.get("details") or {}).get("test")
            return TEST_NAMES.get(test) or f"the {t.get('threat_model')} scores"

        by = " and ".join(
            f"{name(t)} (p = {t['p_value']:.2g} <= {t.get('level', alarm.level_per_test):.2g})"
            for t in rejected
        )
        message = (
            f"possible DP bug or wrong claim: the known-rounds claim ({what}) is rejected "
            f"by {by} at look {alarm.look} of {alarm.num_looks}"
        )
        record = alarm_record(alarm, round=round)
        return {"level": "error", "message": message, "details": {"alarm": record}}
    by = " and ".join(
        f"the {t.get('threat_model')} scores (p = {t['p_value']:.2g})" for t in rejected
    )
    message = (
        f"amplification by sampling looks violated: the Poisson-subsampled claim is "
        f"rejected by {by} at look {alarm.look} of {alarm.num_looks}; check that clients "
        "and canaries are sampled by Poisson with the accountant's rate"
    )
    return {"level": "warning", "message": message}


def build_alerts(
    *,
    spec: AuditSpec,
    dim: int | None,
    rounds_stored: int,
    has_final: bool,
    alarm: AlarmDecision | None = None,
    round: int | None = None,
    previous: Iterable[Mapping[str, Any]] | None = None,
) -> list[dict]:
    """Alerts shown with an audit.

    The DP alarm (``alarm``, from :func:`decide` at this look; ``round`` is the round of the
    look, None for the final one): **error** when a known-rounds Gaussian-DP claim test rejects
    (a DP bug or a wrong claim), **warning** when only a Poisson-subsampled claim is rejected
    (only if told to alarm on it), **info** "No DP claim" for noise multiplier 0. An error alarm
    is kept once fired (``previous``: the alerts stored so far): the guarantee covers every look,
    so a later look that does not reject does not undo it. Its false-alarm probability over all
    looks and tests is :func:`spec_alarm_guarantee`. Epsilon lower bounds above an analytic
    epsilon are estimates, never alarms.

    Other warnings: ``k/d`` in the interference zone, and a run that ended early.
    """
    alerts: list[dict] = []
    kept = next((dict(a) for a in previous or [] if first_alarm([a]) is not None), None)
    if kept is not None:
        alerts.append(kept)
    if alarm is None and spec.accounted_noise_multiplier == 0:
        alerts.append({"level": "info", "message": spec_alarm_guarantee(spec)})
    elif alarm is not None:
        alert = alarm_alert(alarm, round=round)
        if alert is not None and not (kept is not None and alert["level"] == "error"):
            alerts.append(alert)
    if dim and dim >= 2:
        family = resolve_canary_family(
            spec.canary_family, num_canaries=spec.num_canaries, dim=int(dim)
        )
        message = interference_warning(
            spec.num_canaries, int(dim), noise_multiplier=spec.noise_multiplier, family=family
        )
        if message:
            alerts.append({"level": "warning", "message": f"{message} (Keinan et al. 2025)"})
    fired = first_alarm(alerts)
    if (
        has_final
        and rounds_stored < spec.num_rounds
        and spec.stop_on_alarm
        and fired is not None
        and fired.get("round") == rounds_stored
    ):
        alerts.append(
            {
                "level": "info",
                "message": (
                    f"training stopped at round {rounds_stored} of {spec.num_rounds} on the DP alarm "
                    "(stop_on_alarm); the statistics cover the rounds trained"
                ),
            }
        )
    elif has_final and rounds_stored < spec.num_rounds:
        alerts.append(
            {
                "level": "warning",
                "message": (
                    f"the run ended after {rounds_stored} of {spec.num_rounds} rounds; the "
                    "all-iterates statistics cover only the rounds received"
                ),
            }
        )
    return alerts


def spec_claim(spec: AuditSpec, design=None) -> dict | None:
    """The alarming claim of ``spec`` as the verdict names it: ``{"mu", "epsilon", "delta",
    "description"}`` (None: no DP claim)."""
    claim = next((c for c in _alarming_claims(spec) if c.threat_model == "known_rounds"), None)
    if claim is None or not claim.is_claim:
        return None
    epsilon = getattr(design, "claim_epsilon", None) if design is not None else None
    if epsilon is None:
        epsilon = claim.epsilon(spec.delta)
    epsilon = None if epsilon is None or not math.isfinite(epsilon) else float(epsilon)
    return {
        "mu": float(claim.mu),
        "epsilon": epsilon,
        "delta": float(spec.delta),
        "description": claim.description,
    }


def spec_verdict(
    spec: AuditSpec | Mapping,
    *,
    alarm: Mapping[str, Any] | None,
    estimates: Iterable[Mapping[str, Any]] = (),
    state: str,
    rounds_received: int,
    missing_rounds: Iterable[int] | None = None,
    rounds_without_canaries: Iterable[int] | None = None,
    weight_factor: float | None = None,
    canary_weight_factor: float | None = None,
    dim: int | None = None,
    noise_clip_factor: float | None = None,
) -> Verdict:
    """:func:`~flaudit.auditor.claims.verdict.audit_verdict` for one audit spec: its claim and
    its design from the spec; stopped on the alarm when ``spec.stop_on_alarm`` and the run
    ended at the alarm's round; ``weight_factor``: the largest of the rounds' (a weighted
    FedAvg); ``canary_weight_factor``: the largest of the rounds that carried canaries;
    ``dim``: the model's size once known (the design then accounts for the noise scale's
    ``d - k`` degrees of freedom); ``noise_clip_factor``: the smallest round
    ``noise_clip_norm / clip_norm`` (a round noised for a smaller clip norm than its updates)."""
    spec = _spec(spec)
    design = audit_design(spec, dim=dim)
    stopped = None
    if (
        alarm is not None
        and getattr(spec, "stop_on_alarm", False)
        and alarm.get("round") is not None
        and state not in ("running", "queued")
        and rounds_received == alarm["round"] < spec.num_rounds
    ):
        stopped = int(alarm["round"])
    return audit_verdict(
        claim=spec_claim(spec, design),
        design=design,
        alarm=alarm,
        estimates=estimates,
        state=state,
        rounds_received=rounds_received,
        num_rounds=spec.num_rounds,
        missing_rounds=missing_rounds,
        rounds_without_canaries=rounds_without_canaries,
        stopped_at_round=stopped,
        weight_factor=weight_factor,
        canary_weight_factor=canary_weight_factor,
        noise_clip_factor=noise_clip_factor,
    )


def design_warning(spec: AuditSpec, design) -> str | None:
    """The warning a spec that cannot test its own claim is accepted with (None otherwise):
    what the audit can do and what would make it testable."""
    if design is None or getattr(design, "testable", True) or design.claim_mu is None:
        return None
    advice = clause(design.advice) or "more canaries or canary repeats would make it testable"
    return (
        f"this audit cannot refute its own claim (μ = {design.claim_mu:.3g} at "
        f"δ = {spec.delta:g}): it {clause(design.summary)}; {advice}. It runs all the same; "
        "its verdict will be 'inconclusive' unless the alarm fires."
    )
