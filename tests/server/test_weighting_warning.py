"""The ServerApp's weighting warning says something only when the weighting matters (issue #38
item d): above the verdict's own threshold, never for equal partitions."""

from __future__ import annotations

import pytest
from flwr.common.logger import FLOWER_LOGGER

from flaudit.auditor.claims.verdict import WEIGHTING_TOLERANCE
from flaudit.server.canary_audit import CanaryAudit


def _warnings(caplog, weights_per_round):
    audit = CanaryAudit(object(), None, clip_norm=1.0)
    FLOWER_LOGGER.addHandler(caplog.handler)
    try:
        for t, weights in enumerate(weights_per_round, start=1):
            audit.canary_weight(t, weights, 1, key="num-examples")
    finally:
        FLOWER_LOGGER.removeHandler(caplog.handler)
    records = {id(r): r for r in caplog.records}.values()
    return audit, [r.getMessage() for r in records if "weighting by" in r.getMessage()]


def test_equal_partitions_raise_no_weighting_warning(caplog):
    audit, said = _warnings(caplog, [[360, 359, 360, 359]] * 3)
    assert 1.0 < max(audit.weight_factors.values()) <= 1 + WEIGHTING_TOLERANCE
    assert said == []


def test_a_weighting_that_matters_is_said_once_with_its_factor(caplog):
    audit, said = _warnings(caplog, [[100, 100, 100], [300, 100, 100], [300, 100, 100]])
    assert max(audit.weight_factors.values()) == pytest.approx(300 * 4 / 800)
    assert len(said) == 1 and "1.5 x the influence" in said[0] and " 1 x " not in said[0]
