"""The DP alarm: claim tests evaluated at every look, with one false-alarm guarantee over all
looks and all tests (issue #10 item 6). Pure: p-values in, a decision out.

The service evaluates the claim tests (:func:`flaudit.auditor.estimators.gdp.claim_test`, collected by
:func:`flaudit.auditor.estimators.summarize` as ``AuditSummary.claim_tests``) after every round and at
the end: ``num_looks = num_rounds + 1`` looks, numbered ``1 .. num_looks``; the last is the
final evaluation. The level is spent over the looks (alpha-spending with fixed, pre-declared
shares): ``final_share * alpha`` at the final look, ``(1 - final_share) * alpha`` split evenly
over the ``num_looks - 1`` per-round looks; at each look the look's share is split evenly over
the tests evaluated there (Bonferroni). By the union bound, if every claim tested holds, the
probability that any test rejects at any look is at most ``alpha`` -- whatever the dependence
between looks and tests.

Levels: a rejected ``known_rounds`` claim (Gaussian DP ``mu = sqrt(r)/z`` for an adversary who
knows the canary's rounds; it holds for any participation schedule) is an **error**: a DP bug or
a wrong claim. The ``poisson_subsampled`` claim is about a client sampled by Poisson with rate
``q``; flaudit presents each seen canary in exactly ``r`` fixed periods, which is not that
schedule (with ``r / T > q`` a canary is more exposed than any Poisson client), so by default its
tests are reported but **not** alarming: on correct simulated runs they "rejected" in 30% of 200
runs (docs/fidelity.md §6). Pass ``poisson_warning=True`` when canaries really are sampled by
Poisson with rate ``q``: a rejection is then a **warning** (amplification by sampling looks
violated), under the same union bound. A spec with noise multiplier 0 has status
``no_dp_claim``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flaudit.auditor.estimators._validation import check_confidence
from flaudit.auditor.validation import check_integer_at_least

__all__ = ["ALARM_ALPHA", "AlarmDecision", "decide_alarm", "look_level", "alarm_guarantee"]

#: Default false-alarm probability over all looks and tests.
ALARM_ALPHA = 0.05
#: Share of alpha spent at the final look.
FINAL_SHARE = 0.5

_ERROR_CLAIMS = ("known_rounds",)


def look_level(look: int, num_looks: int, *, alpha: float = ALARM_ALPHA,
               final_share: float = FINAL_SHARE) -> float:
    """The level spent at ``look`` (1-based; ``look == num_looks`` is the final evaluation).

    ``final_share * alpha`` at the final look and ``(1 - final_share) * alpha / (num_looks - 1)``
    at each earlier one (all of ``alpha`` when there is a single look). The levels of all looks
    sum to ``alpha``.
    """
    check_integer_at_least(num_looks, "num_looks", 1)
    check_integer_at_least(look, "look", 1)
    if look > num_looks:
        raise ValueError(f"look must be <= num_looks ({num_looks}), got {look}")
    alpha = check_confidence(alpha)  # same (0, 1) check
    if not 0 < final_share <= 1:
        raise ValueError(f"final_share must be in (0, 1], got {final_share!r}")
    if num_looks == 1:
        return alpha
    if look == num_looks:
        return final_share * alpha
    return (1 - final_share) * alpha / (num_looks - 1)


def _as_test(test) -> dict[str, Any]:
    """A claim test (``ClaimTestResult`` or its ``to_dict()``) as a plain dict."""
    data = test.to_dict() if hasattr(test, "to_dict") else dict(test)
    if "p_value" not in data or "claim" not in data:
        raise ValueError("each test must be a ClaimTestResult or its to_dict()")
    return data


def _claim_kind(data: dict) -> str:
    return (data.get("claim") or {}).get("kind", "")


@dataclass(frozen=True)
class AlarmDecision:
    """The alarm at one look.

    Attributes
    ----------
    status : str
        ``error`` (a known-rounds claim rejected), ``warning`` (only a Poisson-subsampled claim
        rejected), ``ok`` (nothing rejected) or ``no_dp_claim`` (noise multiplier 0).
    look, num_looks : int
        Which look this is, of how many.
    level_per_test : float
        The level each test was held to at this look.
    rejected : list of dict
        The tests that rejected (their ``to_dict()`` form).
    guarantee : str
        The one sentence for the API and the dashboard (:func:`alarm_guarantee`).
    """

    status: str
    look: int
    num_looks: int
    level_per_test: float
    rejected: list[dict] = field(default_factory=list)
    guarantee: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "look": self.look, "num_looks": self.num_looks,
                "level_per_test": self.level_per_test, "rejected": self.rejected,
                "guarantee": self.guarantee}


def _alarming(threat_model: str | None, poisson_warning: bool) -> bool:
    return threat_model in _ERROR_CLAIMS or (poisson_warning and threat_model == "poisson_subsampled")


def alarm_guarantee(claims, *, num_looks: int, alpha: float = ALARM_ALPHA,
                    poisson_warning: bool = False) -> str:
    """One sentence stating what the alarm guarantees for these claims (from
    :func:`flaudit.auditor.estimators.gdp.audit_claims`), shown verbatim by the API and the dashboard."""
    check_integer_at_least(num_looks, "num_looks", 1)
    claims = [c for c in claims if _alarming(c.threat_model, poisson_warning)
              or not c.is_claim]
    known = [c for c in claims if c.threat_model == "known_rounds"]
    if not any(c.is_claim for c in claims):
        return ("No DP claim: the audit's noise multiplier is 0, so there is no privacy claim to "
                "test and no DP alarm can fire.")
    mu_text = f"{known[0].mu:.3g}-Gaussian DP for an adversary who knows a canary's rounds" \
        if known and known[0].is_claim else "its Gaussian-DP claim"
    return (
        f"If the DP implementation satisfies its claim{'s' if len(claims) > 1 else ''} ({mu_text}"
        + (", and the Poisson-subsampled curve" if any(c.threat_model == "poisson_subsampled"
                                                        and c.is_claim for c in claims) else "")
        + f"), {'an alarm (error or warning)' if poisson_warning else 'the error alarm'} fires "
        f"with probability at most {alpha:.0%} over all "
        f"{num_looks} looks (after every round and at the end) and all claim tests combined "
        f"({FINAL_SHARE:.0%} of the level at the final look, the rest split evenly over the "
        "per-round looks; Bonferroni over the tests at each look)."
    )


def decide_alarm(
    tests,
    *,
    look: int,
    num_looks: int,
    claims=None,
    alpha: float = ALARM_ALPHA,
    final_share: float = FINAL_SHARE,
    poisson_warning: bool = False,
) -> AlarmDecision:
    """Decide the alarm at one look from the claim tests evaluated there.

    Parameters
    ----------
    tests : iterable of ClaimTestResult or dict
        The claim tests of this look (e.g. ``AuditSummary.claim_tests``); tests of a
        :class:`~flaudit.auditor.estimators.gdp.NoDPClaim` are ignored.
    look : int
        1-based look number; ``num_looks`` is the final evaluation (after training).
    num_looks : int
        Looks declared in advance: ``num_rounds + 1`` for the service (after every round and
        at the end).
    claims : list, optional
        The audit's claims (:func:`flaudit.auditor.estimators.gdp.audit_claims`), for the guarantee
        sentence and the ``no_dp_claim`` status; inferred from the tests when omitted.
    alpha : float
        False-alarm probability over all looks and tests.
    final_share : float
        Share of ``alpha`` spent at the final look.
    poisson_warning : bool
        Let ``poisson_subsampled`` claim tests raise warnings (only when canaries are sampled by
        Poisson with the claim's rate; see the module docstring). Default: reported, not
        alarming.

    Returns
    -------
    AlarmDecision
    """
    data = [_as_test(t) for t in tests]
    level = look_level(look, num_looks, alpha=alpha, final_share=final_share)
    active = [t for t in data if _claim_kind(t) != "no_dp_claim"
              and _alarming((t["claim"] or {}).get("threat_model"), poisson_warning)]
    if claims is not None:
        claims = list(claims)
        guarantee = alarm_guarantee(claims, num_looks=num_looks, alpha=alpha,
                                    poisson_warning=poisson_warning)
        no_claim = not any(c.is_claim for c in claims)
    else:
        no_claim = bool(data) and all(_claim_kind(t) == "no_dp_claim" for t in data)
        guarantee = (
            "No DP claim: the audit's noise multiplier is 0, so there is no privacy claim to test "
            "and no DP alarm can fire." if no_claim else
            f"An alarm fires with probability at most {alpha:.0%} over all {num_looks} looks and "
            "all claim tests combined when every claim tested holds."
        )
    if no_claim:
        return AlarmDecision("no_dp_claim", look, num_looks, 0.0, [], guarantee)
    per_test = level / max(len(active), 1)
    rejected = [t for t in active if float(t["p_value"]) <= per_test]
    if any((t["claim"] or {}).get("threat_model") in _ERROR_CLAIMS for t in rejected):
        status = "error"
    elif rejected:
        status = "warning"
    else:
        status = "ok"
    return AlarmDecision(status, look, num_looks, per_test, rejected, guarantee)
