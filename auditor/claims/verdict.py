"""The verdict: one sentence a person reads in ten seconds, computed once for the API, the CLI
and the dashboard (issue #20). Pure: the audit's claim, its design, the alarm's record and the
estimates in; a :class:`Verdict` out.

Statuses (:class:`VerdictStatus`):

* ``claim_refuted`` -- the DP alarm's error level fired at some look: a claim test rejected the
  claim with the alarm's overall confidence (the union bound over every look and test), so the
  claim is broken, whatever later looks say. Names the claim, the valid lower bound that refutes
  it, its confidence, the round and the validity tier. Also, once the run ended, when the
  recorded weighting alone breaks the claim (a weighted FedAvg whose heaviest client the noise
  protects only at ``W * mu``): ``cause`` says which.
* ``consistent`` -- the run ended, the audit could test its claim (its design says so) and no
  claim test rejected it; says what the audit could have caught.
* ``inconclusive`` -- the audit cannot refute its claim (too few canaries or repeats, per its
  design), or the run ended before the audit could finish; says what would make it testable.
* ``no_dp_claim`` -- noise multiplier 0: nothing to refute.
* ``running`` -- provisional: the run goes on and nothing has rejected the claim yet.

:func:`largest_valid_bound` is the one function that decides which reported estimates are valid
lower bounds (the dashboard's "measured" tile shows exactly its answer); the refuted verdict's
sentence quotes the same bound and names the alarm's round as when it fired.

Weighted FedAvg (``weight_factor`` ``W > 1``, the heaviest reply's weight in units of the
``C/n`` the noise is calibrated for) gets two answers (docs/estimators.md, "Weighted FedAvg:
two answers"): (a) is the noise right for the weighting used? The claim tests run at the
heaviest influence the canaries carried (``W * mu``), so the alarm fires only on evidence
against that: ``cause`` "noise". (b) Does the weighting break the claim for the heaviest
clients? From the recorded factors alone (:func:`weighting_answer`): ``cause`` "weighting", or
"noise_and_weighting" when both.

A round noised for a smaller clip norm than its updates were clipped to (``noise_clip_factor``
``f < 1``, Flower's adaptive-clipping wrappers; issue #38): the claim tests run on the mechanism
actually run (each round at its own ``W_t / f_t``), so an alarm means the noise falls short even
of that; and the recorded norms alone break the claim once ``1 / f > 1 + WEIGHTING_TOLERANCE``:
``cause`` "noise_calibration" when no alarm fired and the weighting does not break it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ..noise_calibration import SHORT_NOISE_TOLERANCE, shortfall_text
from ..results import jsonable, number

__all__ = [
    "CAUSES",
    "TEST_NAMES",
    "VALID_BOUND_ESTIMATORS",
    "WEIGHTING_TOLERANCE",
    "Verdict",
    "VerdictStatus",
    "audit_verdict",
    "clause",
    "is_valid_bound",
    "largest_valid_bound",
    "weighting_answer",
]

#: What a refuted verdict blames (``Verdict.cause``): the noise (a claim test rejected the claim
#: at the heaviest influence the canaries carried), the weighting (the recorded weights alone
#: give the heaviest client more than the claim), or both; or the noise calibration (a round
#: noised for a smaller clip norm than its updates had: the recorded norms alone break the claim).
CAUSES = ("noise", "weighting", "noise_and_weighting", "noise_calibration")

#: The weighting breaks the claim when the heaviest client's mu, ``W * mu``, exceeds the claim by
#: more than this fraction (``W > 1.01``): a claim is stated to about 3 digits, and a 1% excess in
#: mu is far below what any audit of it resolves. Below it the weighting is not mentioned at all
#: (equal partitions of 360 and 359 examples give W = 1.002; issue #38), and above it the factor
#: printed to 3 digits is at least "1.01".
WEIGHTING_TOLERANCE = 0.01


class VerdictStatus(str, Enum):
    claim_refuted = "claim_refuted"
    consistent = "consistent"
    inconclusive = "inconclusive"
    no_dp_claim = "no_dp_claim"
    running = "running"


#: Estimators whose results are lower bounds valid at their stated confidence for the mechanism
#: audited: the one-run ε bound and the one-run f-DP bound (any mechanism: they rest on the random
#: seen/unseen labels alone) and the normal-score μ_lo (exact for DP-FedAvg with Gaussian noise).
#: The threshold bounds (``lower_bound``, ``gdp_lower_bound``) are reported but not counted: their
#: confidence intervals take the canaries' scores as independent, and the scores of one release
#: share its noise scale (docs/estimators.md, "One release, one scale").
VALID_BOUND_ESTIMATORS = ("one_run", "fdp_one_run", "normal_scores")

#: Human names (the API keeps its identifiers in ``estimator`` / ``test``).
_BOUND_NAMES = {
    "lower_bound": "ε lower bound from a canary threshold",
    "one_run": "one-run ε lower bound",
    "gdp_lower_bound": "Gaussian-DP lower bound",
    "fdp_one_run": "one-run f-DP lower bound",
    "normal_scores": "normal-score Gaussian-DP lower bound (DP-FedAvg with Gaussian noise)",
}
_SCORE_NAMES = {
    "final_model": "the final model's canary scores",
    "all_iterates": "the canaries' largest per-round scores",
    "known_rounds": "the canaries' scores in their known rounds",
}
#: Human names of the alarm's claim tests (:class:`flaudit.auditor.claims.AlarmTest`).
TEST_NAMES = {
    "known_rounds_normal_scores": "the canaries' scores in their known rounds (normal-score test)",
    "final_model_normal_scores": "the final model's canary scores (normal-score test)",
    "known_rounds_fdp_one_run": "the one-run f-DP guessing game on the known rounds",
}
_TIER_NAMES = {
    "independent_canaries": "valid for DP-FedAvg with Gaussian noise, the mechanism audited",
    "assumption_free": "valid for every mechanism that meets the claim",
}


def _g(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "?"
    if math.isinf(value):
        return "∞"
    return f"{value:.{digits}g}"


def is_valid_bound(estimate: Mapping[str, Any]) -> bool:
    """Whether one reported estimate (``EpsilonResult.to_dict()``) is a lower bound valid at its
    stated confidence: a bound estimator, a corrected threshold choice (not ``none``, the
    paper's max over thresholds), a confidence, and a number."""
    return (
        estimate.get("estimator") in VALID_BOUND_ESTIMATORS
        and estimate.get("correction") != "none"
        and estimate.get("confidence") is not None
        and number(estimate.get("epsilon")) is not None
    )


def largest_valid_bound(estimates: Iterable[Mapping[str, Any]]) -> dict | None:
    """The largest valid lower bound on ε among ``estimates`` (ties: the first), as the API's
    ``verdict.largest_valid_bound``: estimator, human name, threat model, μ (for the
    Gaussian-DP bounds, else None), ε, δ, ``confidence``, ``num_bounds``, ``each_confidence``
    and ``validity`` (a sentence). None when there is none.

    The largest of ``m`` bounds is a lower bound only with the confidence the union bound
    leaves: it exceeds the truth only when one of them does, so ``confidence`` is
    ``1 - sum_i (1 - c_i)`` over the ``m`` valid bounds it was chosen from (issue #38).
    :func:`flaudit.auditor.claims.summarize` splits its level across them (each at
    ``1 - (1 - confidence)/m``), so the largest is valid at ``confidence`` as a whole; bounds
    computed at 95% each would give ``1 - m * 5%`` here, and it says so."""
    best, best_eps, valid = None, -math.inf, []
    for e in estimates:
        if not is_valid_bound(e):
            continue
        valid.append(e)
        eps = number(e.get("epsilon"))
        if eps > best_eps:
            best, best_eps = e, eps
    if best is None:
        return None
    details = best.get("details") or {}
    misses = [1.0 - float(number(e.get("confidence"))) for e in valid]
    overall = max(0.0, round(1.0 - sum(misses), 12))
    each = number(best.get("confidence"))
    m = len(valid)
    validity = (
        f"valid at {overall:.0%} as a whole: the level is split across the {m} valid "
        f"bounds computed (each at {100 * each:.4g}%), and the largest is shown"
        if m > 1
        else f"valid at {overall:.0%}: the only valid bound computed"
    )
    return {
        "estimator": best.get("estimator"),
        "name": _BOUND_NAMES.get(best.get("estimator"), str(best.get("estimator"))),
        "threat_model": best.get("threat_model"),
        "mu": number(details.get("mu")),
        "epsilon": best_eps,
        "delta": number(best.get("delta")),
        "confidence": overall,
        "num_bounds": m,
        "each_confidence": each,
        "validity": validity,
    }


@dataclass(frozen=True)
class Verdict:
    """The verdict of an audit (JSON: :meth:`to_dict`, the API's ``verdict`` field)."""

    status: VerdictStatus
    summary: str
    claim: dict | None = None
    refuted_by: dict | None = None
    design: dict | None = None
    largest_valid_bound: dict | None = None
    tier: str | None = None
    round: int | None = None
    gaps: dict | None = None
    stopped: bool = False
    cause: str | None = None
    weighting: dict | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: :func:`~flaudit.auditor.results.jsonable`, as estimates are."""
        return jsonable(
            {
                "status": self.status.value,
                "summary": self.summary,
                "claim": self.claim,
                "refuted_by": self.refuted_by,
                "design": self.design,
                "largest_valid_bound": self.largest_valid_bound,
                "tier": self.tier,
                "round": self.round,
                "gaps": self.gaps,
                "stopped": self.stopped,
                "cause": self.cause,
                "weighting": self.weighting,
            }
        )


def clause(text: str | None) -> str:
    """A design sentence as a clause inside the verdict's one sentence: first letter lower-case,
    no final period, inner sentences joined by semicolons."""
    text = (text or "").strip().rstrip(".")
    if not text:
        return ""
    text = text.replace(". ", "; ")
    return text[0].lower() + text[1:]


def _as_dict(value: Any) -> dict | None:
    if value is None:
        return None
    return value.to_dict() if hasattr(value, "to_dict") else dict(value)


def _claim_text(claim: dict) -> str:
    eps = claim.get("epsilon")
    return (
        f"μ = {_g(claim['mu'])} Gaussian DP (ε = {_g(eps, 2)} at δ = {claim['delta']:g})"
        if eps is not None
        else f"μ = {_g(claim['mu'])} Gaussian DP"
    )


def _gaps(
    *,
    rounds_received: int,
    num_rounds: int,
    ended: bool,
    missing_rounds=None,
    rounds_without_canaries=None,
) -> dict | None:
    missing = sorted({int(t) for t in (missing_rounds or [])})
    bare = sorted({int(t) for t in (rounds_without_canaries or [])})
    short = ended and rounds_received < num_rounds
    if not (short or missing or bare):
        return None
    return {
        "rounds_received": int(rounds_received),
        "num_rounds": int(num_rounds),
        "missing_rounds": missing or None,
        "rounds_without_canaries": bare or None,
    }


def _rounds_text(rounds: list[int]) -> str:
    shown = ", ".join(str(t) for t in rounds[:5])
    return shown + ("…" if len(rounds) > 5 else "")


def _gap_text(gaps: dict | None, *, ended: bool = True) -> str:
    if gaps is None:
        return ""
    parts = []
    if gaps.get("missing_rounds"):
        parts.append(
            f"round(s) {_rounds_text(gaps['missing_rounds'])} of {gaps['num_rounds']} "
            "were not reported"
        )
    elif ended and gaps["rounds_received"] < gaps["num_rounds"]:
        parts.append(f"only {gaps['rounds_received']} of {gaps['num_rounds']} rounds were received")
    if gaps.get("rounds_without_canaries"):
        parts.append(
            f"round(s) {_rounds_text(gaps['rounds_without_canaries'])} trained without canaries"
        )
    if not parts:
        return ""
    text = " and ".join(parts)
    return f" Gaps: {text}; the audit covers the rest, with less power."


def weighting_answer(
    weight_factor: float | None,
    claim_mu: float,
    *,
    canary_weight_factor: float | None = None,
    tolerance: float = WEIGHTING_TOLERANCE,
) -> dict | None:
    """Does the weighting break the claim for the heaviest clients? From the recorded factors
    alone: the heaviest reply moved the model ``W = weight_factor`` times the ``C/n`` the noise
    is calibrated for, so correct noise protects a client that heavy at ``W * claim_mu``
    (its rounds' factors are at most ``W``). None for equal weights (``W`` None or 1).

    Returns ``{"weight_factor", "claim_mu", "heaviest_mu", "breaks_claim", "tested_mu",
    "matters"}``; ``breaks_claim``: ``W * mu > mu * (1 + tolerance)``; ``matters``: the same
    threshold for every word about the weighting (the verdict's sentences and the ServerApp's
    warning say nothing at or below it, so never "1×"); ``tested_mu``: the claim at the
    heaviest influence the canaries carried (``canary_weight_factor``, at most ``W``; None:
    ``W``), where the claim tests ran."""
    if weight_factor is None or not weight_factor > 1 + 1e-6:
        return None
    w, mu = float(weight_factor), float(claim_mu)
    carried = w if canary_weight_factor is None else max(1.0, float(canary_weight_factor))
    breaks = w * mu > mu * (1 + tolerance)
    return {
        "weight_factor": w,
        "claim_mu": mu,
        "heaviest_mu": w * mu,
        "breaks_claim": breaks,
        "tested_mu": carried * mu,
        "matters": breaks,
    }


def _influence(weighting: dict) -> str:
    return (
        f"the weighted average gives the heaviest client {_g(weighting['weight_factor'])}× "
        "the influence (C/n) the noise is calibrated for, so a client that heavy is "
        f"protected only at μ = {_g(weighting['heaviest_mu'])}"
    )


def _bound_text(bound: dict | None, by: dict, claim: dict, conf: str) -> str:
    """The leakage measured, in the words of the final valid bound (the tile's), else the
    alarm's own ``mu_lo``."""
    split = (
        f" (as a whole: the level is split across {bound['num_bounds']} bounds)"
        if bound is not None and (bound.get("num_bounds") or 1) > 1
        else ""
    )
    if bound is not None and bound.get("mu") is not None:
        eps = bound.get("epsilon")
        return (
            f"the leakage is at least μ = {_g(bound['mu'])}"
            + (f" (ε ≥ {_g(eps, 2)} at δ = {claim['delta']:g})" if eps is not None else "")
            + f" at {_conf(bound.get('confidence'))}{split} by the {bound['name']}"
        )
    if bound is not None:
        return (
            f"the leakage is at least ε = {_g(bound['epsilon'], 2)} at δ = "
            f"{claim['delta']:g} at {_conf(bound.get('confidence'))}{split} by the "
            f"{bound['name']}"
        )
    mu_lo, eps_lo = number(by.get("mu_lo")), number(by.get("epsilon_lo"))
    if mu_lo is not None:
        return (
            f"the leakage is at least μ = {_g(mu_lo)}"
            + (f" (ε ≥ {_g(eps_lo, 2)} at δ = {claim['delta']:g})" if eps_lo is not None else "")
            + f" at {conf}"
        )
    p = number(by.get("p_value"))
    return f"the claim tests reject it at {conf}" + (f" (p = {p:.2g})" if p is not None else "")


def _conf(confidence: Any) -> str:
    value = number(confidence)
    return f"{value:.0%} confidence" if value is not None else "its stated confidence"


def _refutation(
    alarm: dict,
    claim: dict,
    bound: dict | None,
    *,
    weighted: bool = False,
    short: float = 1.0,
) -> tuple[dict, str]:
    """``verdict.refuted_by`` and its sentence from the alarm's record; the leakage is quoted
    from ``bound`` (the final valid one, the tile's), the alarm's round named as when it
    fired. In a weighted run (``weighted``) the sentence says that the noise falls short, and
    at which influence it was tested: the heaviest the canaries carried (the record's
    ``claim_mu`` above the claim's mu) or, when none of their rounds up to the alarm had a
    heavier reply, the ``C/n`` the noise is calibrated for."""
    by = dict(alarm.get("refuted_by") or {})
    threat_model = by.get("threat_model")
    by.setdefault(
        "name",
        TEST_NAMES.get(by.get("test"))
        or _SCORE_NAMES.get(threat_model, str(threat_model or "a claim test")),
    )
    by["round"] = alarm.get("round")
    conf = (
        _conf(by.get("confidence"))
        if by.get("confidence") is not None
        else "the alarm's confidence"
    )
    tested = number(by.get("claim_mu"))
    noise = ""
    if short > 1.0 and tested is not None and claim.get("mu"):
        noise = (
            f"the noise falls short even of the mechanism actually run: tested with each "
            f"round at its own noise for the clip norm (down to {shortfall_text(1 / short)}× it) and "
            f"weight, where correct code for that mechanism gives up to μ = {_g(tested)}, "
        )
    elif (
        tested is not None and claim.get("mu") and tested > claim["mu"] * (1 + WEIGHTING_TOLERANCE)
    ):
        noise = (
            f"the noise falls short: tested at the heaviest client's influence "
            f"({_g(tested / claim['mu'])}× the C/n the noise is calibrated for, where "
            f"correct noise gives μ = {_g(tested)}), "
        )
    elif weighted:
        noise = (
            "the noise falls short: tested at the C/n the noise is calibrated for (no "
            "round of the canaries up to the alarm had a heavier reply), "
        )
    t = alarm.get("round")
    when = f"at round {t}" if t is not None else "at the end of training"
    tier = by.get("tier")
    tier_text = f"; {_TIER_NAMES[tier]}" if tier in _TIER_NAMES else ""
    return by, (
        f"{noise}{_bound_text(bound, by, claim, conf)}; the alarm fired {when} on "
        f"{by['name']}{tier_text}."
    )


def _weighting_refutation(weighting: dict, what: str) -> str:
    return (
        f"Claim refuted by the weighting, not the noise: {_influence(weighting)}, above the "
        f"claim of {what}; cap the weights or weight uniformly."
    )


def _calibration_refutation(
    claim: dict, short: float, what: str, *, testable: bool, state: str, can: str, cannot: str
) -> str:
    """The verdict's sentence when the recorded norms alone refute the claim: a round noised
    for ``1 / short`` of the clip norm its updates had, and what the canaries said of the
    mechanism actually run."""
    head = (
        f"Claim refuted by the noise calibration: a round was noised for {shortfall_text(1 / short)}× the "
        f"clip norm its updates were clipped to, so the mechanism actually run protects a "
        f"canary in that round only at μ = {_g(short * claim['mu'])}, above the claim of {what}."
    )
    if not testable:
        return (
            head
            + " Whether the noise is right for the mechanism run is untested: "
            + (cannot[0].upper() + cannot[1:])
        )
    if state != "succeeded":
        return head + (
            f" The noise: no claim test rejected the mechanism actually run on the rounds "
            f"received (the run {state})."
        )
    return head + (
        " The noise is consistent with the mechanism actually run: tested with each round at "
        "its own noise for the clip norm, no claim test rejected it"
        + (f"; this audit {can}" if can else "")
        + "."
    )


def audit_verdict(
    *,
    claim: Mapping[str, Any] | None,
    design: Any = None,
    alarm: Mapping[str, Any] | None = None,
    estimates: Iterable[Mapping[str, Any]] = (),
    state: str = "succeeded",
    rounds_received: int = 0,
    num_rounds: int = 0,
    missing_rounds: Iterable[int] | None = None,
    rounds_without_canaries: Iterable[int] | None = None,
    stopped_at_round: int | None = None,
    weight_factor: float | None = None,
    canary_weight_factor: float | None = None,
    noise_clip_factor: float | None = None,
) -> Verdict:
    """The verdict of one audit.

    Parameters
    ----------
    claim : mapping or None
        ``{"mu", "epsilon", "delta", "description"}`` of the alarming (known-rounds)
        Gaussian-DP claim; None when the audit makes no DP claim (noise multiplier 0).
    design : AuditDesign or dict, optional
        The audit design (:func:`flaudit.auditor.claims.audit_design`): ``testable``,
        ``summary`` and ``advice`` word the consistent and inconclusive verdicts.
    alarm : mapping, optional
        The first error-level alarm of the run: ``{"round": t or None (the final look),
        "look", "num_looks", "refuted_by": {...}}`` (see :func:`alarm_record`); None if the
        error alarm never fired.
    estimates : iterable of dict
        The reported estimates (for :func:`largest_valid_bound`).
    state : str
        ``running``/``queued`` (provisional), ``succeeded``, ``failed`` or ``cancelled``.
    rounds_received, num_rounds : int
        Rounds the audit received, of the rounds planned.
    missing_rounds : iterable of int, optional
        Rounds trained but never reported (a run that went on while the service was away).
    rounds_without_canaries : iterable of int, optional
        Rounds trained without their canaries (the service was away when they were fetched).
    stopped_at_round : int, optional
        Training was stopped on the alarm at this round (``stop_on_alarm``).
    weight_factor : float, optional
        The largest round ``weight_factor`` reported (a user's weighted FedAvg: the heaviest
        reply's weight × replies / total weight; 1 or None for equal weights). Above 1 the
        verdict answers two questions (module docstring): the alarm's tests ran at the
        heaviest influence, so an alarm blames the noise; :func:`weighting_answer` says
        whether the weighting alone breaks the claim (``cause`` "weighting" or
        "noise_and_weighting").
    canary_weight_factor : float, optional
        The largest ``weight_factor`` of a round that carried canaries: the influence the claim
        tests ran at (None: ``weight_factor``).
    noise_clip_factor : float, optional
        The smallest round ``noise_clip_norm / clip_norm`` reported (None: every round noised
        for its clip norm). Below 1 the claim tests ran on the mechanism actually run, so an
        alarm blames the noise beyond it; beyond ``1 + WEIGHTING_TOLERANCE`` in ``1 / f`` the
        recorded norms alone refute the claim once the run ended (``cause``
        "noise_calibration", unless an alarm or the weighting already refutes it).
    """
    design_d = _as_dict(design)
    bound = largest_valid_bound(estimates)
    ended = state not in ("running", "queued")
    gaps = _gaps(
        rounds_received=rounds_received,
        num_rounds=num_rounds,
        ended=ended,
        missing_rounds=missing_rounds,
        rounds_without_canaries=rounds_without_canaries,
    )
    common = {"design": design_d, "largest_valid_bound": bound, "gaps": gaps}
    if claim is None:
        return Verdict(
            VerdictStatus.no_dp_claim,
            "No DP claim: the noise multiplier is 0, so there is no privacy claim to "
            "test; the estimates measure leakage only.",
            **common,
        )
    claim = dict(claim)
    what = _claim_text(claim)
    weighting = weighting_answer(
        weight_factor, claim["mu"], canary_weight_factor=canary_weight_factor
    )
    common["weighting"] = weighting
    breaks = weighting is not None and weighting["breaks_claim"]
    short = 1.0
    if noise_clip_factor is not None and 0 < noise_clip_factor < 1 - SHORT_NOISE_TOLERANCE:
        short = 1.0 / float(noise_clip_factor)  # a finding (round-off is not one)
    if alarm is not None:
        refuted_by, because = _refutation(
            alarm,
            claim,
            bound,
            weighted=weighting is not None and weighting["matters"],
            short=short,
        )
        t = alarm.get("round")
        where = f"at round {t}" if t is not None else "at the end of training"
        if stopped_at_round is not None:  # the missing rounds are the ones never trained
            head, gap_text = f"Stopped at round {stopped_at_round}: claim refuted", ""
        else:
            head, gap_text = f"Claim refuted {where}", _gap_text(gaps, ended=ended)
        summary = f"{head}: the run does not meet its claim of {what}; {because}"
        if breaks:
            summary += (
                f" The weighting breaks the claim too: {_influence(weighting)}; cap the "
                "weights or weight uniformly."
            )
        return Verdict(
            VerdictStatus.claim_refuted,
            summary + gap_text,
            claim=claim,
            refuted_by=refuted_by,
            tier=refuted_by.get("tier"),
            round=t,
            stopped=stopped_at_round is not None,
            cause="noise_and_weighting" if breaks else "noise",
            **common,
        )
    note = (
        (
            f" Weighting: {_influence(weighting)}; the claim tests run at that influence; cap "
            "the weights or weight uniformly."
        )
        if breaks
        else ""
    )
    testable = bool(design_d.get("testable", True)) if design_d else True
    can = clause((design_d or {}).get("summary"))
    advice = clause((design_d or {}).get("advice"))
    cannot = (
        f"this audit cannot refute its claim of {what}"
        + (f" (it {can})" if can else "")
        + "; "
        + (advice or "more canaries or canary repeats would make it testable")
        + "."
    )
    if state in ("running", "queued"):  # provisional: the status changes only at the end
        progress = (
            f"round {rounds_received} of {num_rounds}" if state == "running" else "not started"
        )
        if not testable:
            summary = f"Running ({progress}), inconclusive so far: {cannot}"
        else:
            summary = (
                f"Running ({progress}): no evidence against the claim of {what} so far"
                + (f"; this audit {can}" if can else "")
                + "."
            )
        return Verdict(
            VerdictStatus.running,
            summary + note + _gap_text(gaps, ended=False),
            claim=claim,
            **common,
        )
    if breaks:  # (b) refutes; (a) says what the noise did at the weighting used
        if not testable:
            noise = (
                " Whether the noise is right for the weighting used is untested: "
                + cannot[0].upper()
                + cannot[1:]
            )
        elif state != "succeeded":
            noise = (
                f" The noise: no claim test rejected the claim at the heaviest client's "
                f"influence on the {rounds_received} of {num_rounds} rounds received "
                f"(the run {state})."
            )
        else:
            noise = (
                " The noise is consistent with the claim for the weighting used: tested at "
                f"the heaviest influence the canaries carried (μ = "
                f"{_g(weighting['tested_mu'])}), no claim test rejected it"
                + (f"; this audit {can}" if can else "")
                + "."
            )
        return Verdict(
            VerdictStatus.claim_refuted,
            _weighting_refutation(weighting, what) + noise + _gap_text(gaps),
            claim=claim,
            cause="weighting",
            **common,
        )
    if short > 1 + WEIGHTING_TOLERANCE:  # the recorded norms refute; the canaries test the rest
        return Verdict(
            VerdictStatus.claim_refuted,
            _calibration_refutation(
                claim, short, what, testable=testable, state=state, can=can, cannot=cannot
            )
            + _gap_text(gaps),
            claim=claim,
            cause="noise_calibration",
            **common,
        )
    if not testable:
        return Verdict(
            VerdictStatus.inconclusive,
            f"Inconclusive: {cannot}" + _gap_text(gaps),
            claim=claim,
            **common,
        )
    if state != "succeeded":
        summary = (
            f"Inconclusive: the run {state} after {rounds_received} of {num_rounds} "
            f"rounds, before the audit could test its claim of {what}; no claim test "
            "rejected it on the rounds received."
        )
        return Verdict(VerdictStatus.inconclusive, summary, claim=claim, **common)
    summary = (
        f"Consistent with the claim of {what}: no claim test rejected it"
        + (f"; this audit {can}" if can else "")
        + "."
        + _gap_text(gaps)
    )
    return Verdict(VerdictStatus.consistent, summary, claim=claim, **common)
