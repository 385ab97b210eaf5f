"""Every epsilon estimator, lower bound, diagnostic and the analytic accounting, as pure
functions over arrays of canary cosines. See ``docs/estimators.md``."""

from flaudit.auditor.estimators.alarm import (
    ALARM_ALPHA,
    AlarmDecision,
    alarm_guarantee,
    decide_alarm,
    look_level,
)
from flaudit.auditor.estimators.analytic import (
    analytic_epsilon,
    audit_analytic_epsilon,
    gaussian_epsilon_for_sigma,
    gaussian_sigma_for_epsilon,
)
from flaudit.auditor.estimators.diagnostics import anderson_darling, bootstrap_interval, unseen_vs_null
from flaudit.auditor.estimators.fitted import (
    all_iterates_estimate,
    exact_null_epsilon,
    final_model_epsilon,
    final_model_estimates,
)
from flaudit.auditor.estimators.gdp import (
    ClaimTestResult,
    EpsilonDeltaCurveClaim,
    GaussianDPClaim,
    GaussianDPResult,
    NoDPClaim,
    audit_claims,
    claim_test,
    fdp_one_run_lower_bound,
    fdp_one_run_p_value,
    gdp_epsilon,
    gdp_lower_bound,
    poisson_subsampled_claim,
)
from flaudit.auditor.estimators.interference import effective_noise_multiplier, interference_warning
from flaudit.auditor.estimators.lower_bound import (
    Bonferroni,
    NoCorrection,
    Split,
    epsilon_lower_bound,
    clopper_pearson_upper,
    jeffreys_upper,
)
from flaudit.auditor.estimators.null import null_cdf, null_logsf, null_pdf, null_sf
from flaudit.auditor.estimators.one_run import one_run_lower_bound, one_run_p_value
from flaudit.auditor.estimators.sequential import (
    SequentialDPTest,
    mmd_threshold,
    sequential_epsilon_lower_bound,
)
from flaudit.auditor.estimators.summary import AuditSummary, Histogram, summarize
from flaudit.auditor.estimators.two_gaussian import (
    gaussian_mechanism_delta,
    hockey_stick_divergence,
    two_gaussian_epsilon,
)

__all__ = [
    "ALARM_ALPHA",
    "AlarmDecision",
    "alarm_guarantee",
    "decide_alarm",
    "look_level",
    "AuditSummary",
    "ClaimTestResult",
    "EpsilonDeltaCurveClaim",
    "GaussianDPClaim",
    "GaussianDPResult",
    "NoDPClaim",
    "audit_claims",
    "claim_test",
    "clopper_pearson_upper",
    "fdp_one_run_lower_bound",
    "fdp_one_run_p_value",
    "gdp_epsilon",
    "gdp_lower_bound",
    "poisson_subsampled_claim",
    "Bonferroni",
    "Histogram",
    "NoCorrection",
    "SequentialDPTest",
    "Split",
    "all_iterates_estimate",
    "analytic_epsilon",
    "audit_analytic_epsilon",
    "anderson_darling",
    "bootstrap_interval",
    "epsilon_lower_bound",
    "effective_noise_multiplier",
    "exact_null_epsilon",
    "final_model_epsilon",
    "final_model_estimates",
    "gaussian_epsilon_for_sigma",
    "gaussian_mechanism_delta",
    "gaussian_sigma_for_epsilon",
    "hockey_stick_divergence",
    "interference_warning",
    "jeffreys_upper",
    "mmd_threshold",
    "null_cdf",
    "null_logsf",
    "null_pdf",
    "null_sf",
    "one_run_lower_bound",
    "one_run_p_value",
    "sequential_epsilon_lower_bound",
    "summarize",
    "two_gaussian_epsilon",
]
