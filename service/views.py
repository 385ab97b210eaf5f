"""Turn stored rows into the JSON shapes of the API (see docs/api.md).

Until an audit has ended, nothing here reveals the secret seen/unseen split: histogram counts of
seen and unseen canaries are merged into ``canaries`` and the per-canary ``seen`` label is null.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..auditor.canaries import resolve_canary_family, seen_mask
from ..auditor.claims.alerts import bug_label, first_alarm, spec_alarm_guarantee, spec_verdict
from ..auditor.noise_calibration import (
    noise_calibration_alerts,
    noise_clip_factor,
    with_noise_calibration,
)
from ..auditor.progress import eta_seconds, fmt_seconds, round_wait
from ..auditor.spec import AUTO_CANARIES
from ..auditor.statistics import scale_dof
from .store import ENDED_STATUSES, Audit, AuditRound, Store, as_utc, utcnow

__all__ = [
    "audit_verdict_view",
    "audit_view",
    "audit_summary_view",
    "round_view",
    "CosineColumns",
    "cosine_columns",
    "cosines_version",
    "cosines_view",
    "cosines_csv",
]


def iso_utc(value) -> str | None:
    """A stored time as ISO 8601 in UTC with a ``Z`` (naive times are UTC); None stays None."""
    value = as_utc(value)
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def _seconds(value: float) -> str:
    return fmt_seconds(value, tenths_below=1.0)


def _waiting_for(audit: Audit, t: int, num_rounds: int, times: list[float], now: float) -> str:
    """What a running audit is waiting for, in words (issue #40: progress that says where the
    time goes)."""
    engine = audit.spec.get("engine")
    since = as_utc(audit.started_at or audit.created_at)
    waited = "" if since is None else f" ({_seconds(max(now - since.timestamp(), 0.0))} so far)"
    if t == 0:
        if engine == "external":
            if audit.started_at is None:
                return f"waiting for your Flower app to start and declare its claim{waited}"
            return f"waiting for round 1's updates from your Flower app{waited}"
        if engine == "deployment":
            return f"waiting for the SuperLink to start the run and send round 1{waited}"
        return f"starting Flower and Ray, then round 1{waited}"
    if t >= num_rounds:
        return "waiting for the final model"
    wait = round_wait(times, num_rounds, now) if len(times) == t else None
    if wait is None:
        return f"waiting for round {t + 1}'s updates"
    text = f"waiting for round {wait.round}'s updates ({_seconds(wait.waited_seconds)} so far"
    if wait.typical_seconds is not None:
        earlier = f"rounds 1-{t}" if t > 2 else "rounds 1 and 2"
        text += f"; {earlier} came {_seconds(wait.typical_seconds)} apart"
        if wait.overdue:
            text += ": this one is slower"
    elif t == 1:
        text += "; the time per round is known after round 2"
    return text + ")"


def progress_view(audit: Audit, round_times=None, *, now: float | None = None) -> dict[str, Any]:
    """Round t of T, what the run is waiting for (``waiting_for``, words) and the ETA from the
    times rounds 1..t arrived (``round_times``; without them, as in the audit list, neither):
    the Flower/Ray start-up is not round time, the wait for the next round is
    (:func:`flaudit.auditor.progress.eta_seconds` with ``now``)."""
    num_rounds = int(audit.spec.get("num_rounds", 0) or 0)
    t = int(audit.rounds_stored or 0)
    eta = waiting = None
    if audit.status == "running" and round_times is not None:
        now = utcnow().timestamp() if now is None else now
        times = [as_utc(at).timestamp() for at in round_times]
        waiting = _waiting_for(audit, t, num_rounds, times, now)
        if len(times) == t > 0:
            eta = eta_seconds(times, num_rounds, now=now)
            eta = None if eta is None else round(eta, 3)
    elif audit.status == "queued":
        waiting = "waiting for the runner to start it (max_concurrent_audits run at once)"
    elif audit.status in ENDED_STATUSES:
        eta = 0.0 if audit.status == "succeeded" else None
    return {
        "round": t,
        "num_rounds": num_rounds,
        "fraction": (t / num_rounds) if num_rounds else 0.0,
        "eta_seconds": eta,
        "waiting_for": waiting,
    }


def _merge_histograms(histograms: dict, ended: bool) -> dict:
    if ended or not histograms:
        return histograms or {}
    merged = {}
    for key, hist in histograms.items():
        if isinstance(hist, dict) and "seen" in hist and "unseen" in hist:
            hist = dict(hist)
            seen, unseen = hist.pop("seen"), hist.pop("unseen")
            try:
                hist["canaries"] = (np.asarray(seen) + np.asarray(unseen)).tolist()
            except (TypeError, ValueError):
                hist["canaries"] = None
        merged[key] = hist
    return merged


def audit_verdict_view(audit: Audit) -> dict[str, Any]:
    """The audit's verdict (:func:`flaudit.auditor.claims.alerts.spec_verdict`) as JSON."""
    gaps = getattr(audit, "gaps", None) or []  # rounds the run lacks (fail-open reporting)
    verdict = spec_verdict(
        audit.spec,
        alarm=first_alarm(audit.alerts),
        estimates=audit.estimates or [],
        state=audit.status,
        rounds_received=int(audit.rounds_stored or 0),
        missing_rounds=[g["round"] for g in gaps if g.get("kind") == "not_reported"],
        rounds_without_canaries=[g["round"] for g in gaps if g.get("kind") == "no_canaries"],
        weight_factor=audit.max_weight_factor,
        canary_weight_factor=audit.max_canary_weight_factor,
        dim=getattr(audit, "dim", None),
        noise_clip_factor=getattr(audit, "min_noise_clip_factor", None),
    )
    return with_noise_calibration(
        verdict.to_dict(), audit.spec, getattr(audit, "min_noise_clip_factor", None)
    )


