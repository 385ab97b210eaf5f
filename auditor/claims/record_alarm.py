"""The record-level claim tests, alarm, design and cause (issue #37): pure math for the audit of
DP-SGD inside the clients, with record canaries (:mod:`flaudit.auditor.estimators.record_level`).

The claim
    A seen record canary is sampled at every DP-SGD step of its client with the optimizer's
    Poisson rate ``q`` and adds ``max_grad_norm`` times its direction to the clipped sum before
    the noise ``N(0, (z C)^2)``: exactly a real example of clipped norm ``C``. Towards it the
    client's updates over ``s`` steps are the Poisson-subsampled Gaussian ``(z, q)`` composed
    ``s`` times (adaptively: the gradients may depend on earlier steps), so every score computed
    from them -- the cosine of the client's summed update with the canary -- meets that trade-off
    curve. :func:`record_claim` builds it (dp-accounting's PLD, pessimistic: a valid curve).
    An unseen canary is never included.

The tests (one look after every round, one at the end)
    * ``record_independent``: :func:`flaudit.auditor.claims.claim_test`, seen against unseen
      scores (binomial tails of the false positives and negatives under the curve, Bonferroni
      over thresholds). Its binomial tails treat the canaries' scores as independent: the
      projections of the Gaussian noise on orthogonal canaries are independent; the shared
      norm of the update and the data gradients couple them weakly (tier
      ``independent_canaries``, as the user-level normal-score test).

    :data:`PER_ROUND_SHARE` of ``alpha`` is spread evenly over the per-round looks and the rest
    spent at the final look: by the union bound a run that meets its claim alarms with
    probability at most ``alpha`` over all looks.

    Not in the alarm yet: the assumption-free one-run f-DP guessing game (Mahloujifar et al.
    2025). On the PLD curve its p-value took 66 s per look (bisection on the curve, measured on
    a shared 2-core machine, 2000 canaries) and, with 10% of the canaries guessed at each end,
    it did not reject half the claimed noise (p = 0.2 to 0.4 over 5 looks, 10 clients, 45
    steps) where the independent test did (p = 3e-4 from the second round).

The cause (:func:`record_cause`)
    From the canaries' projections in absolute units the engine measures the noise the unseen
    canaries meet (in units of the claimed ``z C``) and the shift a seen canary's inclusion
    makes (in units of ``C``): too little noise names the noise, too large a shift names the
    clipping, neither names the sampling or the accounting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..results import jsonable
from .curve_tests import claim_test
from .curves import NoDPClaim, TradeOffClaim, poisson_subsampled_claim

__all__ = [
    "PER_ROUND_SHARE",
    "RECORD_ALPHA",
    "RecordAlarm",
    "RecordCause",
    "decide_record_alarm",
    "record_cause",
    "record_claim",
    "record_claim_tests",
    "record_design",
    "record_look_level",
    "record_verdict",
]

#: False-alarm probability over all looks.
RECORD_ALPHA = 0.05
#: Share of a test's level spent evenly over the per-round looks (the rest at the final look).
PER_ROUND_SHARE = 0.3


def record_claim(noise_multiplier: float, sample_rate: float, steps: int) -> TradeOffClaim:
    """The trade-off curve a record-level claim ``(z, q)`` gives a canary over ``steps`` DP-SGD
    steps: the Poisson-subsampled Gaussian composed ``steps`` times (dp-accounting PLD).

    To be replaced by ``auditor/estimators/record_claim.py``'s ``record_level_claimed_mu``
    (issue #37, helper h37stats) where a Gaussian-DP ``mu`` with its validity proof is wanted;
    the curve here is the exact composed mechanism, so it is valid as it stands.
    """
    if noise_multiplier == 0:
        return NoDPClaim(threat_model="record_level")
    return poisson_subsampled_claim(noise_multiplier, sample_rate, int(steps))


def record_look_level(look: int, num_looks: int, *, alpha: float = RECORD_ALPHA) -> float:
    """The level the claim test is held to at ``look`` (1-based; ``num_looks`` is the final
    look); the levels of all looks sum to ``alpha``."""
    if not 1 <= look <= num_looks:
        raise ValueError(f"look must be in [1, {num_looks}], got {look}")
    share = float(alpha)
    if num_looks == 1:
        return share
    if look == num_looks:
        return share * (1.0 - PER_ROUND_SHARE)
    return share * PER_ROUND_SHARE / (num_looks - 1)


def record_claim_tests(scores, seen_mask, *, claim) -> list[dict[str, Any]]:
    """The record-level test of the canaries' scores (NaN: a canary whose client has not
    trained yet, left out) against ``claim``; one dict per test (``test``, ``tier``,
    ``p_value``, ``method``, ``details``)."""
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    seen = np.asarray(seen_mask, dtype=bool).reshape(-1)
    if scores.size != seen.size:
        raise ValueError(f"{scores.size} scores for {seen.size} canaries")
    keep = np.isfinite(scores)
    scores, seen = scores[keep], seen[keep]
    if not claim.is_claim or seen.sum() == 0 or (~seen).sum() == 0:
        note = "no DP claim: nothing to test" if not claim.is_claim else "too few scored canaries"
        return [
            {
                "test": "record_independent",
                "tier": "independent_canaries",
                "p_value": 1.0,
                "method": note,
                "details": {},
            }
        ]
    independent = claim_test(scores[seen], scores[~seen], claim=claim, threat_model="record_level")
    return [
        {
            "test": "record_independent",
            "tier": "independent_canaries",
            "p_value": float(independent.p_value),
            "method": independent.method,
            "details": jsonable(independent.details),
        }
    ]


@dataclass(frozen=True)
class RecordAlarm:
    """The record-level alarm at one look: ``error`` (a test rejected at its level), ``ok`` or
    ``no_dp_claim``; ``rejected`` lists the rejecting tests with their levels."""

    status: str
    look: int
    num_looks: int
    steps: int
    claim_epsilon: float
    tests: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "status": self.status,
                "look": self.look,
                "num_looks": self.num_looks,
                "steps": self.steps,
                "claim_epsilon": self.claim_epsilon,
                "tests": self.tests,
                "rejected": self.rejected,
            }
        )


def decide_record_alarm(
    scores,
    seen_mask,
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    look: int,
    num_looks: int,
    delta: float,
    alpha: float = RECORD_ALPHA,
) -> RecordAlarm:
    """Test the scores at one look against the claim over ``steps`` (the most steps any canary's
    client has trained so far: a canary with fewer steps meets a tighter curve, which the wider
    one dominates) and decide the alarm."""
    claim = record_claim(noise_multiplier, sample_rate, steps)
    if not claim.is_claim:
        return RecordAlarm("no_dp_claim", look, num_looks, steps, math.inf)
    tests = record_claim_tests(scores, seen_mask, claim=claim)
    rejected = []
    for test in tests:
        level = record_look_level(look, num_looks, alpha=alpha)
        test["level"] = level
        if level > 0 and test["p_value"] <= level:
            rejected.append(test)
    status = "error" if rejected else "ok"
    return RecordAlarm(status, look, num_looks, steps, claim.epsilon(delta), tests, rejected)


@dataclass(frozen=True)
class RecordCause:
    """What the canaries measure: ``noise_ratio`` (the noise the unseen canaries meet over the
    claimed ``z C``, with its standard error), ``sensitivity_ratio`` (a seen canary's mean shift
    per inclusion over ``C``, with its standard error) and the ``cause`` they point to
    (``noise``, ``clipping``, ``sampling``) with one sentence."""

    noise_ratio: float
    noise_ratio_se: float
    sensitivity_ratio: float
    sensitivity_ratio_se: float
    cause: str
    sentence: str

    def to_dict(self) -> dict[str, Any]:
        return jsonable(self.__dict__)


#: Below this noise ratio (and its upper 2-SE end below 1) the noise is named; above this
#: sensitivity ratio (and its lower 2-SE end above 1) the clipping.
NOISE_RATIO_LIMIT = 0.85
SENSITIVITY_RATIO_LIMIT = 1.2


def record_cause(noise_units, shift_units, seen_mask, *, noise_multiplier: float) -> RecordCause:
    """Name the cause of a refuted record-level claim from the canaries' projections.

    Parameters
    ----------
    noise_units : array, one per canary (NaN: not scored)
        The projection ``-U . c_j`` divided by its claimed noise scale ``(lr / B) C b_j`` with
        ``b_j^2`` the sum of the squared momentum factors of the steps it could be in: for an
        unseen canary ``N(0, (z_eff / 1)^2)`` up to the data gradient's small share.
    shift_units : array, one per canary
        The same projection divided by ``(lr / B) C q a_j`` with ``a_j`` the sum of the momentum
        factors: for a seen canary its mean is ``C_eff / C``, for an unseen one 0.
    """
    seen = np.asarray(seen_mask, dtype=bool)
    u = np.asarray(noise_units, dtype=np.float64)
    v = np.asarray(shift_units, dtype=np.float64)
    ok = np.isfinite(u) & np.isfinite(v)
    unseen_u = u[ok & ~seen]
    seen_v, unseen_v = v[ok & seen], v[ok & ~seen]
    z = float(noise_multiplier)
    if unseen_u.size < 2 or seen_v.size < 2 or z == 0:
        return RecordCause(math.nan, math.nan, math.nan, math.nan, "unknown", "too few canaries")
    noise = float(np.sqrt(np.mean(unseen_u**2))) / z
    noise_se = noise / math.sqrt(2 * unseen_u.size)
    shift = float(np.mean(seen_v) - np.mean(unseen_v))
    shift_se = float(
        math.sqrt(np.var(seen_v, ddof=1) / seen_v.size + np.var(unseen_v, ddof=1) / unseen_v.size)
    )
    if noise < NOISE_RATIO_LIMIT and noise + 2 * noise_se < 1:
        cause = "noise"
        sentence = (
            f"noise: the unseen canaries meet {noise:.2f} (+/- {noise_se:.2f}) times the claimed "
            f"noise z*C (z = {z:g}): the optimizer adds less noise than it claims"
        )
    elif shift > SENSITIVITY_RATIO_LIMIT and shift - 2 * shift_se > 1:
        cause = "clipping"
        sentence = (
            f"clipping: one canary example moves the update {shift:.2f} (+/- {shift_se:.2f}) "
            "times max_grad_norm while the noise measures as claimed "
            f"({noise:.2f} x z*C): per-example clipping is not enforced"
        )
    else:
        cause = "sampling"
        sentence = (
            f"sampling or accounting: the noise ({noise:.2f} x z*C) and a canary's shift "
            f"({shift:.2f} x C) measure as claimed, yet the canaries leak more than the "
            "Poisson-subsampled claim allows (examples not Poisson-sampled, or steps the "
            "accountant did not count)"
        )
    return RecordCause(noise, noise_se, shift, shift_se, cause, sentence)


def _simulated_scores(
    rng: np.random.Generator, seen: np.ndarray, z_true: float, q: float, steps: int
) -> np.ndarray:
    """Scores of the noise-dominated model (plain SGD): a seen canary included ``Bin(s, q)``
    times is ``N(n / (z_true sqrt(s)), 1)``, an unseen one ``N(0, 1)``."""
    counts = rng.binomial(steps, q, size=seen.size) * seen
    return counts / (z_true * math.sqrt(steps)) + rng.standard_normal(seen.size)


def record_design(
    *,
    num_canaries: int,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    num_looks: int,
    noise_scale: float = 0.5,
    runs: int = 40,
    seed: int = 0,
    alpha: float = RECORD_ALPHA,
) -> dict[str, Any]:
    """What a record-level audit can catch, before it runs.

    ``claim_epsilon``: the claim over ``steps``; ``best_p_value``: the independent test's p-value
    on the best outcome (every seen canary above every unseen one), against its final level
    (``refutable``: the audit can refute the claim at all); ``power``: the fraction of
    ``runs`` simulated audits (noise-dominated score model, public ``seed``) whose final look
    refutes the claim when the optimizer adds ``noise_scale`` times the claimed noise.
    """
    claim = record_claim(noise_multiplier, sample_rate, steps)
    if not claim.is_claim:
        return {
            "claim_epsilon": math.inf,
            "refutable": False,
            "power": 0.0,
            "summary": "no DP claim",
        }
    eps = float(claim.epsilon(delta))
    level = record_look_level(num_looks, num_looks, alpha=alpha)
    n_seen = num_canaries // 2
    best = claim_test(np.ones(n_seen), np.zeros(num_canaries - n_seen), claim=claim).p_value
    rng = np.random.default_rng(seed)
    caught = 0
    for _ in range(runs):
        seen = rng.random(num_canaries) < 0.5
        scores = _simulated_scores(rng, seen, noise_multiplier * noise_scale, sample_rate, steps)
        p = claim_test(scores[seen], scores[~seen], claim=claim).p_value
        caught += p <= level
    power = caught / runs
    refutable = best <= level
    summary = (
        f"record-level claim epsilon = {eps:.3g} at delta = {delta:g} for a canary over {steps} "
        f"DP-SGD steps (z = {noise_multiplier:g}, q = {sample_rate:.4g}); {num_canaries} record "
        f"canaries, half seen by secret coins; "
        + (
            f"catches {noise_scale:g} x the claimed noise in about {power:.0%} of runs "
            f"(noise-dominated model, {runs} simulated runs)"
            if refutable
            else f"cannot refute this claim even when every seen canary outscores every unseen "
            f"one (best p-value {best:.2g} > final level {level:.2g}): more canaries or more "
            "steps are needed"
        )
    )
    return {
        "claim_epsilon": eps,
        "best_p_value": float(best),
        "final_level": level,
        "refutable": bool(refutable),
        "noise_scale": noise_scale,
        "power": power,
        "runs": runs,
        "summary": summary,
    }


def record_verdict(
    *,
    noise_multiplier: float,
    looks: list[dict[str, Any]],
    cause: dict[str, Any] | None,
    design: dict[str, Any],
    run_epsilon: float,
    delta: float,
) -> dict[str, str]:
    """The verdict of a record-level audit from its looks (:meth:`RecordAlarm.to_dict` with the
    look's ``round``, None for the final look), the cause measured at the first alarm and the
    design: ``status`` (``claim_refuted``, ``consistent``, ``inconclusive``, ``no_dp_claim``) and
    one ``summary`` sentence."""
    first = next((look for look in looks if look["status"] == "error"), None)
    if noise_multiplier == 0:
        return {
            "status": "no_dp_claim",
            "summary": "No DP claim: the noise multiplier is 0, so there is no privacy claim "
            "to test.",
        }
    if first is not None:
        where = "at the end" if first["round"] is None else f"at round {first['round']}"
        test = first["rejected"][0]
        because = "" if cause is None else f" Cause: {cause['sentence']}."
        return {
            "status": "claim_refuted",
            "summary": f"Claim refuted {where}: the record canaries' scores are more separable "
            f"than record-level epsilon = {first['claim_epsilon']:.3g} over {first['steps']} "
            f"DP-SGD steps allows (p = {test['p_value']:.2g} <= level {test['level']:.2g})."
            + because,
        }
    if not design["refutable"]:
        return {
            "status": "inconclusive",
            "summary": f"Inconclusive: this audit cannot refute its claim. {design['summary']}.",
        }
    return {
        "status": "consistent",
        "summary": f"Consistent with the claim: record-level epsilon = {run_epsilon:.3g} at "
        f"delta = {delta:g} over the run was not refuted at any of {len(looks)} looks (the "
        f"audit catches half the claimed noise in about {design['power']:.0%} of runs).",
    }
