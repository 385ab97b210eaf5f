"""Gaussian DP (f-DP) audits: claims as trade-off curves, a valid lower bound on mu, a test of
the claim itself, and the one-run f-DP audit (issue #10).

A mechanism satisfies the trade-off curve ``f`` when every test separating neighbours has
``FNR >= f(FPR)`` (Dong, Roth & Su 2019). It is ``mu``-GDP when ``f = G_mu`` with
``G_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu)``: no test does better than telling ``N(0, 1)`` from
``N(mu, 1)``. DP-FedAvg gives a canary seen in ``r`` known rounds with noise multiplier ``z``
exactly ``mu = sqrt(r) / z`` (``z_total`` under adaptive clipping). Testing the whole curve uses
the bulk of the canary scores, where an (epsilon, delta) point needs their extreme tail.

Contents
--------
Claims (:class:`GaussianDPClaim`, :class:`EpsilonDeltaCurveClaim`, :class:`NoDPClaim`) and the
one function computing an audit's claims, :func:`audit_claims`.
:func:`gdp_lower_bound`
    ``mu_lo = max_a Phi^-1(1 - FPR_up(a)) - Phi^-1(FNR_up(a))`` with Clopper-Pearson upper
    bounds (exact null FPR for the final model), thresholds chosen as in
    :func:`flaudit.auditor.estimators.epsilon_lower_bound`. A valid refutation of every ``mu``-GDP claim
    with ``mu < mu_lo`` at the stated confidence (with a valid correction).
:func:`claim_test`
    A p-value for the observed counts against a claimed curve ``f``.
:func:`fdp_one_run_lower_bound` / :func:`fdp_one_run_p_value`
    The guessing-game audit of Mahloujifar, Melis & Chaudhuri (ICML 2025) with the claimed curve.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import optimize, special

from flaudit.auditor.estimators._validation import (
    check_confidence,
    check_delta,
    check_mask,
    check_nonnegative,
    check_scores,
)
from flaudit.auditor.estimators.lower_bound import (
    GDP_BONFERRONI,
    Bonferroni,
    CorrectionStrategy,
    NoCorrection,
    _bounds,
    check_threshold_inputs,
    clopper_pearson_upper,
    search_thresholds,
    threshold_counts,
)
from flaudit.auditor.estimators.null import null_logsf
from flaudit.auditor.estimators.one_run import default_guess_grid
from flaudit.auditor.estimators.two_gaussian import _log_gm_delta
from flaudit.auditor.results import Correction, EpsilonResult, Estimator

__all__ = [
    "GaussianDPClaim",
    "EpsilonDeltaCurveClaim",
    "NoDPClaim",
    "TradeOffClaim",
    "GaussianDPResult",
    "ClaimTestResult",
    "audit_claims",
    "poisson_subsampled_claim",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_lower_bound",
    "claim_test",
    "fdp_one_run_p_value",
    "fdp_one_run_lower_bound",
    "KNOWN_ROUNDS",
    "POISSON_SUBSAMPLED",
]

KNOWN_ROUNDS = "known_rounds"
POISSON_SUBSAMPLED = "poisson_subsampled"
_MU_MAX = 1e3  # mu_lo is capped here (a test with FPR and FNR both ~ 0)


# -- Gaussian DP <-> (epsilon, delta) ----------------------------------------------------------

def gdp_delta(mu: float, epsilon: float) -> float:
    """``delta(epsilon)`` of a ``mu``-GDP mechanism: ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``
    (Dong, Roth & Su 2019, Cor. 2.13), computed in log space."""
    mu = float(mu)
    if math.isnan(mu) or mu < 0:
        raise ValueError(f"mu must be >= 0, got {mu!r}")
    epsilon = check_nonnegative(epsilon, "epsilon")
    if mu == 0:
        return 0.0
    if math.isinf(mu):
        return 1.0
    return math.exp(_log_gm_delta(mu, epsilon))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest ``epsilon >= 0`` with ``delta(epsilon) <= delta`` for a ``mu``-GDP mechanism
    (``0`` for ``mu = 0``, ``inf`` for ``mu = inf``)."""
    delta = check_delta(delta)
    mu = float(mu)
    if math.isnan(mu) or mu < 0:
        raise ValueError(f"mu must be >= 0, got {mu!r}")
    if mu == 0:
        return 0.0
    if math.isinf(mu):
        return math.inf
    log_delta = math.log(delta)

    def objective(eps: float) -> float:
        return max(_log_gm_delta(mu, eps), -1e4) - log_delta

    if objective(0.0) <= 0:
        return 0.0
    hi = max(1.0, mu * mu)
    while objective(hi) > 0:
        hi *= 2
    return float(optimize.brentq(objective, 0.0, hi, xtol=1e-12, rtol=1e-10))


