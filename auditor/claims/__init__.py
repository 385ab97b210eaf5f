"""Claims, claim tests, the alarm and the audit design: one home (issue #19).

* claims as trade-off curves: :func:`audit_claims`, :class:`GaussianDPClaim`, :class:`NoDPClaim`
  (:mod:`.curves`) and the generic tests of a curve (:mod:`.curve_tests`);
* the tests, one file each: normal-score tests, exact on the rounds' studentized sums
  (:mod:`.normal_scores`, tier ``independent_canaries``) and the one-run f-DP guessing game (:mod:`.fdp`, tier
  ``assumption_free``);
* the alarm over every look (:mod:`.alarm`) and the audit design (:mod:`.design`);
* the verdict (:mod:`.verdict`) and the alarm's words for a spec (:mod:`.alerts`: alerts,
  guarantee, the first alarm's record, the spec's verdict);
* every estimate of an audit in one summary (:mod:`.summary`), the known-rounds statistic
  (:mod:`.known_rounds`) and the Gaussian-mechanism audit (:mod:`.gaussian`).

Pure: arrays and specs in, numbers out; no service, no Flower.
"""

from ..estimators.gdp import gdp_delta, gdp_epsilon
from .alarm import ALARM_ALPHA, AlarmDecision, alarm_guarantee, decide_alarm, look_level
from .curve_tests import ClaimTestResult, claim_test, fdp_one_run_lower_bound, fdp_one_run_p_value
from .curves import (
    EpsilonDeltaCurveClaim,
    GaussianDPClaim,
    NoDPClaim,
    TradeOffClaim,
    audit_claims,
    poisson_subsampled_claim,
)
from .design import AuditDesign, audit_design
from .fdp import fdp_claim_test, fdp_mu_lo
from .normal_scores import (
    NormalScoreTest,
    RoundSums,
    final_model_normal_scores,
    final_model_rounds,
    normal_score_test,
)
from .summary import AuditLook, AuditSummary, summarize
from .tiers import AlarmTest, ValidityTier
from .verdict import Verdict, VerdictStatus, audit_verdict, largest_valid_bound

__all__ = [
    "ALARM_ALPHA",
    "AlarmDecision",
    "AuditLook",
    "AuditSummary",
    "TradeOffClaim",
    "claim_test",
    "fdp_one_run_lower_bound",
    "fdp_one_run_p_value",
    "poisson_subsampled_claim",
    "summarize",
    "AlarmTest",
    "AuditDesign",
    "ClaimTestResult",
    "EpsilonDeltaCurveClaim",
    "GaussianDPClaim",
    "NoDPClaim",
    "NormalScoreTest",
    "ValidityTier",
    "alarm_guarantee",
    "audit_claims",
    "audit_design",
    "decide_alarm",
    "fdp_claim_test",
    "fdp_mu_lo",
    "final_model_normal_scores",
    "final_model_rounds",
    "gdp_delta",
    "gdp_epsilon",
    "look_level",
    "normal_score_test",
    "RoundSums",
    "Verdict",
    "VerdictStatus",
    "audit_verdict",
    "largest_valid_bound",
]
