"""The DP alarm moved to :mod:`flaudit.auditor.claims.alarm` (issue #19); re-exported here."""

from flaudit.auditor.claims.alarm import (  # noqa: F401
    ALARM_ALPHA,
    AlarmDecision,
    alarm_guarantee,
    decide_alarm,
    look_level,
)

__all__ = ["ALARM_ALPHA", "AlarmDecision", "decide_alarm", "look_level", "alarm_guarantee"]