def _gdp_tradeoff(mu: float, alpha) -> np.ndarray:
    """``G_mu(alpha) = Phi(-Phi^-1(alpha) - mu)`` (accurate for small alpha)."""
    a = np.clip(np.asarray(alpha, dtype=np.float64), 0.0, 1.0)
    if math.isinf(mu):
        return np.zeros_like(a)
    with np.errstate(divide="ignore"):
        return special.ndtr(-special.ndtri(a) - mu)


# -- claims as trade-off curves ----------------------------------------------------------------

@dataclass(frozen=True)
class GaussianDPClaim:
    """``mu``-Gaussian DP: the trade-off curve ``f(alpha) = Phi(Phi^-1(1 - alpha) - mu)``.

    Attributes
    ----------
    mu : float
        ``mu >= 0`` (``inf`` is a claim of nothing).
    threat_model : str
        Which adversary the claim is about (``known_rounds`` for DP-FedAvg's ``sqrt(r)/z``).
    description : str
        One line a user can read.
    """

    mu: float
    threat_model: str = KNOWN_ROUNDS
    description: str = ""
    is_claim = True

    def __post_init__(self) -> None:
        mu = float(self.mu)
        if math.isnan(mu) or mu < 0:
            raise ValueError(f"mu must be >= 0, got {self.mu!r}")
        object.__setattr__(self, "mu", mu)

    def tradeoff(self, alpha) -> np.ndarray:
        """``f(alpha)``: the smallest FNR any test with FPR ``alpha`` may have."""
        return _gdp_tradeoff(self.mu, alpha)

    def epsilon(self, delta: float) -> float:
        """The (epsilon, delta) reading of the claim (Dong-Roth-Su conversion)."""
        return gdp_epsilon(self.mu, delta)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "gaussian_dp", "mu": _json(self.mu), "threat_model": self.threat_model,
                "description": self.description}


@dataclass(frozen=True)
class EpsilonDeltaCurveClaim:
    """A trade-off curve from a privacy profile ``delta(epsilon)`` on a grid of epsilons:

        f(alpha) = max_i max(0, 1 - delta_i - e^eps_i alpha, e^-eps_i (1 - delta_i - alpha)).

    Every ``(eps_i, delta_i)`` the mechanism satisfies implies ``FNR >= `` each term, so ``f`` is
    a valid lower envelope of the mechanism's exact curve (tight as the grid gets finer). Used
    for the Poisson-subsampled claim from dp-accounting's privacy loss distribution
    (:func:`poisson_subsampled_claim`).
    """

    epsilons: tuple[float, ...]
    deltas: tuple[float, ...]
    threat_model: str = POISSON_SUBSAMPLED
    description: str = ""
    is_claim = True

    def __post_init__(self) -> None:
        eps = np.asarray(self.epsilons, dtype=np.float64)
        dl = np.asarray(self.deltas, dtype=np.float64)
        if eps.ndim != 1 or eps.shape != dl.shape or eps.size == 0:
            raise ValueError("epsilons and deltas must be non-empty 1-d sequences of equal length")
        if np.any(~np.isfinite(eps)) or np.any(eps < 0) or np.any((dl < 0) | (dl > 1)):
            raise ValueError("epsilons must be finite >= 0 and deltas in [0, 1]")
        object.__setattr__(self, "epsilons", tuple(float(e) for e in eps))
        object.__setattr__(self, "deltas", tuple(float(x) for x in dl))

    def tradeoff(self, alpha) -> np.ndarray:
        a = np.clip(np.asarray(alpha, dtype=np.float64), 0.0, 1.0)
        eps = np.asarray(self.epsilons)[:, None]
        dl = np.asarray(self.deltas)[:, None]
        flat = a.reshape(1, -1)
        one = 1.0 - dl - np.exp(eps) * flat
        two = np.exp(-eps) * (1.0 - dl - flat)
        return np.maximum(np.max(np.maximum(one, two), axis=0), 0.0).reshape(a.shape)

    def epsilon(self, delta: float) -> float:
        """Smallest grid epsilon whose delta is ``<= delta`` (inf when none)."""
        delta = check_delta(delta)
        ok = [e for e, d in zip(self.epsilons, self.deltas) if d <= delta]
        return min(ok) if ok else math.inf

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "epsilon_delta_curve", "threat_model": self.threat_model,
                "description": self.description, "num_points": len(self.epsilons)}


