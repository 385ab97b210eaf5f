"""Live audit state: turns ingested model vectors into stored statistics and estimates.

This is the one place where round data enters the service (the ingest routes call it). It
validates nothing about HTTP (the routes do); it regenerates canaries from the secret seed
(loaded from the database, never logged), updates the per-canary running maxima and the
known-rounds statistic (:class:`flaudit.auditor.claims.known_rounds.KnownRoundsStatistic`, fed with the round's
cosines on the released update, its participants and the unseen canaries as the null),
recomputes the estimates with :func:`flaudit.auditor.claims.summarize` and the alarm, and persists
round row, participants, tracker state, known-rounds state and estimates in one transaction
before returning.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Any

import numpy as np

from ..auditor.canaries import CanaryFamily, resolve_canary_family, seen_mask
from ..auditor.claims import AuditLook, audit_claims, summarize
from ..auditor.claims.alerts import build_alerts, decide, first_alarm, num_looks
from ..auditor.claims.known_rounds import KnownRoundsStatistic
from ..auditor.estimators import audit_analytic_epsilon, final_model_estimates
from ..auditor.noise_calibration import noise_calibration, noise_clip_factor, signal_factor
from ..auditor.results import jsonable, number
from ..auditor.spec import AuditSpec, Engine, ThreatModel
from ..auditor.statistics import CosineTracker
from ..auditor.transform import sum_of_squares
from .evidence_store import save_alarm_statistics
from .external import round_participants
from .metrics import ServiceMetrics
from .store import Analysis, StaleRound, Store

__all__ = [
    "IngestError",
    "LiveAudits",
    "headline_epsilon",
]

log = logging.getLogger("flaudit.service")


class IngestError(Exception):
    """An ingest request that must be refused; ``status_code`` and a message naming the problem."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message


_SEND_INITIAL_MODEL_FIRST = "send the initial model first (PUT .../initial-model)"


def _require_running(audit) -> None:
    """Ingest is only for running audits (409 otherwise)."""
    if audit.status != "running":
        raise IngestError(409, f"audit is {audit.status}; ingest refused")


def _require_length(vector: np.ndarray, dim: int) -> None:
    """A round delta or final model must have the initial model's length ``d`` (422 otherwise)."""
    if vector.shape[0] != dim:
        raise IngestError(
            422, f"wrong length: expected {dim} float32 values, got {vector.shape[0]}"
        )


def _as_dicts(items: Any) -> list[dict]:
    if items is None:
        return []
    if hasattr(items, "to_dict") and not isinstance(items, (list, tuple)):
        items = [items]
    out = []
    for item in items:
        out.append(jsonable(item.to_dict() if hasattr(item, "to_dict") else dict(item)))
    return out


def analytic_results(spec: AuditSpec) -> list[dict]:
    """Analytic epsilon of the spec's DP-FedAvg from dp-accounting (via the estimators package)."""

    return _as_dicts(audit_analytic_epsilon(spec))


def summary_parts(
    look: AuditLook, *, final: bool = False
) -> tuple[list[dict], list[dict], dict, list]:
    """Estimates, diagnostics, histograms and claim tests from
    :func:`flaudit.auditor.claims.summarize` on ``look``.

    After every round: the estimators and the one-run bound; at the end (``final``) also the
    bootstrap interval (``look``'s ``one_run`` and ``bootstrap`` are set here). Histograms are
    returned in the API's shape ``{"bin_edges", "seen", "unseen", "null", "null_kind"}``; the
    claim tests (``ClaimTestResult``) feed :func:`decide`.
    """

    summary = summarize(replace(look, one_run=True, bootstrap=200 if final else 0))
    histograms = {}
    for key, hist in (summary.histograms or {}).items():
        raw = hist.to_dict() if hasattr(hist, "to_dict") else dict(hist)
        histograms[key] = jsonable(
            {
                "bin_edges": raw.get("bin_edges"),
                "seen": raw.get("seen_counts", raw.get("seen")),
                "unseen": raw.get("unseen_counts", raw.get("unseen")),
                "null": raw.get("null_density", raw.get("null")),
                "null_kind": raw.get("null") if "null_density" in raw else None,
            }
        )
    return (
        _as_dicts(summary.estimates),
        _as_dicts(summary.diagnostics),
        histograms,
        list(summary.claim_tests),
    )


