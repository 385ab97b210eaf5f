"""The words a reviewer reads for the API's identifiers, from one file shared with the dashboard:
``static/vocabulary.json`` (the dashboard's ``format.js`` imports it as a JSON module; the
printable report reads it here). The API keeps its identifiers; what is shown is put into words:
estimators, adversaries (threat models), variants, spec and design fields, enum values, yes/no
for booleans, nested settings as readable lines, and free text from the service.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

__all__ = [
    "VOCABULARY",
    "diagnostic_name",
    "diagnostic_purpose",
    "diagnostic_state",
    "diagnostic_value",
    "estimate_label",
    "estimator_name",
    "field_label",
    "human_text",
    "threat_label",
    "value_lines",
    "value_text",
    "verdict_title",
]

#: The shared file (also served to the dashboard at ``/ui/vocabulary.json``).
VOCABULARY: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parent / "static" / "vocabulary.json").read_text(encoding="utf-8")
)

# the dashboard writes a group as $1; Python's re as \1
_TEXT = [
    (re.compile(pattern), re.sub(r"\$(\d)", r"\\\1", repl)) for pattern, repl in VOCABULARY["text"]
]


def human_text(text: Any) -> str:
    """Free text from the service (the bug notice, alerts) with its identifiers in words."""
    out = "" if text is None else str(text)
    for pattern, repl in _TEXT:
        out = pattern.sub(repl, out)
    return out


def verdict_title(status: str) -> str:
    entry = VOCABULARY["verdicts"].get(status)
    return entry["title"] if entry else _words(status)


def estimator_name(estimator: Any) -> str:
    entry = VOCABULARY["estimators"].get(str(estimator))
    return entry["name"] if entry else VOCABULARY["other_estimator"]


def threat_label(threat_model: Any) -> str:
    """Which adversary, in words ("sees the final model")."""
    return VOCABULARY["threat_models"].get(str(threat_model), VOCABULARY["other_threat_model"])


def estimate_label(e: dict) -> str:
    """One estimate's name and the variant that matters, as the dashboard's ``estimateLabel``."""
    parts = [estimator_name(e.get("estimator"))]
    variance = VOCABULARY["variances"].get(str(e.get("variance")))
    if variance:
        parts.append(variance)
    if e.get("correction") == "none":
        parts.append("uncorrected")
    accountant = (e.get("details") or {}).get("accountant")
    if e.get("estimator") == "analytic" and isinstance(accountant, str):
        parts.append(accountant.upper())
    return parts[0] + (f" ({', '.join(parts[1:])})" if len(parts) > 1 else "")


def field_label(key: Any) -> str:
    """A spec or design field in words; an unknown one with its underscores as spaces."""
    return VOCABULARY["fields"].get(str(key)) or _words(key).capitalize()


def _words(key: Any) -> str:
    return str(key).replace("_", " ")


def _number(value: float | int) -> str:
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return "∞" if value > 0 else ("−∞" if value < 0 else "not a number")
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.3g}"


def value_text(value: Any, key: Any = None) -> str:
    """One value in words: yes/no, numbers, enum values and identifiers put into words; a list
    joined by commas; a nested setting as "field value" pairs (see :func:`value_lines`)."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return _number(value)
    if isinstance(value, dict):
        return "; ".join(value_lines(value))
    if isinstance(value, (list, tuple)):
        return ", ".join(value_text(v, key) for v in value) or "none"
    text = str(value)
    if key == "threat_models" or text in VOCABULARY["threat_models"]:
        return threat_label(text) if text in VOCABULARY["threat_models"] else _words(text)
    if text in VOCABULARY["values"]:
        return VOCABULARY["values"][text]
    if text == "inf":
        return "∞"
    return human_text(text)


def value_lines(value: dict) -> list[str]:
    """A nested setting as lines "field: value" (the report shows one per line)."""
    return [f"{field_label(k)}: {value_text(v, k)}" for k, v in value.items()]


# -- checks (the audit's diagnostics), as the dashboard's format.js names them ------------------


def diagnostic_name(d: dict) -> str:
    """Which check, in words (an unknown one: "Check: " and its identifier's words)."""
    name = str(d.get("name") or "")
    entry = VOCABULARY["diagnostics"].get(name)
    return entry["name"] if entry else f"Check: {_words(name)}"


def diagnostic_purpose(d: dict) -> str:
    """What the check is for and what to do when it fails."""
    entry = VOCABULARY["diagnostics"].get(str(d.get("name") or ""))
    return entry["purpose"] if entry else ""


def diagnostic_state(d: dict) -> str:
    """``passes``, ``needs attention``, or ``not run`` (too few canaries for the tests)."""
    if str(d.get("name") or "").endswith("_skipped"):
        return "not run"
    return "passes" if d.get("ok") else "needs attention"


def _eps(value: Any) -> float | None:
    if value in ("inf", "Infinity"):
        return math.inf
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
        return float(value)
    return None


def diagnostic_value(d: dict) -> str:
    """The check's number: the bootstrap interval of ε, the test statistic against its limit,
    or its p-value; for a check not run, why."""
    if str(d.get("name") or "").endswith("_skipped"):
        return human_text(d.get("hint") or "")
    details = d.get("details") or {}
    lo, hi = _eps(details.get("lower")), _eps(details.get("upper"))
    if lo is not None and hi is not None:
        confidence = details.get("confidence")
        level = f"{round(confidence * 100)}% " if isinstance(confidence, (int, float)) else ""
        return f"{level}interval of ε: [{_number(lo)}, {_number(hi)}]"
    if isinstance(details.get("critical_value"), (int, float)):
        return f"A² = {value_text(d.get('value'))} (limit {_number(details['critical_value'])})"
    if isinstance(details.get("p_value"), (int, float)):
        return f"p = {_number(details['p_value'])}"
    return f"value {value_text(d.get('value'))}"