@dataclass(frozen=True)
class NoDPClaim:
    """The audit claims no differential privacy (noise multiplier 0): ``f = 0``, nothing to
    refute, and every report says "no DP claim" instead of staying silent."""

    threat_model: str = KNOWN_ROUNDS
    description: str = "no DP claim: the noise multiplier is 0"
    is_claim = False
    mu = math.inf

    def tradeoff(self, alpha) -> np.ndarray:
        return np.zeros_like(np.asarray(alpha, dtype=np.float64))

    def epsilon(self, delta: float) -> float:
        check_delta(delta)
        return math.inf

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "no_dp_claim", "threat_model": self.threat_model,
                "description": self.description}


TradeOffClaim = GaussianDPClaim | EpsilonDeltaCurveClaim | NoDPClaim


def poisson_subsampled_claim(
    noise_multiplier: float,
    sampling_probability: float,
    num_rounds: int,
    *,
    value_discretization_interval: float = 1e-3,
    num_epsilons: int = 200,
) -> EpsilonDeltaCurveClaim | NoDPClaim:
    """The trade-off curve DP-FedAvg claims under Poisson participation: the Poisson-subsampled
    Gaussian (``z``, ``q``) composed ``num_rounds`` times, from dp-accounting's privacy loss
    distribution (pessimistic discretisation, so every ``delta(eps)`` is an upper bound and the
    curve a valid lower envelope). ``noise_multiplier = 0`` gives :class:`NoDPClaim`."""

    z = check_nonnegative(noise_multiplier, "noise_multiplier")
    q = check_nonnegative(sampling_probability, "sampling_probability")
    if not 0 < q <= 1:
        raise ValueError(f"sampling_probability must be in (0, 1], got {sampling_probability!r}")
    if isinstance(num_rounds, bool) or not isinstance(num_rounds, (int, np.integer)) or num_rounds < 1:
        raise ValueError(f"num_rounds must be an integer >= 1, got {num_rounds!r}")
    if z == 0:
        return NoDPClaim(threat_model=POISSON_SUBSAMPLED)
    return _poisson_curve(z, q, int(num_rounds), float(value_discretization_interval),
                          int(num_epsilons))


@functools.lru_cache(maxsize=32)
def _poisson_curve(z: float, q: float, num_rounds: int, value_discretization_interval: float,
                   num_epsilons: int) -> EpsilonDeltaCurveClaim:
    """The PLD computation behind :func:`poisson_subsampled_claim`, cached (claims are
    immutable; the service asks for the same audit's claims after every round)."""
    from dp_accounting.pld import privacy_loss_distribution

    pld = privacy_loss_distribution.from_gaussian_mechanism(
        z, sampling_prob=q, value_discretization_interval=value_discretization_interval
    ).self_compose(num_rounds)
    eps_max = max(float(pld.get_epsilon_for_delta(1e-12)), 1e-3)
    epsilons = np.linspace(0.0, eps_max, num_epsilons)
    deltas = np.minimum(np.asarray(pld.get_delta_for_epsilon(epsilons), dtype=np.float64), 1.0)
    return EpsilonDeltaCurveClaim(
        tuple(epsilons), tuple(deltas), threat_model=POISSON_SUBSAMPLED,
        description=f"dp-accounting PLD: Poisson-subsampled Gaussian (z={z:g}, q={q:g}) composed "
        f"over {num_rounds} rounds, as a trade-off curve from delta(eps) on {num_epsilons} "
        "epsilons",
    )


