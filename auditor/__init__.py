"""flaudit's auditor: canaries, cosine statistics and epsilon estimators (pure math), plus the
audit service in :mod:`flaudit.auditor.service`."""

from flaudit.auditor.canaries import (
    Canaries, CanaryFamily, canary_sum, canary_vector, canary_vectors, new_master_seed,
    resolve_canary_family, seen_mask,
)
from flaudit.auditor.estimators import (
    AuditSummary,
    Bonferroni,
    NoCorrection,
    Split,
    GaussianDPClaim,
    analytic_epsilon,
    audit_claims,
    claim_test,
    epsilon_lower_bound,
    gdp_lower_bound,
    one_run_lower_bound,
    summarize,
    two_gaussian_epsilon,
)
from flaudit.auditor.gaussian import GaussianAuditResult, gaussian_mechanism_audit
from flaudit.auditor.known_rounds import KnownRoundsState, KnownRoundsStatistic
from flaudit.auditor.results import Correction, Diagnostic, EpsilonResult, Estimator, VarianceTreatment
from flaudit.auditor.statistics import CosineTracker

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
    "AuditSummary",
    "NoCorrection",
    "Bonferroni",
    "Split",
]