def _heaviest(*factors: Any) -> float | None:
    """The largest of the round ``weight_factor``s given (None: none reported)."""
    values = [float(f) for f in factors if number(f) is not None]
    return max(values) if values else None


def _least(*factors: Any) -> float | None:
    """The smallest of the round ``noise_clip_norm / clip_norm`` factors given (None: none)."""
    values = [float(f) for f in factors if number(f) is not None]
    return min(values) if values else None


def alarm_cause(audit) -> str | None:
    """The error alarm's cause in words for the ServerApp log: its alert's message and, when a
    round was noised for a smaller clip norm than its updates had, that finding too."""
    message = next(
        (
            a.get("message")
            for a in audit.alerts or []
            if (a.get("details") or {}).get("alarm") is not None
        ),
        None,
    )
    finding = noise_calibration(audit.spec, getattr(audit, "min_noise_clip_factor", None))
    parts = [p for p in (message, finding and finding["sentence"]) if p]
    return "; ".join(parts)[:1000] or None


def headline_epsilon(estimates: list[dict]) -> float | None:
    """The one number the audit list shows: the final-model two-Gaussian estimate with the null
    variance (the paper's Table 2 variant) if present, else the all-iterates two-Gaussian one."""
    preferences = [("final_model", "null"), ("final_model", "fitted"), ("all_iterates", "fitted")]
    for threat_model, variance in preferences:
        for est in estimates:
            if (
                est.get("estimator") == "two_gaussian"
                and est.get("threat_model") == threat_model
                and est.get("variance") == variance
            ):
                value = number(est.get("epsilon"))
                if value is not None and math.isfinite(value):
                    return value
    return None


def _analysis(
    estimates: list[dict], diagnostics: list[dict], histograms: dict, alerts: list[dict]
) -> Analysis:
    """A look's :class:`~.store.Analysis`, with its :func:`headline_epsilon`."""
    return Analysis(estimates, diagnostics, histograms, alerts, headline_epsilon(estimates))