def audit_claims(spec, *, weight_factor: float | None = None) -> list[TradeOffClaim]:
    """The DP claims of an audit (:class:`flaudit.auditor.spec.AuditSpec`) as trade-off curves: one place
    for the service, ``flaudit run`` and the fidelity suite.

    * ``known_rounds``: ``mu = sqrt(r) / z_total`` GDP with ``r = spec.canary_repeats`` and
      ``z_total = spec.accounted_noise_multiplier`` -- exact for an adversary who knows the
      canary's rounds and sees every released aggregate, for any schedule.
    * ``poisson_subsampled`` (only when ``spec.participation`` is Poisson): the
      Poisson-subsampled curve (:func:`poisson_subsampled_claim`) with
      ``q = spec.sampling_probability`` and ``T = spec.num_rounds``.

    ``weight_factor`` (a weighted FedAvg: the heaviest influence a canary carried, in units of
    the ``C/n`` the noise is calibrated for; None or at most 1: uniform): the claims *at that
    influence*, what correct noise gives a canary that heavy -- ``W * mu`` for the known-rounds
    claim, noise multiplier ``z / W`` for the Poisson-subsampled one (docs/estimators.md,
    "Weighted FedAvg: two answers"). Noise multiplier 0 gives :class:`NoDPClaim` in place of each.
    """
    z = float(spec.accounted_noise_multiplier)
    r = int(spec.canary_repeats)
    w = 1.0 if weight_factor is None else float(weight_factor)
    if not math.isfinite(w):
        raise ValueError(f"weight_factor must be finite, got {weight_factor!r}")
    w = max(1.0, w)
    claims: list[TradeOffClaim] = []
    if z == 0:
        claims.append(NoDPClaim(threat_model=KNOWN_ROUNDS))
    elif w > 1.0:
        claims.append(GaussianDPClaim(
            w * math.sqrt(r) / z, threat_model=KNOWN_ROUNDS,
            description=f"Gaussian DP mu = {w:.4g} * sqrt({r}) / {z:g}: a canary in {r} known "
            f"round(s) with noise multiplier {z:g}, at {w:.4g}x the influence C/n (the heaviest "
            "weight of a weighted FedAvg)",
        ))
    else:
        claims.append(GaussianDPClaim(
            math.sqrt(r) / z, threat_model=KNOWN_ROUNDS,
            description=f"Gaussian DP mu = sqrt({r}) / {z:g}: a canary in {r} known round(s) "
            f"with noise multiplier {z:g}",
        ))
    participation = getattr(spec.participation, "value", spec.participation)
    if participation == "poisson":
        claims.append(poisson_subsampled_claim(z / w, spec.sampling_probability, spec.num_rounds))
    return claims


# -- results -----------------------------------------------------------------------------------

class GaussianDPResult(EpsilonResult):
    """An :class:`EpsilonResult` whose ``.mu`` is the lower bound ``mu_lo`` (also in
    ``details["mu"]``) and whose ``.epsilon`` is the epsilon at ``delta`` of the
    ``mu_lo``-Gaussian mechanism."""

    @property
    def mu(self) -> float:
        return float(self.details["mu"])


@dataclass(frozen=True)
class ClaimTestResult:
    """A p-value for canary scores against a claimed trade-off curve.

    ``p_value`` is small when the scores are unlikely under every mechanism satisfying the
    claim; ``rejected(alpha)`` is the level-``alpha`` test. A :class:`NoDPClaim` gives
    ``p_value = 1`` and ``has_claim = False``.
    """

    p_value: float
    claim: TradeOffClaim
    threat_model: str
    correction: Correction
    method: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def has_claim(self) -> bool:
        return bool(self.claim.is_claim)

    def rejected(self, alpha: float) -> bool:
        return self.has_claim and self.p_value <= alpha

    def to_dict(self) -> dict[str, Any]:
        return {
            "p_value": self.p_value,
            "claim": self.claim.to_dict(),
            "threat_model": self.threat_model,
            "correction": self.correction.value,
            "method": self.method,
            "details": {k: _json(v) for k, v in self.details.items()},
        }


def _json(value: Any) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


# -- shared argument handling ------------------------------------------------------------------

def _correction_label(correction: CorrectionStrategy) -> str:
    if isinstance(correction, NoCorrection):
        return "max over all thresholds, uncorrected (reported, never alarming; not a valid bound)"
    if isinstance(correction, Bonferroni):
        where = ("" if correction.quantiles is None else
                 " (" + ", ".join(f"{q:g}" for q in correction.quantiles) + ")")
        return (f"Bonferroni over {correction.num_thresholds} quantile thresholds of the seen "
                f"scores{where}")
    return f"threshold chosen on a {correction.frac} split, evaluated on the rest"


def _multiplicity(correction: CorrectionStrategy) -> int:
    return correction.num_thresholds if isinstance(correction, Bonferroni) else 1


# -- mu_lo ---------------------------------------------------------------------------------------

def _mu_bounds(seen, unseen, d, thresholds, alpha):
    """mu_lo at every threshold (level alpha for the pair of rates), with the rate bounds."""
    log_fpr, log_fnr = _bounds(seen, unseen, d, thresholds, alpha, upper=clopper_pearson_upper)
    with np.errstate(invalid="ignore"):
        mu = -special.ndtri_exp(log_fpr) - special.ndtri_exp(log_fnr)
    mu = np.clip(np.nan_to_num(mu, nan=0.0, posinf=_MU_MAX, neginf=0.0), 0.0, _MU_MAX)
    return mu, np.exp(log_fpr), np.exp(log_fnr)


