"""The lines the ServerApp log shows about an audit before round 1 (issue #28): what the audit
will catch, with the canaries chosen for this federation, or why the service refused it.

Text only: the wrapper (:class:`flaudit.server.wrapper.CanaryAuditStrategy`) logs them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["design_line", "refusal_line"]


def design_line(ack: Mapping[str, Any] | None) -> str | None:
    """``"flaudit: audit design: k canaries, r repeat(s) per seen canary: <what it catches>"``
    from the service's answer to the claim (``PUT /audits/{id}/claim``), plus what would make
    it testable when it is not; None without a design (an older service)."""
    if not ack or not ack.get("design"):
        return None
    spec, design = ack.get("spec") or {}, ack["design"]
    line = (
        f"flaudit: audit design: {spec.get('num_canaries')} canaries, "
        f"{spec.get('canary_repeats')} repeat(s) per seen canary: {design.get('summary')}"
    )
    if not design.get("testable", True) and design.get("advice"):
        line += f" Not testable: {design['advice']}"
    return line


def refusal_line(audit_id: str, error: BaseException) -> str:
    """One line for a claim the service refused: its reason (the ``detail`` of the HTTP
    answer when there is one) and where the audit shows it."""
    text = str(error)
    head, _, body = text.partition(": HTTP ")
    detail = None
    if body:
        _, _, payload = body.partition(" ")
        try:
            detail = json.loads(payload).get("detail")
        except (ValueError, AttributeError):
            detail = None
    if isinstance(detail, list):  # pydantic errors: field and message
        detail = "; ".join(
            f"{'.'.join(map(str, d.get('loc', [])[1:]))}: {d.get('msg')}"
            for d in detail
            if isinstance(d, dict)
        )
    reason = str(detail) if detail else text
    return (
        f"flaudit: the audit service refused this run's claim: {reason} (the audit's page "
        f"and GET /audits/{audit_id} say the same)"
    )
