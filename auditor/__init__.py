"""flaudit's math: canaries, cosine statistics, epsilon estimators and the claim tests. Pure:
arrays and specs in, numbers out; no I/O, no Flower, no web (the service is :mod:`flaudit.service`).
Layers inside (checked by ``lint-imports``): ``claims`` > ``statistics`` > ``estimators`` > the core
modules (``spec``, ``schedules``, ``canaries``, ``transform``, ``results``, ...)."""

from .canaries import (
    Canaries,
    CanaryFamily,
    canary_sum,
    canary_vector,
    canary_vectors,
    new_master_seed,
    resolve_canary_family,
    seen_mask,
)
from .claims import (
    AuditLook,
    AuditSummary,
    GaussianDPClaim,
    audit_claims,
    claim_test,
    summarize,
)
from .claims.gaussian import GaussianAuditResult, gaussian_mechanism_audit
from .claims.known_rounds import KnownRoundsState, KnownRoundsStatistic
from .estimators import (
    Bonferroni,
    NoCorrection,
    Split,
    analytic_epsilon,
    epsilon_lower_bound,
    gdp_lower_bound,
    one_run_lower_bound,
    two_gaussian_epsilon,
)
from .results import Correction, Diagnostic, EpsilonResult, Estimator, VarianceTreatment
from .statistics import CosineTracker

__all__ = [
    "CanaryFamily",
    "Canaries",
    "resolve_canary_family",
    "canary_sum",
    "canary_vector",
    "canary_vectors",
    "new_master_seed",
    "seen_mask",
    "CosineTracker",
    "KnownRoundsStatistic",
    "KnownRoundsState",
    "Correction",
    "Diagnostic",
    "EpsilonResult",
    "Estimator",
    "VarianceTreatment",
    # estimators (stable public API: names, positional order and ``.epsilon``)
    "two_gaussian_epsilon",
    "gaussian_mechanism_audit",
    "GaussianAuditResult",
    "epsilon_lower_bound",
    "gdp_lower_bound",
    "claim_test",
    "audit_claims",
    "GaussianDPClaim",
    "one_run_lower_bound",
    "analytic_epsilon",
    "summarize",
    "AuditLook",
    "AuditSummary",
    "NoCorrection",
    "Bonferroni",
    "Split",
]
