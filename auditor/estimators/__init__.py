"""Every epsilon estimator, lower bound, diagnostic and the analytic accounting, as pure
functions over arrays of canary cosines. See ``docs/estimators.md``."""

from .analytic import (
    analytic_epsilon,
    audit_analytic_epsilon,
    gaussian_epsilon_for_sigma,
    gaussian_sigma_for_epsilon,
)
from .diagnostics import anderson_darling, bootstrap_interval, unseen_vs_null
from .fitted import (
    all_iterates_estimate,
    exact_null_epsilon,
    final_model_epsilon,
    final_model_estimates,
)
from .gdp import GaussianDPResult, gdp_delta, gdp_epsilon, gdp_lower_bound
from .interference import effective_noise_multiplier, interference_warning
from .lower_bound import (
    Bonferroni,
    NoCorrection,
    Split,
    clopper_pearson_upper,
    epsilon_lower_bound,
    jeffreys_upper,
)
from .null import null_cdf, null_logsf, null_pdf, null_sf
from .one_run import one_run_lower_bound, one_run_p_value
from .record_level import (
    SeededRecordCanaries,
    record_canary_cosines,
    record_level_epsilon,
    record_level_per_round_epsilon,
)
from .sequential import SequentialDPTest, mmd_threshold, sequential_epsilon_lower_bound
from .two_gaussian import gaussian_mechanism_delta, hockey_stick_divergence, two_gaussian_epsilon

__all__ = [
    "SeededRecordCanaries",
    "record_canary_cosines",
    "record_level_epsilon",
    "record_level_per_round_epsilon",
    "GaussianDPResult",
    "clopper_pearson_upper",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_lower_bound",
    "Bonferroni",
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
    "two_gaussian_epsilon",
    "unseen_vs_null",
]
