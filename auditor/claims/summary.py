"""``summarize``: every estimate, diagnostic and histogram for one audit's canary statistics.

This is what the service and ``flaudit run`` call after every round (max-over-rounds cosines
only) and at the end (both statistics). It never crashes on degenerate but legal input (few
canaries, zero variance, everything seen): what cannot be estimated is reported as a
:class:`~flaudit.auditor.results.Diagnostic` saying why.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..estimators._validation import (
    check_confidence,
    check_delta,
    check_dim,
    check_mask,
    check_scores,
)
from ..estimators.diagnostics import (
    anderson_darling,
    bootstrap_interval,
    unseen_normal_scores_check,
    unseen_vs_null,
)
from ..estimators.fitted import (
    ALL_ITERATES,
    FINAL_MODEL,
    all_iterates_estimate,
    final_model_epsilon,
    final_model_estimates,
)
from ..estimators.gdp import GaussianDPResult, gdp_epsilon, gdp_lower_bound
from ..estimators.lower_bound import Bonferroni, NoCorrection, epsilon_lower_bound
from ..estimators.null import EXACT_NULL_BELOW_DIM, null_pdf
from ..estimators.one_run import one_run_lower_bound
from ..results import Correction, Diagnostic, EpsilonResult, Estimator
from .curve_tests import ClaimTestResult, claim_test, fdp_one_run_lower_bound
from .curves import KNOWN_ROUNDS
from .fdp import fdp_claim_test
from .normal_scores import RoundSums, final_model_rounds, normal_score_test
from .tiers import AlarmTest, ValidityTier

__all__ = ["AuditLook", "AuditSummary", "Histogram", "summarize"]

_THREAT_MODELS = (FINAL_MODEL, ALL_ITERATES)


@dataclass(frozen=True)
class Histogram:
    """Seen/unseen cosine counts on shared bins plus the null density at the bin centres (for a
    plot like Andrew et al. Figure 1). ``null_density`` integrates to ~1 over the bins; scale by
    ``count * bin width`` to overlay on counts."""

    bin_edges: list[float]
    seen_counts: list[int]
    unseen_counts: list[int]
    null_density: list[float]
    null: str  # which null: "exact", "N(0, 1/d)" or "fitted to unseen"

    def to_dict(self) -> dict[str, Any]:
        return {
            "bin_edges": self.bin_edges,
            "seen_counts": self.seen_counts,
            "unseen_counts": self.unseen_counts,
            "null_density": self.null_density,
            "null": self.null,
        }


@dataclass(frozen=True)
class AuditSummary:
    """Estimates, diagnostics and histograms of one audit at one point in time."""

    estimates: list[EpsilonResult] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    claim_tests: list[ClaimTestResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "estimates": [e.to_dict() for e in self.estimates],
            "diagnostics": [d.to_dict() for d in self.diagnostics],
            "histograms": {k: h.to_dict() for k, h in self.histograms.items()},
            "claim_tests": [t.to_dict() for t in self.claim_tests],
        }


def _histogram(
    seen: np.ndarray, unseen: np.ndarray, density, null: str, num_bins: int
) -> Histogram:
    pooled = np.concatenate([seen, unseen])
    lo, hi = float(pooled.min()), float(pooled.max())
    if hi <= lo:
        pad = max(abs(lo) * 1e-3, 1e-12)
        lo, hi = lo - pad, hi + pad
    edges = np.linspace(lo, hi, num_bins + 1)
    centres = 0.5 * (edges[:-1] + edges[1:])
    seen_counts, _ = np.histogram(seen, edges)
    unseen_counts, _ = np.histogram(unseen, edges)
    dens = np.nan_to_num(np.asarray(density(centres), dtype=np.float64), nan=0.0, posinf=0.0)
    return Histogram(
        bin_edges=edges.tolist(),
        seen_counts=seen_counts.astype(int).tolist(),
        unseen_counts=unseen_counts.astype(int).tolist(),
        null_density=dens.tolist(),
        null=null,
    )


def _gauss_pdf(mu: float, sd: float):
    def pdf(x):
        if sd <= 0:
            return np.zeros_like(x)
        return np.exp(-0.5 * ((x - mu) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))

    return pdf


def _skip(name: str, hint: str, **details) -> Diagnostic:
    return Diagnostic(name=name, value=0.0, ok=False, hint=hint, details=details)


@dataclass(frozen=True, eq=False)
class AuditLook:
    """What :func:`summarize` needs of one audit at one look: the canary statistics seen so far,
    the claims to test them against and which estimates to make.

    Built by the caller (the service after every round and at the end, ``flaudit run``, the
    evidence checker, the benchmarks) and checked by :func:`summarize`, whose ``ValueError``
    names the bad field.

    Attributes
    ----------
    seen : array_like of bool
        The seen/unseen split (True = inserted), length k.
    dim : int
        Model dimension d.
    delta : float
        Target delta for every epsilon.
    max_cosines : array_like, optional
        Per-canary max over rounds of ``cos(c_j, Delta_t)`` (length k). ``-inf`` everywhere
        means "no round yet" and is skipped.
    final_cosines : array_like, optional
        Per-canary ``cos(c_j, theta_T - theta_0)`` (length k).
    num_rounds : int, optional
        Rounds the max-over-rounds cosines cover. With it, the all-iterates estimate fits its
        Gaussians after the max-of-T null map (:func:`flaudit.auditor.estimators.fitted.max_null_probit`);
        without it, to the raw maxima (the paper's recipe, which overshoots).
    scale_dof : float, optional
        Degrees of freedom of the noise scale the final-model statistics share
        (:func:`flaudit.auditor.statistics.scale_dof`: ``d - k`` for orthogonal canaries);
        default ``dim`` (plain cosines).
    known_rounds_scores : array_like, optional
        (k,) known-rounds scores (:class:`flaudit.auditor.claims.known_rounds.KnownRoundsStatistic`); NaN for
        canaries not yet counted in any round (left out). Adds the known-rounds Gaussian-DP
        lower bound (threat model ``known_rounds``) and, with ``claims``, its claim tests.
    known_rounds_participations : array_like of int, optional
        (k,) rounds behind each known-rounds score so far (``KnownRoundsStatistic.num_participations``);
        omitted: every scored canary is taken to carry the whole claim (conservative).
    known_rounds_rounds : RoundSums, optional
        The seen participants' studentized values summed per round
        (:attr:`flaudit.auditor.claims.known_rounds.KnownRoundsStatistic.rounds`): the known-rounds
        normal-score test is exact on them (:mod:`flaudit.auditor.claims.normal_scores`).
        Omitted: the test takes the known-rounds scores as independent with a known scale
        (:meth:`~flaudit.auditor.claims.normal_scores.RoundSums.from_scores`), which holds only
        when the scale is estimated from far more coordinates than canaries.
    claims : list, optional
        The audit's trade-off claims (:func:`flaudit.auditor.claims.curves.audit_claims`). Each claim
        is tested (:func:`flaudit.auditor.claims.curve_tests.claim_test`, Bonferroni thresholds) on the
        statistics its adversary may use: the ``known_rounds`` claim on the known-rounds scores
        and on the final-model cosines (exact null); the ``poisson_subsampled`` claim on the
        final-model cosines and the max-over-rounds cosines. Results in ``claim_tests`` (feed
        them to :func:`flaudit.auditor.claims.alarm.decide_alarm`).
    canary_repeats : int
        ``r``: the participations the known-rounds claim ``sqrt(r)/z`` is for.
    threat_models : iterable of {"final_model", "all_iterates"}
        Which threat models to report (each needs its statistic).
    confidence : float
        Confidence of the lower bounds. The valid ones (the normal-score and one-run bounds,
        from which the verdict's headline takes the largest) split it: each is computed at
        ``1 - (1 - confidence) / m`` for the ``m`` planned (:func:`_split_confidence`), so
        their largest is valid at ``confidence`` as a whole.
    bootstrap : int
        Bootstrap resamples for the interval on epsilon_est (0: skip; ~200 costs ~0.1 s).
    one_run : bool
        Also compute the Steinke et al. one-run bound (~0.1 s per threat model at k = 1000).
    num_bins : int
        Histogram bins.
    """

    seen: Any
    dim: int
    delta: float
    max_cosines: Any = None
    final_cosines: Any = None
    num_rounds: int | None = None
    scale_dof: float | None = None
    known_rounds_scores: Any = None
    known_rounds_participations: Any = None
    known_rounds_rounds: RoundSums | None = None
    claims: Sequence | None = None
    canary_repeats: int = 1
    threat_models: Iterable = _THREAT_MODELS
    confidence: float = 0.95
    bootstrap: int = 0
    one_run: bool = False
    num_bins: int = 30


@dataclass(frozen=True)
class _Checked:
    """An :class:`AuditLook`'s values after :func:`_checked`: arrays, the threat models as
    strings, a ``max_cosines`` of ``None`` before the first round."""

    k: int
    seen: np.ndarray
    dim: int
    delta: float
    confidence: float
    each_confidence: float  # each valid bound's share of the level (:func:`_split_confidence`)
    threat_models: tuple[str, ...]
    final: np.ndarray | None
    max_cosines: np.ndarray | None
    known: np.ndarray | None
    claims: list
    known_claim: Any  # the known-rounds claim, or None

    @property
    def num_seen(self) -> int:
        return int(self.seen.sum())

    @property
    def num_unseen(self) -> int:
        return int((~self.seen).sum())


def summarize(look: AuditLook) -> AuditSummary:
    """All estimates for one audit's canary statistics at one look.

    Parameters
    ----------
    look : AuditLook
        The statistics, claims and options (see its attributes).

    Every available statistic gets the estimates of its threat model; each also gets the valid
    Gaussian-DP lower bound (:func:`flaudit.auditor.estimators.gdp.gdp_lower_bound`, Bonferroni)
    and, with ``one_run``, the one-run f-DP bound (with the known-rounds claim's p-value when
    ``claims`` are given).

    Returns
    -------
    AuditSummary

    Raises
    ------
    ValueError
        On an illegal look, naming the field.
    """
    checked = _checked(look)
    summary = AuditSummary()
    if FINAL_MODEL in checked.threat_models and checked.final is not None:
        _add_final_model(summary, checked, look)
    if ALL_ITERATES in checked.threat_models and checked.max_cosines is not None:
        _add_all_iterates(summary, checked, look)
    if checked.known is not None:
        _add_known_rounds(summary, checked, look)
    return summary


def _checked(look: AuditLook) -> _Checked:
    seen_arr = np.asarray(look.seen)
    if seen_arr.ndim != 1 or seen_arr.size == 0:
        raise ValueError("seen must be a non-empty one-dimensional boolean mask")
    k = seen_arr.size
    seen_mask = check_mask(seen_arr, "seen", k, "seen")
    d = check_dim(look.dim, "dim")
    delta = check_delta(look.delta)
    confidence = check_confidence(look.confidence)
    threat_models = look.threat_models
    if isinstance(threat_models, str):
        threat_models = (threat_models,)
    tms = []
    for tm in threat_models:
        tm = getattr(tm, "value", tm)
        if tm not in _THREAT_MODELS:
            raise ValueError(f"threat_models: unknown threat model {tm!r}")
        tms.append(tm)
    if not isinstance(look.bootstrap, int) or look.bootstrap < 0:
        raise ValueError(f"bootstrap must be an integer >= 0, got {look.bootstrap!r}")
    if not isinstance(look.num_bins, int) or look.num_bins < 1:
        raise ValueError(f"num_bins must be an integer >= 1, got {look.num_bins!r}")

    final = None
    if look.final_cosines is not None:
        final = check_scores(look.final_cosines, "final_cosines")
        if final.size != k:
            raise ValueError(f"final_cosines has length {final.size} but seen has length {k}")
    maxc = None
    if look.max_cosines is not None:
        raw = np.asarray(look.max_cosines, dtype=np.float64)
        if raw.ndim == 1 and raw.size == k and np.all(raw == -np.inf):
            maxc = None  # no round ingested yet
        else:
            maxc = check_scores(raw, "max_cosines")
            if maxc.size != k:
                raise ValueError(f"max_cosines has length {maxc.size} but seen has length {k}")

    known = None
    if look.known_rounds_scores is not None:
        known = np.asarray(look.known_rounds_scores, dtype=np.float64)
        if known.shape != (k,):
            raise ValueError(f"known_rounds_scores must have shape ({k},), got {known.shape}")
        if np.any(np.isinf(known)):
            raise ValueError("known_rounds_scores contains Inf")
    claims = list(look.claims) if look.claims is not None else []
    known_claim = next((c for c in claims if c.threat_model == KNOWN_ROUNDS), None)
    each = _split_confidence(
        confidence,
        final=FINAL_MODEL in tms and final is not None,
        max_cos=ALL_ITERATES in tms and maxc is not None,
        known=known is not None,
        one_run=look.one_run and k >= 2,
    )
    return _Checked(
        k=k,
        seen=seen_mask,
        dim=d,
        delta=delta,
        confidence=confidence,
        each_confidence=each,
        threat_models=tuple(tms),
        final=final,
        max_cosines=maxc,
        known=known,
        claims=claims,
        known_claim=known_claim,
    )


def _add_final_model(summary: AuditSummary, c: _Checked, look: AuditLook) -> None:
    """The final-model estimates, bounds, claim tests, diagnostics and histogram."""
    s, u = c.final[c.seen], c.final[~c.seen]
    d, delta = c.dim, c.delta
    n_seen = c.num_seen
    if n_seen >= 2:
        _add_final_model_bounds(summary, c, look, s)
    else:
        summary.diagnostics.append(
            _skip(
                "final_model_skipped",
                f"final model: {n_seen} seen canaries, need at least 2",
                num_seen=n_seen,
            )
        )
    if c.num_unseen:
        summary.diagnostics.append(unseen_vs_null(u, d))
    if look.one_run and c.k >= 2:
        summary.estimates.append(
            one_run_lower_bound(
                c.final, c.seen, delta=delta, confidence=c.each_confidence, threat_model=FINAL_MODEL
            )
        )
        summary.estimates.append(
            fdp_one_run_lower_bound(
                c.final,
                c.seen,
                delta=delta,
                confidence=c.each_confidence,
                claim=c.known_claim,
                threat_model=FINAL_MODEL,
            )
        )
    exact = d < EXACT_NULL_BELOW_DIM
    summary.histograms[FINAL_MODEL] = _histogram(
        s,
        u,
        (lambda x: null_pdf(x, d)) if exact else _gauss_pdf(0.0, 1 / math.sqrt(d)),
        "exact" if exact else "N(0, 1/d)",
        look.num_bins,
    )


def _add_final_model_bounds(
    summary: AuditSummary, c: _Checked, look: AuditLook, s: np.ndarray
) -> None:
    """The final-model estimates of at least two seen canaries' cosines ``s``."""
    d, delta, confidence = c.dim, c.delta, c.confidence
    estimates, claim_tests = summary.estimates, summary.claim_tests
    final_estimates = final_model_estimates(s, d, delta)
    estimates.extend(final_estimates)
    for corr in (NoCorrection(), Bonferroni()):
        estimates.append(
            epsilon_lower_bound(
                s,
                d=d,
                delta=delta,
                confidence=confidence,
                correction=corr,
                threat_model=FINAL_MODEL,
            )
        )
    estimates.append(
        gdp_lower_bound(s, d=d, delta=delta, confidence=confidence, threat_model=FINAL_MODEL)
    )
    claim_tests.extend(
        claim_test(s, claim=claim, d=d, threat_model=FINAL_MODEL) for claim in c.claims
    )
    known_claim = c.known_claim
    claimed = known_claim is not None and known_claim.is_claim
    test = normal_score_test(
        final_model_rounds(s, d, dof=d if look.scale_dof is None else look.scale_dof),
        claim_mu=known_claim.mu if claimed else 0.0,
    )
    if claimed:
        claim_tests.append(
            _normal_score_result(
                test,
                known_claim,
                FINAL_MODEL,
                AlarmTest.final_model_normal_scores,
                "the seen canaries' final-model statistics studentized by the model's noise "
                "scale and summed: noncentral Student-t under Gaussian noise, calibrated at "
                "the claimed mu each (exact)",
            )
        )
    estimates.append(_normal_score_bound(test, FINAL_MODEL, delta, c.each_confidence))
    summary.diagnostics.append(anderson_darling(s, name="seen_final"))
    if look.bootstrap:
        summary.diagnostics.append(
            bootstrap_interval(
                lambda ss, _u: final_model_epsilon(ss, d, delta).epsilon,
                s,
                None,
                name="final_model_epsilon",
                point=final_estimates[0].epsilon,
                num_resamples=look.bootstrap,
            )
        )


def _add_all_iterates(summary: AuditSummary, c: _Checked, look: AuditLook) -> None:
    """The all-iterates estimates, bounds, claim tests, diagnostics and histogram."""
    s, u = c.max_cosines[c.seen], c.max_cosines[~c.seen]
    d, delta, confidence, num_rounds = c.dim, c.delta, c.confidence, look.num_rounds
    estimates, diagnostics = summary.estimates, summary.diagnostics
    n_seen, n_unseen = c.num_seen, c.num_unseen
    if n_seen >= 2 and n_unseen >= 2:
        all_iter = all_iterates_estimate(s, u, delta, num_rounds=num_rounds, d=d)
        estimates.append(all_iter)
        for corr in (NoCorrection(), Bonferroni()):
            estimates.append(
                epsilon_lower_bound(
                    s,
                    u,
                    delta=delta,
                    confidence=confidence,
                    correction=corr,
                    threat_model=ALL_ITERATES,
                )
            )
        estimates.append(
            gdp_lower_bound(s, u, delta=delta, confidence=confidence, threat_model=ALL_ITERATES)
        )
        summary.claim_tests.extend(
            claim_test(s, u, claim=claim, threat_model=ALL_ITERATES)
            for claim in c.claims
            if claim.threat_model != KNOWN_ROUNDS
        )
        diagnostics.append(anderson_darling(s, name="seen_max"))
        diagnostics.append(anderson_darling(u, name="unseen_max"))
        if look.bootstrap:
            diagnostics.append(
                bootstrap_interval(
                    lambda ss, uu: (
                        all_iterates_estimate(ss, uu, delta, num_rounds=num_rounds, d=d).epsilon
                    ),
                    s,
                    u,
                    name="all_iterates_epsilon",
                    point=all_iter.epsilon,
                    num_resamples=look.bootstrap,
                )
            )
    else:
        diagnostics.append(
            _skip(
                "all_iterates_skipped",
                f"all iterates: {n_seen} seen and {n_unseen} unseen canaries, need at least 2 of each",
                num_seen=n_seen,
                num_unseen=n_unseen,
            )
        )
    if look.one_run and c.k >= 2:
        estimates.append(
            one_run_lower_bound(
                c.max_cosines,
                c.seen,
                delta=delta,
                confidence=c.each_confidence,
                threat_model=ALL_ITERATES,
            )
        )
    if n_unseen:
        mu, sd = float(np.mean(u)), float(np.std(u))
        summary.histograms[ALL_ITERATES] = _histogram(
            s, u, _gauss_pdf(mu, sd), "fitted to unseen", look.num_bins
        )


def _add_known_rounds(summary: AuditSummary, c: _Checked, look: AuditLook) -> None:
    """The known-rounds bound, claim tests and diagnostics (canaries not yet scored left out)."""
    known, seen_mask, k = c.known, c.seen, c.k
    known_claim = c.known_claim
    claimed = known_claim is not None and known_claim.is_claim
    scored = np.isfinite(known)
    s, u = known[seen_mask & scored], known[~seen_mask & scored]
    if s.size >= 2 and u.size >= 2:
        summary.estimates.append(
            gdp_lower_bound(s, u, delta=c.delta, confidence=c.confidence, threat_model=KNOWN_ROUNDS)
        )
        summary.claim_tests.extend(
            claim_test(s, u, claim=claim, threat_model=KNOWN_ROUNDS)
            for claim in c.claims
            if claim.threat_model == KNOWN_ROUNDS
        )
    else:
        summary.diagnostics.append(
            _skip(
                "known_rounds_skipped",
                f"known rounds: {s.size} seen and {u.size} unseen canaries scored so far, need at "
                "least 2 of each",
                num_seen=int(s.size),
                num_unseen=int(u.size),
            )
        )
    counts = None
    if look.known_rounds_participations is not None:
        counts = np.asarray(look.known_rounds_participations, dtype=np.int64)
        if counts.shape != (k,):
            raise ValueError(
                f"known_rounds_participations must have shape ({k},), got {counts.shape}"
            )
    if s.size >= 1:
        rounds = look.known_rounds_rounds
        if rounds is None:
            rounds = RoundSums.from_scores(
                known[seen_mask & scored], None if counts is None else counts[seen_mask & scored]
            )
        test = normal_score_test(
            rounds,
            claim_mu=known_claim.mu if claimed else 0.0,
            claim_participations=int(look.canary_repeats),
        )
        summary.estimates.append(
            _normal_score_bound(test, KNOWN_ROUNDS, c.delta, c.each_confidence)
        )
        if claimed:
            summary.claim_tests.append(
                _normal_score_result(
                    test,
                    known_claim,
                    KNOWN_ROUNDS,
                    AlarmTest.known_rounds_normal_scores,
                    "the seen canaries' statistics in their known rounds, studentized by each "
                    "round's noise scale and summed per round: noncentral Student-t under "
                    "Gaussian noise, calibrated at the claimed 1/z per participation (exact)",
                )
            )
    if u.size:
        summary.diagnostics.append(unseen_normal_scores_check(u))
    if claimed and int(scored.sum()) >= 2:
        summary.claim_tests.append(
            fdp_claim_test(known[scored], seen_mask[scored], claim=known_claim)
        )


def _split_confidence(
    confidence: float, *, final: bool, max_cos: bool, known: bool, one_run: bool
) -> float:
    """The confidence of each bound the headline may choose from (the valid ones:
    :data:`flaudit.auditor.claims.verdict.VALID_BOUND_ESTIMATORS`), so that the largest of
    them is valid at ``confidence`` as a whole (Bonferroni: it exceeds the truth only if one
    of the ``m`` does, each with probability ``(1 - confidence) / m``). ``m`` is counted from
    the inputs, before any score is seen: the final-model normal-score bound, and with
    ``one_run`` its one-run and f-DP one-run bounds; the all-iterates one-run bound; the
    known-rounds normal-score bound. A bound planned but skipped (too few seen canaries) only
    makes the split conservative."""
    m = (final * (1 + 2 * one_run)) + (max_cos * one_run) + known
    return 1.0 - (1.0 - confidence) / max(1, int(m))


def _normal_score_result(
    test, claim, threat_model: str, name: AlarmTest, method: str
) -> ClaimTestResult:
    details = dict(test.to_details(), test=name.value, tier=name.tier.value)
    return ClaimTestResult(
        test.p_value, claim, threat_model, Correction.not_applicable, method, details
    )


def _normal_score_bound(test, threat_model: str, delta: float, confidence: float) -> EpsilonResult:
    """``mu_lo`` from inverting the normal-score test at ``1 - confidence``."""
    mu_lo = test.mu_lo(1.0 - confidence)
    return GaussianDPResult(
        epsilon=gdp_epsilon(mu_lo, delta),
        estimator=Estimator.normal_scores,
        threat_model=threat_model,
        delta=delta,
        correction=Correction.not_applicable,
        confidence=confidence,
        method="Gaussian-DP lower bound from inverting the normal-score test (one test, no "
        "threshold search); exact for DP-FedAvg's Gaussian noise with orthogonal canaries; "
        "epsilon is that of the mu_lo-Gaussian mechanism",
        details={
            "mu": mu_lo,
            "num_scores": test.num_scores,
            "tier": ValidityTier.independent_canaries.value,
            "dof": test.rounds.dof,
            "num_releases": int(test.rounds.counts.size),
        },
    )
