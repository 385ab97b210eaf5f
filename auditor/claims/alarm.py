"""The DP alarm: the claim tests of every look combined with one false-alarm guarantee
(issue #19 items 1-3). Pure: test results in, a decision out.

The service (and ``flaudit run``) evaluates the claim tests after every round and at the end:
``num_looks = num_rounds + 1`` looks, numbered ``1 .. num_looks``; the last is the final
evaluation. Each alarm test (:class:`~flaudit.auditor.claims.tiers.AlarmTest`) has a fixed,
pre-declared share of ``alpha`` (:data:`ALARM_BUDGET`); the known-rounds normal-score test spends
:data:`PER_ROUND_SHARE` of its share evenly over the per-round looks (so a clear bug fires
early) and the rest at the final look; the other tests spend theirs at the final look. By the
union bound, if the claim holds the probability that any test rejects at any look is at most
``alpha`` -- whatever the dependence between looks and tests.

Where the power goes (docs/estimators.md): the known-rounds statistic carries the signal of every
round a canary joined (``mu = sqrt(r)/z``), the final model carries ``~sqrt(T)`` times less, so
the known-rounds test gets most of the level; the assumption-free one-run f-DP test backs it for
mechanisms whose canary scores might be dependent.

A rejected ``known_rounds`` claim is an **error** ("possible DP bug or wrong claim"). A spec with
noise multiplier 0 has status ``no_dp_claim``. (Poisson-subsampled claims are tested and reported
by :func:`flaudit.auditor.claims.summarize` but never alarm: canaries join fixed periods, not
Poisson samples.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..estimators._validation import check_confidence
from ..estimators.gdp import gdp_epsilon
from ..results import ThreatModel
from ..validation import check_integer_at_least
from .fdp import fdp_mu_lo
from .normal_scores import NormalScoreTest
from .tiers import AlarmTest, ValidityTier

__all__ = [
    "ALARM_ALPHA",
    "ALARM_BUDGET",
    "PER_ROUND_SHARE",
    "AlarmDecision",
    "decide_alarm",
    "look_level",
    "alarm_guarantee",
]

#: Default false-alarm probability over all looks and tests.
ALARM_ALPHA = 0.05
#: Share of ``alpha`` of each alarm test (they sum to 1).
ALARM_BUDGET: dict[AlarmTest, float] = {
    AlarmTest.known_rounds_normal_scores: 0.70,
    AlarmTest.final_model_normal_scores: 0.10,
    AlarmTest.known_rounds_fdp_one_run: 0.20,
}
#: Share of a test's level spent over the per-round looks (the rest at the final look).
PER_ROUND_SHARE: dict[AlarmTest, float] = {
    AlarmTest.known_rounds_normal_scores: 0.30,
    AlarmTest.final_model_normal_scores: 0.0,
    AlarmTest.known_rounds_fdp_one_run: 0.0,
}

_KNOWN_ROUNDS = ThreatModel.known_rounds


def look_level(
    test: AlarmTest | str, look: int, num_looks: int, *, alpha: float = ALARM_ALPHA
) -> float:
    """The level ``test`` is held to at ``look`` (1-based; ``look == num_looks`` is the final
    evaluation). Summed over all looks and tests the levels are ``alpha``. 0 means the test is
    not evaluated at that look."""
    test = AlarmTest(test)
    check_integer_at_least(num_looks, "num_looks", 1)
    check_integer_at_least(look, "look", 1)
    if look > num_looks:
        raise ValueError(f"look must be <= num_looks ({num_looks}), got {look}")
    alpha = check_confidence(alpha)  # same (0, 1) check
    share = alpha * ALARM_BUDGET[test]
    if num_looks == 1:
        return share
    per_round = PER_ROUND_SHARE[test]
    if look == num_looks:
        return share * (1.0 - per_round)
    return share * per_round / (num_looks - 1)


def _as_dict(test) -> dict[str, Any]:
    data = test.to_dict() if hasattr(test, "to_dict") else dict(test)
    if "p_value" not in data or "claim" not in data:
        raise ValueError("each test must be a ClaimTestResult or its to_dict()")
    return data


def _alarm_test(data: dict) -> AlarmTest | None:
    name = (data.get("details") or {}).get("test")
    try:
        return AlarmTest(name)
    except ValueError:
        return None


@dataclass(frozen=True)
class AlarmDecision:
    """The alarm at one look.

    Attributes
    ----------
    status : str
        ``error`` (the known-rounds claim refuted), ``ok`` (nothing rejected) or
        ``no_dp_claim`` (noise multiplier 0).
    look, num_looks : int
        Which look this is, of how many.
    level_per_test : float
        The largest level any test was held to at this look.
    rejected : list of dict
        The tests that rejected (``to_dict()`` form, with ``level`` added).
    guarantee : str
        The one sentence for the API and the dashboard (:func:`alarm_guarantee`).
    refuted_by : dict or None
        The rejecting test with the largest lower bound: ``test``, ``threat_model``, ``tier``,
        ``p_value``, ``level``, ``claim_mu``, ``mu_lo`` (the valid lower bound from inverting
        that test at its level), ``epsilon_lo`` (its epsilon at ``delta``), ``confidence``
        (``1 - alpha``: the alarm's overall confidence).
    """

    status: str
    look: int
    num_looks: int
    level_per_test: float
    rejected: list[dict] = field(default_factory=list)
    guarantee: str = ""
    refuted_by: dict | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "look": self.look,
            "num_looks": self.num_looks,
            "level_per_test": self.level_per_test,
            "rejected": self.rejected,
            "guarantee": self.guarantee,
            "refuted_by": self.refuted_by,
        }


def alarm_guarantee(claims, *, num_looks: int, alpha: float = ALARM_ALPHA, **_ignored) -> str:
    """One sentence stating what the alarm guarantees for these claims (from
    :func:`flaudit.auditor.claims.audit_claims`), shown verbatim by the API and the dashboard."""
    check_integer_at_least(num_looks, "num_looks", 1)
    known = [c for c in claims if c.threat_model == _KNOWN_ROUNDS]
    if not any(c.is_claim for c in known):
        return (
            "No DP claim: the noise multiplier is 0, so there is no privacy claim to test "
            "and no DP alarm can fire."
        )
    return (
        f"If DP-FedAvg meets its claim ({known[0].mu:.3g}-Gaussian DP towards a canary whose "
        f"rounds are known), the alarm fires with probability at most {alpha:.0%} over all "
        f"{num_looks} looks (after every round and at the end) and all claim tests combined."
    )


def _mu_lo(test: AlarmTest, data: dict, level: float) -> float | None:
    details = data.get("details") or {}
    if test in (AlarmTest.known_rounds_normal_scores, AlarmTest.final_model_normal_scores):
        try:
            return NormalScoreTest.from_details(details).mu_lo(level)
        except (KeyError, TypeError, ValueError):
            return None
    if test is AlarmTest.known_rounds_fdp_one_run:
        try:
            return fdp_mu_lo(
                int(details["correct"]), int(details["guesses"]), int(details["m"]), level
            )
        except (KeyError, TypeError, ValueError):
            return None
    return None


def decide_alarm(
    tests,
    *,
    look: int,
    num_looks: int,
    claims=None,
    alpha: float = ALARM_ALPHA,
    delta: float | None = None,
    **_ignored,
) -> AlarmDecision:
    """Decide the alarm at one look from the claim tests evaluated there.

    Parameters
    ----------
    tests : iterable of ClaimTestResult or dict
        The claim tests of this look (``AuditSummary.claim_tests``); only the alarm tests
        (``details["test"]`` an :class:`AlarmTest`) of the known-rounds claim count.
    look : int
        1-based look; ``num_looks`` is the final evaluation (after training).
    num_looks : int
        Looks declared in advance: ``num_rounds + 1``.
    claims : list, optional
        The audit's claims, for the guarantee sentence and the ``no_dp_claim`` status.
    alpha : float
        False-alarm probability over all looks and tests.
    delta : float, optional
        delta at which ``refuted_by["epsilon_lo"]`` reads ``mu_lo`` (omitted: None).
    """

    data = [_as_dict(t) for t in tests]
    if claims is not None:
        claims = list(claims)
        no_claim = not any(c.is_claim for c in claims if c.threat_model == _KNOWN_ROUNDS)
        guarantee = alarm_guarantee(claims, num_looks=num_looks, alpha=alpha)
    else:
        no_claim = bool(data) and all((t["claim"] or {}).get("kind") == "no_dp_claim" for t in data)
        guarantee = (
            "No DP claim: the noise multiplier is 0, so there is no privacy claim to test and no "
            "DP alarm can fire."
            if no_claim
            else f"The alarm fires with probability at most {alpha:.0%} over all {num_looks} looks and "
            "all claim tests combined when the claim holds."
        )
    if no_claim:
        return AlarmDecision("no_dp_claim", look, num_looks, 0.0, [], guarantee)
    rejected, best, largest = [], None, 0.0
    for item in data:
        test = _alarm_test(item)
        claim = item.get("claim") or {}
        if (
            test is None
            or claim.get("kind") == "no_dp_claim"
            or item.get("threat_model") not in (_KNOWN_ROUNDS, "final_model")
            or claim.get("threat_model") != _KNOWN_ROUNDS
        ):
            continue
        level = look_level(test, look, num_looks, alpha=alpha)
        largest = max(largest, level)
        if level <= 0 or float(item["p_value"]) > level:
            continue
        mu_lo = _mu_lo(test, item, level)
        # kept with the alert: without the per-round arrays the exact test carries (its
        # statistic, counts and claim stay)
        details = {
            k: v
            for k, v in (item.get("details") or {}).items()
            if k not in ("round_sums", "round_counts")
        }
        entry = dict(item, level=level, details=details)
        rejected.append(entry)
        refutation = {
            "test": test.value,
            "threat_model": item.get("threat_model"),
            "tier": test.tier.value,
            "p_value": float(item["p_value"]),
            "level": level,
            "claim_mu": claim.get("mu"),
            "mu_lo": mu_lo,
            "epsilon_lo": (
                None if mu_lo is None or delta is None else float(gdp_epsilon(mu_lo, delta))
            ),
            "confidence": 1.0 - alpha,
        }
        key = (test.tier is ValidityTier.assumption_free, mu_lo or 0.0)
        if best is None or key > best[0]:
            best = (key, refutation)
    status = "error" if rejected else "ok"
    return AlarmDecision(
        status, look, num_looks, largest, rejected, guarantee, None if best is None else best[1]
    )