#: What a gap costs the audit, by kind (the audit JSON's ``gaps[].cost``).
GAP_COSTS = {
    "no_canaries": (
        "trained without canaries: the seen canaries scheduled for this round were never "
        "inserted, so they carry no signal; estimates and power drop, the lower bounds and the "
        "alarm stay valid"
    ),
    "not_reported": (
        "trained but not reported: the all-iterates and known-rounds statistics skip this round"
    ),
}
#: What a ``not_reported`` gap leaves, by whether the final model arrived.
_NOT_REPORTED_FINAL = {
    True: " (its canaries count only through the final model, which arrived)",
    False: " (its canaries would count through the final model, but the final model never "
    "arrived: they count nowhere)",
}


def _gap_cost(kind: str, has_final: bool) -> str:
    cost = GAP_COSTS.get(kind, "")
    return cost + _NOT_REPORTED_FINAL[bool(has_final)] if kind == "not_reported" else cost


def _spans(rounds: list[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3, 5"``."""
    out, start = [], None
    for i, t in enumerate(rounds):
        if start is None:
            start = t
        if i + 1 == len(rounds) or rounds[i + 1] != t + 1:
            out.append(str(start) if start == t else f"{start}-{t}")
            start = None
    return ", ".join(out)


def gaps_view(audit: Audit) -> tuple[list[dict], list[dict]]:
    """The rounds the audit lacks, ``[{round, kind, reason, cost}]`` in round order, and one
    warning alert per kind saying which rounds and what that costs."""
    gaps = sorted((dict(g) for g in (audit.gaps or [])), key=lambda g: (g["round"], g["kind"]))
    alerts = []
    has_final = bool(getattr(audit, "has_final", False))
    for gap in gaps:
        gap["cost"] = _gap_cost(gap.get("kind"), has_final)
    for kind in GAP_COSTS:
        cost = _gap_cost(kind, has_final)
        rounds = sorted({g["round"] for g in gaps if g.get("kind") == kind})
        if rounds:
            reasons = sorted({g["reason"] for g in gaps if g.get("kind") == kind})
            word = "round" if len(rounds) == 1 else "rounds"
            alerts.append(
                {
                    "level": "warning",
                    "message": (f"{word} {_spans(rounds)} {cost} ({'; '.join(reasons)[:300]})"),
                }
            )
    return gaps, alerts


def owner_change_alerts(audit: Audit) -> list[dict]:
    """One info alert when another replica took the running audit over (``owner_changes``,
    service/replicas.py): when, from whom, after which round, and what it interrupted."""
    changes = getattr(audit, "owner_changes", None) or []
    if not changes:
        return []
    last = changes[-1]
    count = int(last.get("count") or len(changes))
    times = "once" if count == 1 else f"{count} times"
    so_far = ""
    if "final_model" in (audit.spec or {}).get("threat_models", ["final_model"]):
        so_far = (
            " The final-model estimate 'so far' (theta_t - theta_0, kept in the memory of the "
            "replica that saw every round) is not shown again until the final model arrives."
        )
    return [
        {
            "level": "info",
            "message": (
                f"another service replica took this audit over {times}; last at {last['at']} "
                f"after round {last['after_round']}: {last['from']} -> {last['to']} "
                f"({last['why']}; its last heartbeat {last.get('last_heartbeat_at')}). No "
                f"acknowledged round is lost: each was committed before it was acknowledged."
                + so_far
                + (
                    " Route by audit id (docs/deployment.md, 'Replicas') so one replica serves "
                    "each audit."
                    if count > 2
                    else ""
                )
            ),
        }
    ]


def weighting_alerts(verdict: dict) -> list[dict]:
    """A warning when the run's aggregation weighted some reply enough above the C/n the noise
    is calibrated for to break the claim (the verdict's ``weighting``: the same answer and the
    same words as its sentence)."""
    weighting = verdict.get("weighting") or {}
    if not weighting.get("breaks_claim"):
        return []
    tested = (
        f"the claim tests run at the heaviest influence the canaries carried (μ = "
        f"{weighting.get('tested_mu', weighting['heaviest_mu']):.3g})"
    )
    noise = (
        f"{tested} and the alarm fired: the noise falls short for the weighting used too"
        if verdict.get("cause") == "noise_and_weighting"
        else f"{tested}, so an alarm would mean the noise falls short for the weighting used"
    )
    return [
        {
            "level": "warning",
            "message": (
                f"weighted aggregation: the weighted average gives the heaviest client up to "
                f"{weighting['weight_factor']:.3g}× the influence (C/n) the DP noise is calibrated for, "
                f"so the claim does not hold for a client that heavy (protected only at μ = "
                f"{weighting['heaviest_mu']:.3g}, claimed {weighting['claim_mu']:.3g}); {noise}. Cap "
                "the weights or weight uniformly."
            ),
        }
    ]


def audit_view(audit: Audit, *, round_times=None) -> dict[str, Any]:
    ended = audit.status in ENDED_STATUSES
    base = f"/audits/{audit.id}"
    verdict = audit_verdict_view(audit)
    reason = audit.reason
    if reason is None and verdict["stopped"]:
        reason = f"stopped at round {verdict['round']}: claim refuted (stop_on_alarm)"
    gaps, gap_alerts = gaps_view(audit)
    return {
        "id": audit.id,
        "name": audit.name,
        "status": audit.status,
        "reason": reason,
        "verdict": verdict,
        "spec": audit.spec,
        "created_at": iso_utc(audit.created_at),
        "started_at": iso_utc(audit.started_at),
        "finished_at": iso_utc(audit.finished_at),
        "progress": progress_view(audit, round_times),
        "dim": audit.dim,
        "estimates": audit.estimates or [],
        "diagnostics": audit.diagnostics or [],
        "alerts": [
            *(audit.alerts or []),
            *gap_alerts,
            *owner_change_alerts(audit),
            *weighting_alerts(verdict),
            *noise_calibration_alerts(verdict),
        ],
        "gaps": gaps,
        "alarm_guarantee": spec_alarm_guarantee(
            audit.spec, canary_weight_factor=audit.max_canary_weight_factor
        ),
        "flower_run_id": audit.flower_run_id,
        "owner": None if ended else audit.owner_id,
        "owner_changes": list(getattr(audit, "owner_changes", None) or []),
        "max_weight_factor": audit.max_weight_factor,
        "min_noise_clip_factor": getattr(audit, "min_noise_clip_factor", None),
        "bug_injected": bug_label(audit.spec),
        "histograms": _merge_histograms(audit.histograms or {}, ended),
        "metrics": audit.metrics or {},
        "links": {
            "self": base,
            "rounds": f"{base}/rounds",
            "cosines": f"{base}/cosines",
            "cancel": f"{base}/cancel",
        },
    }


def audit_summary_view(audit: Audit) -> dict[str, Any]:
    headline = audit.headline_epsilon
    if headline is not None and not math.isfinite(headline):
        headline = None
    return summary_row(audit, audit_verdict_view(audit), progress_view(audit), headline)


def summary_row(
    audit: Audit, verdict: dict[str, Any], progress: dict[str, Any], headline: float | None
) -> dict[str, Any]:
    """One row of the audit list (``AuditSummary``), of either level."""
    return {
        "id": audit.id,
        "name": audit.name,
        "status": audit.status,
        "verdict": {
            "status": verdict["status"],
            "summary": verdict["summary"],
            "claim": verdict.get("claim"),
            "largest_valid_bound": verdict.get("largest_valid_bound"),
        },
        "progress": progress,
        "headline_epsilon": headline,
        "created_at": iso_utc(audit.created_at),
    }


def round_view(row: AuditRound, *, ended: bool) -> dict[str, Any]:
    """One round's row. The number of seen canaries inserted is withheld (null) until the audit
    has ended: summed over rounds it would tell how many canaries are seen."""
    return {
        "round": row.round,
        "clip_norm": row.clip_norm,
        "cohort_size": row.cohort_size,
        "num_canaries_inserted": row.num_canaries_inserted if ended else None,
        "num_failures": row.num_failures,
        "clipped_fraction": row.clipped_fraction,
        "noise_stddev": row.noise_stddev,
        "train_loss": row.train_loss,
        "accuracy": row.accuracy,
        "update_norm": row.delta_norm,
        "weight_factor": row.weight_factor,
        "noise_clip_norm": row.noise_clip_norm,
        "noise_clip_factor": noise_clip_factor(row.clip_norm, row.noise_clip_norm),
        "received_at": iso_utc(row.received_at),
        "estimates": row.estimates or [],
    }


_COSINE_FIELDS = [
    "index",
    "max_cosine",
    "last_cosine",
    "final_cosine",
    "final_model_cosine",
    "seen",
]
_COSINE_ARRAYS = ("max_cosines", "last_cosines", "final_cosines", "final_model_cosines")


@dataclass(frozen=True)
class CosineColumns:
    """One audit's per-canary statistics, decoded: the stored arrays (``None`` until stored)
    and the seen/unseen labels, present only if the audit had ended when they were read.
    The arrays are read-only: a :class:`~flaudit.service.app.ReadCache` shares them."""

    arrays: dict[str, np.ndarray | None]
    seen: np.ndarray | None

    @property
    def nbytes(self) -> int:
        arrays = [*self.arrays.values(), self.seen]
        return sum(a.nbytes for a in arrays if a is not None)


def _num_canaries(audit: Audit) -> int:
    """``k`` of ``audit``; 0 while an external audit's ``"auto"`` waits for its claim."""
    k = audit.spec["num_canaries"]
    return 0 if k == AUTO_CANARIES else int(k)


def cosines_version(audit: Audit) -> tuple:
    """What the decoded per-canary statistics of ``audit`` depend on: the arrays change only
    with a stored round or the final model, the labels with the status (published once ended)."""
    return (
        int(audit.rounds_stored or 0),
        bool(audit.has_final),
        audit.status,
        _num_canaries(audit),
    )


def cosine_columns(store: Store, audit: Audit, *, cache=None) -> CosineColumns:
    """Decode the per-canary arrays of ``audit`` (and its labels if it has ended), or take them
    from ``cache`` (a :class:`~flaudit.service.app.ReadCache`) if it holds them for
    :func:`cosines_version` of ``audit``."""

    def load() -> CosineColumns:
        arrays = store.cosine_arrays(audit.id)
        k = _num_canaries(audit)
        labels = (
            seen_mask(store.canary_seed(audit.id), k) if audit.status in ENDED_STATUSES else None
        )
        for array in (*arrays.values(), labels):
            if array is not None:
                array.flags.writeable = False
        return CosineColumns(arrays={name: arrays[name] for name in _COSINE_ARRAYS}, seen=labels)

    if cache is None:
        return load()
    return cache.cosines(audit.id, cosines_version(audit), load)


def _cosine_items(columns: CosineColumns, k: int, start: int, stop: int):
    """Per-canary rows ``start <= j < stop`` (the label only once the audit has ended); only
    the rows' slices of the arrays are converted."""
    stop = min(stop, k)
    if start >= stop:
        return
    values = {}
    for name in _COSINE_FIELDS[1:5]:
        array = columns.arrays[f"{name}s"]
        values[name] = None if array is None else array[start:stop].tolist()
    seen = None if columns.seen is None else columns.seen[start:stop].tolist()
    for i in range(stop - start):
        item: dict[str, Any] = {"index": start + i}
        for name, column in values.items():
            item[name] = None if column is None or not math.isfinite(column[i]) else column[i]
        item["seen"] = None if seen is None else seen[i]
        yield item


def cosines_view(
    store: Store, audit: Audit, *, limit: int, offset: int = 0, cache=None
) -> dict[str, Any]:
    """One page of the per-canary statistics: canaries ``offset`` to ``offset + limit - 1``.

    With ``cache`` (the app's ``ReadCache``) the arrays are decoded once per stored round,
    final model or status change, and a page costs O(``limit``) after that.
    """
    columns = cosine_columns(store, audit, cache=cache)
    ended = audit.status in ENDED_STATUSES
    k = _num_canaries(audit)
    dof = None
    if audit.dim:
        family = resolve_canary_family(
            audit.spec.get("canary_family"), num_canaries=k, dim=int(audit.dim)
        )
        dof = scale_dof(family, num_canaries=k, dim=int(audit.dim))
    return {
        "audit_id": audit.id,
        "status": audit.status,
        "dim": audit.dim,
        "scale_dof": dof,
        "delta": float(audit.spec["delta"]),
        "num_rounds": int(audit.rounds_stored or 0),
        "labels_published": ended,
        "total": k,
        "offset": offset,
        "limit": limit,
        "items": list(_cosine_items(columns, k, offset, offset + limit)),
    }


def cosines_csv(store: Store, audit: Audit, *, chunk: int = 10_000, cache=None):
    """The per-canary statistics of every canary as CSV text, yielded ``chunk`` rows at a time."""
    columns = cosine_columns(store, audit, cache=cache)
    k = _num_canaries(audit)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=_COSINE_FIELDS, lineterminator="\n")
    writer.writeheader()
    for start in range(0, k, chunk):
        for item in _cosine_items(columns, k, start, start + chunk):
            writer.writerow(
                {key: ("" if item[key] is None else item[key]) for key in _COSINE_FIELDS}
            )
        yield out.getvalue()
        out.seek(0)
        out.truncate()
    if out.tell():  # no canary: the header alone
        yield out.getvalue()