def gdp_lower_bound(
    seen,
    unseen=None,
    *,
    d: int | None = None,
    delta: float,
    confidence: float = 0.95,
    correction: CorrectionStrategy = GDP_BONFERRONI,
    threat_model: str | None = None,
) -> GaussianDPResult:
    """Valid lower confidence bound on the Gaussian-DP parameter ``mu`` from threshold tests.

    For the test "seen when the score exceeds ``a``", ``mu``-GDP forces
    ``FNR >= Phi(Phi^-1(1 - FPR) - mu)``, i.e. ``mu >= Phi^-1(1 - FPR) - Phi^-1(FNR)``; with
    upper confidence bounds on both rates this gives

        mu_lo = max_a Phi^-1(1 - FPR_up(a)) - Phi^-1(FNR_up(a)).

    Rate bounds are one-sided Clopper-Pearson (exactly conservative). FPR is exact from the
    null cosine law in dimension ``d`` when ``unseen`` is omitted (final model, all canaries
    independent of the release), else a Clopper-Pearson bound on the unseen canaries (each
    rate at ``alpha / 2``).

    Parameters
    ----------
    seen : array_like
        Scores of the seen canaries (cosines, or known-rounds scores).
    unseen : array_like, optional
        Scores of the unseen canaries, computed the same way.
    d : int, optional
        Model dimension; required (and used for the exact null) when ``unseen`` is omitted.
    delta : float
        delta at which ``.epsilon`` reads ``mu_lo``.
    confidence : float
        Confidence of the bound.
    correction : Bonferroni, Split or NoCorrection
        Threshold strategy, as for :func:`flaudit.auditor.estimators.epsilon_lower_bound`. Only
        ``Bonferroni`` and ``Split`` are valid; ``NoCorrection`` is reported, never alarming.
    threat_model : str, optional
        Label; default ``final_model`` with the exact null, else ``all_iterates``.

    Returns
    -------
    GaussianDPResult
        ``.mu`` = ``mu_lo``; ``.epsilon`` = epsilon at ``delta`` of the ``mu_lo``-Gaussian
        mechanism: a valid refutation of any ``mu``-GDP claim with ``mu < mu_lo``. ``details``:
        ``mu``, ``threshold``, ``fpr_upper``, ``fnr_upper``, ``num_thresholds``, ``num_seen``,
        ``num_unseen``, ``fpr`` and ``rate_bounds``.
    """
    seen, unseen, d = check_threshold_inputs(seen, unseen, d, correction)
    delta = check_delta(delta)
    confidence = check_confidence(confidence)
    alpha = 1.0 - confidence
    if threat_model is None:
        threat_model = "final_model" if unseen is None else "all_iterates"

    def evaluate(s_, u_, thresholds, multiplicity):
        return _mu_bounds(s_, u_, d, thresholds, alpha / multiplicity)[0]

    choice = search_thresholds(seen, unseen, correction=correction, evaluate=evaluate,
                               empty_value=0.0)
    details: dict[str, Any] = {}
    fpr = fnr = 1.0
    if choice.note:
        details["note"] = choice.note
    else:
        _, fpr_a, fnr_a = _mu_bounds(choice.seen, choice.unseen, d,
                                     choice.thresholds[[choice.index]],
                                     alpha / _multiplicity(correction))
        fpr, fnr = float(fpr_a[0]), float(fnr_a[0])
    mu_lo = float(choice.value)
    details.update(
        mu=mu_lo,
        threshold=None if math.isnan(choice.threshold) else choice.threshold,
        fpr_upper=fpr,
        fnr_upper=fnr,
        num_thresholds=int(choice.thresholds.size),
        num_seen=int(choice.seen.size),
        num_unseen=None if choice.unseen is None else int(choice.unseen.size),
        fpr="exact null" if unseen is None else "clopper-pearson",
        rate_bounds="clopper-pearson",
    )
    return GaussianDPResult(
        epsilon=gdp_epsilon(mu_lo, delta),
        estimator=Estimator.gdp_lower_bound,
        threat_model=threat_model,
        delta=delta,
        correction=correction.kind,
        confidence=confidence,
        method="Gaussian-DP lower bound mu_lo = max over thresholds of Phi^-1(1 - FPR_up) - "
        "Phi^-1(FNR_up) (Clopper-Pearson; "
        + ("exact null FPR" if unseen is None else "FPR on unseen canaries")
        + f"; {_correction_label(correction)}); epsilon is that of the mu_lo-Gaussian mechanism "
        f"at delta. Valid when the scores are independent; one release's scores share its noise "
        f"scale, which can make it overstate (docs/estimators.md): mu_lo = {mu_lo:.4g}",
        details=details,
    )