class _CanaryCache:
    """Keeps cosine trackers per audit within a byte budget.

    A gaussian-family tracker holds a bank of up to ``k d`` float32 canaries (what the budget
    allows; the rest is regenerated every round); an orthogonal-family one needs only its
    ``12 d`` or ``16 d`` bytes of signs, whatever the budget.
    """

    def __init__(self, budget: int) -> None:
        self.budget = int(budget)
        self._items: OrderedDict[str, tuple[CosineTracker, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(
        self, audit_id: str, seed: int, num_canaries: int, dim: int, family: CanaryFamily
    ) -> CosineTracker:
        with self._lock:
            hit = self._items.get(audit_id)
            if hit is not None and hit[0].dim == dim:
                self._items.move_to_end(audit_id)
                return hit[0]
            used = sum(size for _, size in self._items.values())
            orthogonal = family is CanaryFamily.orthogonal
            wanted = 16 * dim if orthogonal else num_canaries * dim * 4
            while self._items and used + wanted > self.budget:
                _, (_, size) = self._items.popitem(last=False)
                used -= size
            allowed = wanted if orthogonal else max(0, min(wanted, self.budget - used))
        tracker = CosineTracker(seed, num_canaries, dim, family=family, cache_bytes=allowed)
        with self._lock:
            self._items[audit_id] = (tracker, allowed)
        return tracker

    def forget(self, audit_id: str) -> None:
        with self._lock:
            self._items.pop(audit_id, None)


class _ModelChange:
    """``theta_t - theta_0`` rebuilt from the released updates with the ServerApp's optimizer
    step (``flaudit.server.dpfedavg.ServerOptimizer``: heavy-ball momentum; the learning rate does not
    change the direction, so it is left out). Kept in memory between rounds (float32, the
    precision the cosines are taken in: 4 d bytes per running audit, 8 d with momentum): after a
    restart the final-model estimate waits for the final model."""

    def __init__(self, dim: int, momentum: float) -> None:
        self.momentum = float(momentum)
        self.velocity = np.zeros(dim, dtype=np.float32) if self.momentum else None
        self.total = np.zeros(dim, dtype=np.float32)
        self.rounds = 0

    def add(self, update: np.ndarray) -> None:
        if self.velocity is None:
            self.total += update
        else:
            self.velocity *= np.float32(self.momentum)
            self.velocity += update
            self.total += self.velocity
        self.rounds += 1


def final_model_so_far(
    cosines: np.ndarray, seen: np.ndarray, *, dim: int, delta: float, t: int, num_rounds: int
) -> list[dict]:
    """The final-model estimates on ``cos(c_j, theta_t - theta_0)``: the same statistic and
    estimators as at the end, on the model so far, labelled ``so_far`` (details) and in the
    method; the final model's own values replace them at the end."""

    if int(seen.sum()) < 2:
        return []
    out = _as_dicts(final_model_estimates(cosines[seen], dim, delta))
    for e in out:
        e["details"].update(so_far=True, round=t)
        e["method"] = (
            f"so far (round {t} of {num_rounds}, theta_t - theta_0 standing in for "
            f"the final model): {e['method']}"
        )
    return out


class LiveAudits:
    """Ingest logic shared by the three ingest routes.

    Parameters
    ----------
    store : Store
        The database.
    canary_cache_bytes : int
        Memory for canary banks kept between rounds (0: regenerate every round).
    metrics : ServiceMetrics, optional
        Where transform times and fired alarms are counted (the app's ``GET /metrics``).
    """

    def __init__(
        self, store: Store, *, canary_cache_bytes: int = 0, metrics: ServiceMetrics | None = None
    ) -> None:
        self.store = store
        self.metrics = metrics or ServiceMetrics()
        self._cache = _CanaryCache(canary_cache_bytes)
        self._so_far: dict[str, _ModelChange] = {}  # theta_t - theta_0 of running audits
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self.version = 0  # bumped on every write; read caches compare it

    def __repr__(self) -> str:
        return "LiveAudits()"

    def _lock(self, audit_id: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(audit_id, threading.Lock())

    def forget(self, audit_id: str) -> None:
        self._cache.forget(audit_id)
        self._so_far.pop(audit_id, None)
        with self._locks_guard:
            self._locks.pop(audit_id, None)

    def _audit(self, audit_id: str):
        audit = self.store.get_audit(audit_id)
        if audit is None:
            raise IngestError(404, f"audit {audit_id!r} not found")
        return audit

    @staticmethod
    def _family(spec: AuditSpec, dim: int) -> CanaryFamily:
        """The audit's canary family (the ServerApp resolves it the same way)."""
        return resolve_canary_family(spec.canary_family, num_canaries=spec.num_canaries, dim=dim)

    def _running_audit(self, audit_id: str):
        audit = self._audit(audit_id)
        spec = AuditSpec.model_validate(audit.spec)
        return audit, spec

    # -- initial model --------------------------------------------------------------------
    def ingest_initial(self, audit_id: str, model: np.ndarray) -> str:
        with self._lock(audit_id):
            audit, spec = self._running_audit(audit_id)
            existing = self.store.initial_model_bytes(audit_id)
            if existing is not None:
                if existing == np.ascontiguousarray(model, "<f4").tobytes():
                    return "duplicate"
                raise IngestError(409, "initial model already stored with different values")
            _require_running(audit)
            if model.shape[0] < 2:
                raise IngestError(422, "initial model: the model vector needs at least 2 values")
            try:
                resolve_canary_family(
                    spec.canary_family, num_canaries=spec.num_canaries, dim=int(model.shape[0])
                )
            except ValueError as error:
                raise IngestError(422, f"initial model: {error}") from None
            analytic = analytic_results(spec)
            alerts = build_alerts(
                spec=spec, dim=int(model.shape[0]), rounds_stored=0, has_final=False
            )
            try:
                self.store.store_initial_model(
                    audit_id, model=model, analytic=analytic, estimates=analytic, alerts=alerts
                )
            except StaleRound:
                raise IngestError(409, "initial model already stored") from None
            self.version += 1
            return "stored"

    # -- rounds ---------------------------------------------------------------------------
    def expected_dim(self, audit_id: str) -> int | None:
        return self._audit(audit_id).dim

    def ingest_round(
        self,
        audit_id: str,
        t: int,
        update: np.ndarray,
        metadata: dict,
        participants: np.ndarray | None = None,
        gap: dict | None = None,
        *,
        consume: bool = False,
    ) -> str:
        """Store round ``t``: its released update ``rho_bar_t`` and (optionally) its canary
        participants (indices, already checked to be distinct and in ``[0, k)``). An audit
        reports participants on every round or on none (409 otherwise). Returns ``"stored"`` or
        ``"duplicate"`` (same t again: no-op). ``consume=True`` (the HTTP route, which owns the
        body's buffer): ``update`` is overwritten by the canary transform instead of copied."""
        with self._lock(audit_id):
            audit, spec = self._running_audit(audit_id)
            if t <= audit.rounds_stored:
                return "duplicate"
            _require_running(audit)
            if audit.has_final:
                raise IngestError(409, "final model already stored; no more rounds accepted")
            if t != audit.rounds_stored + 1:
                raise IngestError(
                    409,
                    f"round {t} is out of order: the next round must be {audit.rounds_stored + 1}",
                )
            if t > spec.num_rounds:
                raise IngestError(
                    409, f"round {t} exceeds num_rounds={spec.num_rounds} of the audit spec"
                )
            secret = self.store.load_secret_state(audit_id)
            if secret.dim is None:
                raise IngestError(409, _SEND_INITIAL_MODEL_FIRST)
            _require_length(update, secret.dim)
            if participants is None and spec.engine in (Engine.external, Engine.deployment):
                # the service scheduled this run's canaries (served their sums; the ServerApp
                # has no seed): it knows the round's participants, on every round alike
                participants = round_participants(secret.seed, spec, t)
            had_participants = secret.known_rounds is not None
            if t > 1 and had_participants != (participants is not None):
                raise IngestError(
                    409,
                    "participants: earlier rounds of this audit were sent "
                    + ("with" if had_participants else "without")
                    + " participants (num_participants); send every round the same way",
                )
            k = spec.num_canaries
            family = self._family(spec, secret.dim)
            tracker = self._cache.get(audit_id, secret.seed, k, secret.dim, family)
            # the update is read once and scored once: what else needs it comes first, then the
            # transform runs in its buffer (no working copy of a d-vector)
            change = self._so_far.pop(audit_id, None)
            if t == 1:
                change = _ModelChange(secret.dim, spec.server_momentum)
            tracking = change is not None and change.rounds == t - 1
            if tracking:
                change.add(update)
            delta_norm = math.sqrt(sum_of_squares(update))
            with self.metrics.round_transform_seconds.time():
                round_cosines = tracker.all_cosines(update, consume=consume)
            del update
            previous = secret.max_cosines if secret.max_cosines is not None else np.full(k, -np.inf)
            max_cosines = np.maximum(previous, round_cosines)
            seen = seen_mask(secret.seed, k)
            # this round's noise for the clip norm its updates had (issue #38): below 1 the
            # mechanism actually run gives a canary more than the claim, and is tested as run
            noise_factor = noise_clip_factor(
                metadata.get("clip_norm"), metadata.get("noise_clip_norm")
            )
            known_rounds = None
            if participants is not None:
                statistic = KnownRoundsStatistic(
                    k, dim=secret.dim, state=secret.known_rounds, scale_dof=tracker.scale_dof
                )
                mask = np.zeros(k, dtype=bool)
                mask[participants] = True
                statistic.update(
                    round_cosines,
                    mask,
                    ~seen,
                    factor=signal_factor(metadata.get("weight_factor"), noise_factor),
                )
                known_rounds = statistic
            # a weighted FedAvg: the claims at the heaviest influence the canaries carried so
            # far (docs/estimators.md, "Weighted FedAvg: two answers"), each round's test at
            # its own ("Per-round weights"); a round noised for less than its clip norm: the
            # claims of the mechanism actually run ("The mechanism actually run")
            heaviest = _heaviest(
                audit.max_canary_weight_factor,
                metadata.get("weight_factor") if metadata.get("num_canaries_inserted") else None,
            )
            least = _least(getattr(audit, "min_noise_clip_factor", None), noise_factor)
            influence = signal_factor(heaviest, least)
            estimates, diagnostics, histograms, tests = [], [], {}, []
            if ThreatModel.all_iterates in spec.threat_models:
                estimates, diagnostics, histograms, tests = summary_parts(
                    AuditLook(
                        seen=seen,
                        dim=secret.dim,
                        delta=spec.delta,
                        max_cosines=max_cosines,
                        final_cosines=None,
                        threat_models=[ThreatModel.all_iterates],
                        known_rounds_scores=None if known_rounds is None else known_rounds.scores,
                        known_rounds_participations=None
                        if known_rounds is None
                        else known_rounds.num_participations,
                        known_rounds_rounds=None
                        if known_rounds is None
                        else known_rounds.rounds_at(influence),
                        canary_repeats=spec.canary_repeats,
                        claims=audit_claims(spec, weight_factor=heaviest, noise_clip_factor=least),
                        num_rounds=t,
                        scale_dof=tracker.scale_dof,
                    )
                )
            if tracking:
                self._so_far[audit_id] = change
                if ThreatModel.final_model in spec.threat_models:
                    estimates = estimates + final_model_so_far(
                        tracker.all_cosines(change.total),
                        seen,
                        dim=secret.dim,
                        delta=spec.delta,
                        t=t,
                        num_rounds=spec.num_rounds,
                    )
            all_estimates = estimates + list(audit.analytic or [])
            alarm = decide(spec, tests, look=t, weight_factor=heaviest, noise_clip_factor=least)
            alerts = build_alerts(
                spec=spec,
                dim=secret.dim,
                rounds_stored=t,
                has_final=False,
                alarm=alarm,
                round=t,
                previous=audit.alerts,
            )
            row = {
                "round": t,
                "delta_norm": delta_norm,
                "estimates": estimates,
                **metadata,
            }
            try:
                self.store.store_round(
                    audit_id,
                    round_row=row,
                    max_cosines=max_cosines,
                    last_cosines=round_cosines,
                    analysis=_analysis(all_estimates, diagnostics, histograms, alerts),
                    known_rounds=None if known_rounds is None else known_rounds.state(),
                    participants=participants,
                    gap=gap,  # {round, kind, reason}: e.g. trained without canaries
                )
            except StaleRound as exc:
                if self._audit(audit_id).rounds_stored >= t:
                    return "duplicate"  # another replica stored this round of the run first
                raise IngestError(409, str(exc)) from None
            self.metrics.alarm(audit.alerts, alerts, audit_id)
            if alarm.status == "error" and first_alarm(audit.alerts) is None:
                save_alarm_statistics(
                    self.store,
                    audit_id,
                    round=t,
                    max_cosines=max_cosines,
                    known_rounds=None if known_rounds is None else known_rounds.state(),
                )  # for flaudit verify
            self.version += 1
            return "stored"

    def round_ack(self, audit_id: str) -> dict:
        """The alarm state a round's ingest answers with: ``alarm`` ("error" once the error
        alarm has fired), ``stop`` (the spec's ``stop_on_alarm`` and the alarm fired) and
        ``stop_reason``; the reporter ends training on ``stop``."""
        audit = self._audit(audit_id)
        record = first_alarm(audit.alerts)
        if record is None:
            return {"alarm": None, "stop": False, "stop_reason": None}
        stop = bool(audit.spec.get("stop_on_alarm"))
        where = record.get("round")
        return {
            "alarm": "error",
            "stop": stop,
            "stop_reason": f"claim refuted at round {where}" if stop else None,
            "alarm_round": where,
            "alarm_cause": alarm_cause(audit),
        }

    # -- final model ----------------------------------------------------------------------
    def ingest_final(self, audit_id: str, model: np.ndarray, metrics: dict) -> str:
        with self._lock(audit_id):
            audit, spec = self._running_audit(audit_id)
            if audit.has_final:
                return "duplicate"
            _require_running(audit)
            secret = self.store.load_secret_state(audit_id)
            if secret.initial_model is None:
                raise IngestError(409, _SEND_INITIAL_MODEL_FIRST)
            _require_length(model, secret.dim)
            k = spec.num_canaries
            family = self._family(spec, secret.dim)
            tracker = self._cache.get(audit_id, secret.seed, k, secret.dim, family)
            final_cosines = tracker.all_cosines(
                model.astype(np.float64) - secret.initial_model  # float64: no overflow
            )
            final_model_cosines = tracker.all_cosines(model)
            max_cosines = secret.max_cosines if secret.rounds_stored > 0 else None
            wanted = list(spec.threat_models)
            if max_cosines is None:
                wanted = [tm for tm in wanted if tm != ThreatModel.all_iterates]
            seen = seen_mask(secret.seed, k)
            heaviest = audit.max_canary_weight_factor
            least = getattr(audit, "min_noise_clip_factor", None)
            scores = counts = rounds = None
            if secret.known_rounds is not None and ThreatModel.all_iterates in wanted:
                statistic = KnownRoundsStatistic(
                    k, dim=secret.dim, state=secret.known_rounds, scale_dof=tracker.scale_dof
                )
                scores, counts = statistic.scores, statistic.num_participations
                rounds = statistic.rounds_at(signal_factor(heaviest, least))
            estimates, diagnostics, histograms, tests = [], [], {}, []
            if wanted:
                estimates, diagnostics, histograms, tests = summary_parts(
                    AuditLook(
                        seen=seen,
                        dim=secret.dim,
                        delta=spec.delta,
                        max_cosines=max_cosines if ThreatModel.all_iterates in wanted else None,
                        final_cosines=final_cosines if ThreatModel.final_model in wanted else None,
                        threat_models=wanted,
                        known_rounds_scores=scores,
                        known_rounds_participations=counts,
                        known_rounds_rounds=rounds,
                        canary_repeats=spec.canary_repeats,
                        claims=audit_claims(spec, weight_factor=heaviest, noise_clip_factor=least),
                        num_rounds=secret.rounds_stored,
                        scale_dof=tracker.scale_dof,
                    ),
                    final=True,
                )
            all_estimates = estimates + list(audit.analytic or [])
            alerts = build_alerts(
                spec=spec,
                dim=secret.dim,
                rounds_stored=secret.rounds_stored,
                has_final=True,
                alarm=decide(
                    spec,
                    tests,
                    look=num_looks(spec),
                    weight_factor=heaviest,
                    noise_clip_factor=least,
                ),
                previous=audit.alerts,
            )
            try:
                self.store.store_final(
                    audit_id,
                    final_cosines=final_cosines,
                    final_model_cosines=final_model_cosines,
                    analysis=_analysis(all_estimates, diagnostics, histograms, alerts),
                    metrics=jsonable(metrics),
                )
            except StaleRound as exc:
                if self._audit(audit_id).has_final:
                    return "duplicate"  # another replica stored the final model first
                raise IngestError(409, str(exc)) from None
            self.metrics.alarm(audit.alerts, alerts, audit_id)
            self.version += 1
            self._cache.forget(audit_id)
            self._so_far.pop(audit_id, None)
            return "stored"
