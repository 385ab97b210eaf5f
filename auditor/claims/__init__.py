"""Claims, claim tests, the DP alarm, the audit design and the verdict.

STAND-IN (wiring branch): the "power" stream owns this package and its ``__init__``; until its
branch is merged, the names of the contract are re-exported from their old homes and
:mod:`._pending` holds a placeholder audit design. At merge, take power's ``__init__`` and add
the verdict/alerts exports below.
"""

from __future__ import annotations

from ..estimators.alarm import AlarmDecision, alarm_guarantee, decide_alarm
from ..estimators.gdp import GaussianDPClaim, NoDPClaim, audit_claims
from ._pending import AuditDesign, audit_design

__all__ = [
    "AlarmDecision",
    "AuditDesign",
    "GaussianDPClaim",
    "NoDPClaim",
    "alarm_guarantee",
    "audit_claims",
    "audit_design",
    "decide_alarm",
]