# -- the claim test ------------------------------------------------------------------------------

def _claim_p_values(seen, unseen, d, thresholds, claim, multiplicity):
    """Per-threshold p-values (times ``multiplicity``, capped at 1) of the observed counts
    against the claimed curve: see :func:`claim_test`."""
    below, above = threshold_counts(seen, unseen, thresholds)
    n_s = seen.size
    if unseen is None:
        fpr = np.exp(null_logsf(thresholds, d))
        p = special.bdtr(below, n_s, np.clip(claim.tradeoff(fpr), 0.0, 1.0))
        p = np.where(below >= n_s, 1.0, p)
    else:
        n_u = unseen.size

        def g1(x):  # P[Bin(n_u, x) <= observed FP]: decreasing in x
            return np.where(above >= n_u, 1.0, special.bdtr(above, n_u, x))

        def g2(x):  # P[Bin(n_s, f(x)) <= observed FN]: increasing in x
            return np.where(below >= n_s, 1.0, special.bdtr(below, n_s, claim.tradeoff(x)))

        # sup over the curve of min(g1, g2) is at their crossing: bisect in log x
        lo = np.full(thresholds.shape, -40.0)
        hi = np.zeros(thresholds.shape)
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            x = np.exp(mid)
            left = g1(x) > g2(x)
            lo = np.where(left, mid, lo)
            hi = np.where(left, hi, mid)
        x_lo, x_hi = np.exp(lo), np.exp(hi)
        best = np.maximum(np.minimum(g1(x_lo), g2(x_lo)), np.minimum(g1(x_hi), g2(x_hi)))
        # x below e^-40: g1 ~ 1 there, so the sup is at least g2(0) = P[Bin(n_s, f(0)) <= FN]
        best = np.maximum(best, np.minimum(g1(np.zeros_like(x_lo)), g2(np.zeros_like(x_lo))))
        p = 2.0 * best
    return np.minimum(1.0, multiplicity * p)


def claim_test(
    seen,
    unseen=None,
    *,
    claim: TradeOffClaim,
    d: int | None = None,
    correction: CorrectionStrategy = GDP_BONFERRONI,
    threat_model: str | None = None,
) -> ClaimTestResult:
    """p-value of the canary scores against a claimed trade-off curve ``f``.

    If the mechanism satisfies ``f``, the test "seen when the score exceeds ``a``" has rates
    ``(p, q)`` with ``q >= f(p)`` at every threshold. With the final-model exact null, ``p`` is
    known and the p-value at ``a`` is the exact binomial ``P[Bin(n_seen, f(p)) <= FN]``. With
    unseen canaries, the p-value at ``a`` is

        2 * sup_x min(P[Bin(n_unseen, x) <= FP], P[Bin(n_seen, f(x)) <= FN]),

    valid because at the true point one of the two binomial tails must be small (a union bound
    at ``alpha / 2`` each; equivalently, ``f`` passes below the Clopper-Pearson rectangle of
    the two rates). For a GDP claim ``mu0`` this rejects at level ``alpha`` exactly when the
    Clopper-Pearson ``mu_lo`` of that threshold exceeds ``mu0``. Over thresholds: Bonferroni
    (``num_thresholds`` times the smallest), Split, or the uncorrected minimum (not valid).

    Parameters
    ----------
    seen, unseen, d
        As for :func:`gdp_lower_bound`.
    claim : GaussianDPClaim, EpsilonDeltaCurveClaim or NoDPClaim
        The claimed curve (see :func:`audit_claims`).
    correction : Bonferroni, Split or NoCorrection
        Threshold strategy.
    threat_model : str, optional
        Label; default ``final_model`` with the exact null, else ``all_iterates``.

    Returns
    -------
    ClaimTestResult
    """
    seen, unseen, d = check_threshold_inputs(seen, unseen, d, correction)
    if not isinstance(claim, (GaussianDPClaim, EpsilonDeltaCurveClaim, NoDPClaim)):
        raise ValueError(f"claim must be a trade-off claim, got {type(claim).__name__}")
    if threat_model is None:
        threat_model = "final_model" if unseen is None else "all_iterates"
    method = (
        "exact binomial test of the false negatives against the claimed curve at the exact-null "
        "FPR" if unseen is None else
        "2 * sup over the claimed curve of min(binomial tails of false positives, false negatives)"
    ) + f"; {_correction_label(correction)}"
    if not claim.is_claim:
        return ClaimTestResult(1.0, claim, threat_model, correction.kind,
                               "no DP claim: nothing to test", {"note": claim.description})

    def evaluate(s_, u_, thresholds, multiplicity):
        return -_claim_p_values(s_, u_, d, thresholds, claim, multiplicity)

    choice = search_thresholds(seen, unseen, correction=correction, evaluate=evaluate,
                               empty_value=-1.0)
    details: dict[str, Any] = {
        "threshold": None if math.isnan(choice.threshold) else choice.threshold,
        "num_thresholds": int(choice.thresholds.size),
        "num_seen": int(choice.seen.size),
        "num_unseen": None if choice.unseen is None else int(choice.unseen.size),
    }
    if choice.note:
        details["note"] = choice.note
    return ClaimTestResult(float(min(1.0, -choice.value)), claim, threat_model, correction.kind,
                           method, details)


# -- one-run f-DP audit (Mahloujifar, Melis & Chaudhuri, ICML 2025) ------------------------------

def _inverse_blow_up(claim: TradeOffClaim, y: np.ndarray) -> np.ndarray:
    """``B^-1(y) = inf {x : 1 - f(x) >= y}``: the smallest FPR at which a test of the claimed
    curve can reach power ``y``. Closed form for GDP (``Phi(Phi^-1(y) - mu)``), bisection
    otherwise (``1 - f`` is nondecreasing)."""
    y = np.clip(np.asarray(y, dtype=np.float64), 0.0, 1.0)
    if isinstance(claim, GaussianDPClaim):
        with np.errstate(divide="ignore"):
            return special.ndtr(special.ndtri(y) - claim.mu)
    lo, hi = np.zeros_like(y), np.ones_like(y)
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        ok = 1.0 - claim.tradeoff(mid) >= y
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid)
    return hi


def _guess_game_feasible(claim, tau: np.ndarray, correct: int, guesses: int, m: int) -> np.ndarray:
    """Whether an f-DP mechanism can make ``>= correct`` of ``guesses`` guesses right with
    probability ``>= tau`` (vectorised over ``tau``): the backward recursion of Mahloujifar et
    al. over the number of correct guesses, for the binary guessing game (each of ``m`` canaries
    included by a fair coin; the adversary guesses on ``guesses`` of them and abstains on the
    rest). Infeasible at ``tau`` means: under the claim, ``P[>= correct right] < tau``."""
    scale = np.asarray(tau, dtype=np.float64) / m
    r = scale * correct  # mass of the "correct" side at the last level
    h = scale * (guesses - correct)  # mass of the "wrong" side
    for i in range(correct - 1, -1, -1):
        h_next = np.maximum(h, _inverse_blow_up(claim, r))
        r = r + (i / (guesses - i)) * (h_next - h)
        h = h_next
    return r + h <= guesses / m


def fdp_one_run_p_value(claim: TradeOffClaim, correct: int, guesses: int, m: int) -> float:
    """Smallest ``tau`` at which the guessing-game outcome (``correct`` of ``guesses`` right, ``m``
    canaries) is infeasible under the claimed curve: a p-value for the claim (1 when feasible
    at every level or when there is no claim). Grid passes on ``log tau`` to ~1e-3 relative."""
    if not claim.is_claim or correct <= 0 or guesses <= 0:
        return 1.0
    if bool(_guess_game_feasible(claim, np.array([1.0]), correct, guesses, m)[0]):
        return 1.0
    lo, hi = -60.0, 0.0  # log tau: feasible below lo? then p < e^-60
    if not bool(_guess_game_feasible(claim, np.array([math.exp(lo)]), correct, guesses, m)[0]):
        return math.exp(lo)
    while hi - lo > 1e-3:  # grid passes, vectorised over tau (feasible below p, not above)
        grid = np.linspace(lo, hi, 257)
        feasible = _guess_game_feasible(claim, np.exp(grid), correct, guesses, m)
        first = int(np.argmin(feasible)) if not feasible.all() else grid.size - 1
        lo, hi = float(grid[max(first - 1, 0)]), float(grid[first])
    return math.exp(hi)


def _guess_counts(scores: np.ndarray, seen: np.ndarray, grid) -> list[tuple[int, int, int]]:
    order = np.argsort(-scores, kind="stable")
    seen_sorted = seen[order]
    in_prefix = np.concatenate([[0], np.cumsum(seen_sorted)])
    out_suffix = np.concatenate([[0], np.cumsum(~seen_sorted[::-1])])
    return [(kp, km, int(in_prefix[kp] + out_suffix[km])) for kp, km in grid]


def fdp_one_run_lower_bound(
    scores,
    seen_mask,
    *,
    delta: float,
    confidence: float = 0.95,
    claim: TradeOffClaim | None = None,
    grid: list[tuple[int, int]] | None = None,
    threat_model: str = "final_model",
    mu_max: float = 50.0,
) -> GaussianDPResult:
    """One-run f-DP audit (Mahloujifar, Melis & Chaudhuri, ICML 2025) for Gaussian-DP curves.

    Canaries are included independently by fair coins (robust to any dependence between
    canaries, as Steinke et al.'s bound). Guess IN for the ``k+`` highest scores and OUT for
    the ``k-`` lowest; for each ``(k+, k-)`` of the grid (Bonferroni over its size), ``mu_lo``
    is the largest ``mu`` whose ``mu``-GDP curve makes the observed number of correct guesses
    infeasible at level ``alpha / len(grid)`` (bisection on ``mu``; feasibility is monotone in
    ``mu``). ``.epsilon`` reads ``mu_lo`` at ``delta``. When ``claim`` is given, ``details``
    also has ``claim_p_value``: the Bonferroni p-value of the outcome under that curve (GDP or
    an (epsilon, delta) curve).

    Returns
    -------
    GaussianDPResult
        ``details``: ``mu``, ``k_plus``, ``k_minus``, ``correct``, ``guesses``, ``m``,
        ``grid_size`` and, with a claim, ``claim_p_value``.
    """
    scores = check_scores(scores, "scores")
    seen = check_mask(seen_mask, "seen_mask", scores.size, "scores")
    delta = check_delta(delta)
    confidence = check_confidence(confidence)
    m = scores.size
    grid = default_guess_grid(m) if grid is None else [(int(a), int(b)) for a, b in grid]
    if not grid:
        raise ValueError("grid must not be empty")
    for kp, km in grid:
        if kp < 0 or km < 0 or kp + km > m:
            raise ValueError(f"grid entry ({kp}, {km}) must satisfy 0 <= k+, k- and k+ + k- <= {m}")
    beta = (1.0 - confidence) / len(grid)
    counts = _guess_counts(scores, seen, grid)
    best = (0.0, grid[0][0], grid[0][1], counts[0][2])
    for kp, km, correct in counts:
        guesses = kp + km
        if correct == 0 or guesses == 0:
            continue

        def rejected(mu: float) -> bool:
            return not bool(_guess_game_feasible(GaussianDPClaim(mu), np.array([beta]),
                                                 correct, guesses, m)[0])

        if not rejected(best[0]):
            continue  # rejection is monotone in mu: this pair cannot beat the best so far
        lo, hi = best[0], mu_max
        if rejected(hi):
            lo = hi
        while hi - lo > 1e-3:
            mid = 0.5 * (lo + hi)
            if rejected(mid):
                lo = mid
            else:
                hi = mid
        if lo > best[0]:
            best = (lo, kp, km, correct)
    mu_lo, kp, km, correct = best
    details: dict[str, Any] = {"mu": mu_lo, "k_plus": kp, "k_minus": km, "correct": correct,
                               "guesses": kp + km, "m": m, "grid_size": len(grid)}
    if claim is not None:
        p = min(fdp_one_run_p_value(claim, c, a + b, m) for a, b, c in counts)
        details["claim_p_value"] = float(min(1.0, len(grid) * p))
    return GaussianDPResult(
        epsilon=gdp_epsilon(mu_lo, delta),
        estimator=Estimator.fdp_one_run,
        threat_model=threat_model,
        delta=delta,
        correction=Correction.bonferroni,
        confidence=confidence,
        method="one-run f-DP audit (Mahloujifar, Melis & Chaudhuri 2025): guess IN for the k+ "
        "highest and OUT for the k- lowest scores; mu_lo = largest mu-GDP curve under which the "
        f"correct guesses are infeasible; Bonferroni over {len(grid)} (k+, k-) pairs; epsilon "
        "is that of the mu_lo-Gaussian mechanism at delta",
        details=details,
    )
