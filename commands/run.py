"""``flaudit run audit.toml``: one audit end to end in Flower's simulation engine (a record-level
spec, ``"level": "record"``, goes to :mod:`flaudit.commands.record_run` instead).

The TOML file holds :class:`flaudit.auditor.spec.AuditSpec` fields, either at the top level or in an
``[audit]`` table (``task_options`` and ``adaptive_clipping`` as sub-tables). A fresh secret
canary seed is drawn for the run and never printed; rounds (the released update of each round
and its canary participants) are fed to an in-process :class:`~flaudit.auditor.statistics.CosineTracker`
and the known-rounds statistic; the estimator table, the DP alarm and its guarantee are printed
at the end. ``--inject-bug`` runs DP-FedAvg with a deliberate DP bug that the claim (analytic
epsilon, alarm) does not know about, to watch the alarm fire.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from pathlib import Path

from ..auditor.bugs import InjectedBug
from ..auditor.canaries import new_master_seed, seen_mask
from ..auditor.claims import AuditLook, audit_claims, audit_design, summarize
from ..auditor.claims.alerts import (
    bug_label,
    build_alerts,
    decide,
    design_warning,
    first_alarm,
    num_looks,
    spec_verdict,
)
from ..auditor.claims.alerts import spec_alarm_guarantee as alarm_guarantee
from ..auditor.claims.evidence import known_rounds_json
from ..auditor.estimators import audit_analytic_epsilon
from ..auditor.record_spec import is_record_level
from ..auditor.spec import AuditSpec, ThreatModel
from ._progress import RoundProgress
from ._run_outputs import commit, junit_xml, print_invalid_spec, print_run_error, run_bundle
from ._table import fmt_number, print_table

#: Exit status per verdict (documented in ``--help``), so a CI job can gate on an audit.
EXIT_CODES = {"consistent": 0, "claim_refuted": 3, "inconclusive": 4, "no_dp_claim": 5}

EPILOG = """\
exit status:
  0  consistent with the claim (the audit could have caught a bug and none was found)
  3  claim refuted (the DP alarm fired: a DP bug or a wrong claim)
  4  inconclusive (this audit cannot refute its claim; its design says what would)
  5  no DP claim (noise multiplier 0)
  1  error (the run failed or timed out)
  2  usage (bad arguments or an invalid spec)

Before training the audit design (what this audit can detect) is printed on stderr; the report
on stdout starts with the verdict sentence (--json: the "verdict" object)."""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The epilog as written (the exit-status table) and every option's default."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = _HelpFormatter
    parser.epilog = EPILOG
    parser.add_argument(
        "spec",
        type=Path,
        help='audit spec, TOML or .json: AuditSpec fields, or a record-level spec ("level": '
        '"record": DP-SGD inside the clients, docs/record-level.md)',
    )
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds for the whole run (None: the spec's timeout_seconds)",
    )
    parser.add_argument(
        "--max-supernodes", type=int, default=8, help="virtual SuperNodes for the simulation"
    )
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs Ray may use (None: all)")
    parser.add_argument(
        "--bootstrap",
        type=int,
        default=0,
        help="bootstrap resamples for an interval on epsilon_est",
    )
    parser.add_argument(
        "--stop-on-alarm",
        action="store_true",
        help="end training at the round where the DP alarm fires (sets the spec's stop_on_alarm)",
    )
    parser.add_argument(
        "--evidence",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the audit's evidence bundle (unsigned; check it with "
        "`flaudit verify FILE --allow-unsigned`; docs/evidence.md)",
    )
    parser.add_argument(
        "--junit",
        type=Path,
        default=None,
        metavar="FILE",
        help="write JUnit XML: one test case per claim test, a refuted claim "
        "failing with the verdict sentence",
    )
    parser.add_argument(
        "--inject-bug",
        default=None,
        metavar="BUG[=FACTOR]",
        help="testing only: run with a deliberate DP bug the claim does not know "
        "about: noise_scale=0.5, no_noise, noise_divided_twice, "
        "no_clipping[=4], extra_participation[=4]",
    )


def read_spec_file(path: Path) -> dict:
    """The fields of a spec file: TOML (top level or an ``[audit]`` table) or, for a ``.json``
    file, JSON (ValueError naming the problem)."""
    import tomllib

    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ValueError(f"spec file not found: {path}") from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON: {error}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path} must hold a JSON object")
        return data
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path} is not valid TOML: {error}") from None
    if "audit" in data and isinstance(data["audit"], dict):
        data = data["audit"]
    return data


def load_spec(path: Path):
    """Parse ``path`` into an AuditSpec (ValueError naming the problem)."""
    return AuditSpec.model_validate(read_spec_file(path))


#: Printed under the table when a point estimate exceeds the tightest analytic epsilon.
ABOVE_CLAIM_NOTE = (
    "* above the tightest analytic epsilon ({claim}): a point estimate from Gaussians fitted to "
    "the canaries, not a bound and not a sign of a DP bug (few canaries or unequal fitted "
    "variances inflate it; --bootstrap 200 shows its spread). Only the DP alarm (its claim tests "
    "and the valid lower bounds) can indicate a bug."
)


def _estimate_line(e, note: int, claim: float | None) -> str:
    """One row (at most 85 columns): the method goes to note ``[note]`` under the table."""
    conf = f"{e.confidence:.2f}" if e.confidence is not None else "-"
    above = claim is not None and e.estimator.value == "two_gaussian" and e.epsilon > claim
    value = fmt_number(e.epsilon) + ("*" if above else " ")
    return (
        f"{value:>10} {e.estimator.value:<15} {e.threat_model:<19} "
        f"{e.variance.value:<8} {e.correction.value:<10} {conf:>5}  [{note}]"
    )


def print_estimates(estimates) -> None:
    """The estimator table within 100 columns, its notes (methods) and the above-claim note."""
    analytic = [
        e.epsilon for e in estimates if e.estimator.value == "analytic" and math.isfinite(e.epsilon)
    ]
    claim = min(analytic) if analytic else None
    methods: list[str] = []
    rows = []
    for e in estimates:
        if e.method not in methods:
            methods.append(e.method)
        rows.append(_estimate_line(e, methods.index(e.method) + 1, claim))
    head = (
        f"{'epsilon':>10} {'estimator':<15} {'threat model':<19} {'variance':<8} "
        f"{'correction':<10} {'conf':>5}  note"
    )
    print_table(head, rows)
    for i, method in enumerate(methods, start=1):
        print(textwrap.fill(method, width=100, initial_indent=f"[{i}] ", subsequent_indent="    "))
    if any(line.split()[0].endswith("*") for line in rows):
        print(textwrap.fill(ABOVE_CLAIM_NOTE.format(claim=fmt_number(claim)), width=100))


class AlarmWatch:
    """The round reporter of ``flaudit run``: feeds the in-process
    :class:`~flaudit.server.reporting.LocalRoundReporter` and, after every round, evaluates the
    DP alarm at that look exactly as the service does (the claim tests of the all-iterates and
    known-rounds statistics so far, :func:`flaudit.auditor.claims.alerts.decide`). The first
    error alarm is kept in :attr:`alerts`; with the spec's ``stop_on_alarm`` it sets
    :attr:`stop_reason`, which ends the ServerApp's loop after that round."""

    def __init__(self, spec, inner, *, seen) -> None:
        self.spec = spec
        self.inner = inner
        self.seen = seen
        self.alerts: list[dict] = []
        self.stop_reason: str | None = None
        #: the statistics of the look at which the error alarm first fired during training
        #: (round, max_cosines, known_rounds: the bundle's ``statistics.alarm_statistics``)
        self.alarm_statistics: dict | None = None

    def __repr__(self) -> str:
        return "AlarmWatch(LocalRoundReporter)"

    def report_initial(self, initial_model) -> None:
        self.inner.report_initial(initial_model)

    def report_round(self, server_round: int, update, metadata) -> None:

        self.inner.report_round(server_round, update, metadata)
        if ThreatModel.all_iterates not in self.spec.threat_models:
            return
        tracker, known = self.inner.tracker, self.inner.known_rounds
        summary = summarize(
            AuditLook(
                seen=self.seen,
                dim=tracker.dim,
                delta=self.spec.delta,
                max_cosines=tracker.max_cosines,
                final_cosines=None,
                threat_models=["all_iterates"],
                one_run=False,
                known_rounds_scores=None if known is None else known.scores,
                known_rounds_participations=None if known is None else known.num_participations,
                known_rounds_rounds=None if known is None else known.rounds,
                canary_repeats=self.spec.canary_repeats,
                claims=audit_claims(self.spec),
                num_rounds=server_round,
                scale_dof=tracker.scale_dof,
            )
        )
        alarm = decide(self.spec, summary.claim_tests, look=server_round)
        self.alerts = build_alerts(
            spec=self.spec,
            dim=None,
            rounds_stored=server_round,
            has_final=False,
            alarm=alarm,
            round=server_round,
            previous=self.alerts,
        )
        record = first_alarm(self.alerts)
        if record is not None and record.get("round") == server_round:
            if self.alarm_statistics is None:  # as the service keeps them (live.ingest_round)
                self.alarm_statistics = {
                    "round": server_round,
                    "max_cosines": tracker.max_cosines,
                    "known_rounds": known_rounds_json(None if known is None else known.state()),
                }
        if record is not None and self.spec.stop_on_alarm and self.stop_reason is None:
            self.stop_reason = f"claim refuted at round {record['round']}"

    def report_final(self, final_model, metrics) -> None:
        self.inner.report_final(final_model, metrics)

    def evaluate(self, *, bootstrap: int = 0):
        """After the run: the service's final estimates (with the analytic ones), the alarm at the
        final look, the alerts (the first error alarm kept) and the verdict.

        Returns ``(summary, estimates, alarm, alerts, verdict)``.
        """

        spec, local = self.spec, self.inner
        tracker = local.tracker
        known = local.known_rounds
        scores = None if known is None else known.scores
        counts = None if known is None else known.num_participations
        summary = summarize(
            AuditLook(
                seen=self.seen,
                dim=tracker.dim,
                delta=spec.delta,
                max_cosines=tracker.max_cosines,
                final_cosines=tracker.final_cosines,
                threat_models=[t.value for t in spec.threat_models],
                bootstrap=bootstrap,
                one_run=True,  # the same estimates the service reports
                known_rounds_scores=scores,
                known_rounds_participations=counts,
                known_rounds_rounds=None if known is None else known.rounds,
                canary_repeats=spec.canary_repeats,
                claims=audit_claims(spec),
                num_rounds=tracker.num_rounds,
                scale_dof=tracker.scale_dof,
            )
        )
        estimates = list(summary.estimates) + list(audit_analytic_epsilon(spec))
        # the final look; the per-round looks ran during training, as in the service
        alarm = decide(spec, summary.claim_tests, look=num_looks(spec))
        alerts = build_alerts(
            spec=spec,
            dim=tracker.dim,
            rounds_stored=len(local.rounds),
            has_final=True,
            alarm=alarm,
            previous=self.alerts,
        )
        verdict = spec_verdict(
            spec,
            alarm=first_alarm(alerts),
            estimates=[e.to_dict() for e in estimates],
            state="succeeded",
            rounds_received=len(local.rounds),
            dim=tracker.dim,
        )
        return summary, estimates, alarm, alerts, verdict


def validated_spec(model, data: dict, args: argparse.Namespace, *, what: str):
    """``data`` validated as ``model`` (:class:`AuditSpec` or the record-level spec) with
    ``--inject-bug`` and ``--stop-on-alarm`` applied; None, after printing why on stderr (exit
    status 2), when the spec or the bug is invalid. Shared by both ``flaudit run`` paths."""
    from pydantic import ValidationError

    try:
        spec = model.model_validate(data)
    except ValidationError as error:
        print_invalid_spec(what, error)
        return None
    except ValueError as error:
        print(f"flaudit run: error: {error}", file=sys.stderr)
        return None
    if args.inject_bug is not None:
        try:
            bug = InjectedBug.parse(args.inject_bug)
            spec = model.model_validate({**spec.model_dump(), "inject_bug": bug})
        except ValueError as error:
            print(f"flaudit run: --inject-bug: {error}", file=sys.stderr)
            return None
    if args.stop_on_alarm:
        spec = model.model_validate({**spec.model_dump(), "stop_on_alarm": True})
    return spec


def main(args: argparse.Namespace) -> int:
    import numpy as np

    try:
        data = read_spec_file(args.spec)
    except ValueError as error:
        print(f"flaudit run: error: {error}", file=sys.stderr)
        return 2
    if is_record_level(data):  # DP-SGD inside the clients (issue #37)
        # deferred: the record-level command's accountants load only for a record-level spec
        from .record_run import main as record_main

        return record_main(args, data)
    spec = validated_spec(AuditSpec, data, args, what=f"spec {args.spec}")
    if spec is None:
        return 2

    design = audit_design(spec)
    print(
        textwrap.fill(f"audit design: {design.summary}", width=100, subsequent_indent="  "),
        file=sys.stderr,
    )
    warning = design_warning(spec, design)
    if warning:
        print(
            textwrap.fill(f"WARNING: {warning}", width=100, subsequent_indent="  "), file=sys.stderr
        )

    # deferred: Flower and torch load only once a valid spec is about to train (`flaudit run` on
    # a bad spec answers at once; tests/server/test_run_command.py checks the module stays light)
    from ..server.reporting import LocalRoundReporter
    from ..server.simulation import run_simulation_audit

    seed = new_master_seed()
    commitment = commit(seed)
    started_at = commitment["committed_at"]
    print(f"canary seed commitment: {commitment['commitment']}", file=sys.stderr)
    reporter = AlarmWatch(
        spec,
        LocalRoundReporter.for_audit(
            canary_seed=seed, num_canaries=spec.num_canaries, canary_family=spec.canary_family
        ),
        seen=seen_mask(seed, spec.num_canaries),
    )
    try:
        with RoundProgress(spec.num_rounds, name=f"audit {spec.name!r}") as bar:
            result = run_simulation_audit(
                spec,
                canary_seed=seed,
                reporter=reporter,
                timeout=args.timeout,
                progress=lambda t, total: bar.update(t),
                max_supernodes=args.max_supernodes,
                num_cpus=args.num_cpus,
            )
    except (TimeoutError, ValueError) as error:
        return print_run_error(error)

    summary, estimates, alarm, alerts, verdict = reporter.evaluate(bootstrap=args.bootstrap)
    tracker = reporter.inner.tracker
    mask = seen_mask(seed, spec.num_canaries)
    code = EXIT_CODES[verdict.status.value]
    guarantee = alarm_guarantee(spec)
    bug = bug_label(spec)
    cos = {
        "final_seen_mean": float(np.mean(tracker.final_cosines[mask])) if mask.any() else None,
        "final_unseen_mean": float(np.mean(tracker.final_cosines[~mask]))
        if (~mask).any()
        else None,
        "max_seen_mean": float(np.mean(tracker.max_cosines[mask])) if mask.any() else None,
        "max_unseen_mean": float(np.mean(tracker.max_cosines[~mask])) if (~mask).any() else None,
    }
    if args.evidence is not None:
        args.evidence.write_text(
            json.dumps(
                run_bundle(
                    spec=spec,
                    seed=seed,
                    commitment=commitment,
                    reporter=reporter,
                    summary=summary,
                    estimates=estimates,
                    alerts=alerts,
                    verdict=verdict,
                    bootstrap=args.bootstrap,
                    started_at=started_at,
                ),
                indent=1,
            ),
            encoding="utf-8",
        )
    if args.junit is not None:
        args.junit.write_bytes(
            junit_xml(
                spec=spec,
                summary=summary,
                alerts=alerts,
                verdict=verdict,
                seconds=float(result["seconds"]),
            )
        )
    if args.json:
        out = {
            "verdict": verdict.to_dict(),
            "exit_code": code,
            "spec": spec.model_dump(mode="json"),
            "run": {k: v for k, v in result.items() if k != "rounds"},
            "cosines": cos,
            "estimates": [e.to_dict() for e in estimates],
            "diagnostics": [d.to_dict() for d in summary.diagnostics],
            "alerts": alerts,
            "alarm": alarm.to_dict(),
            "alarm_guarantee": guarantee,
            "bug_injected": bug,
        }
        print(json.dumps(out, indent=2))
        return code

    print(textwrap.fill(verdict.summary, width=100, subsequent_indent="  "))
    metrics = result["metrics"]
    print(
        textwrap.fill(
            f"audit {spec.name!r}: task {spec.task}, d={result['dim']}, T={spec.num_rounds}, "
            f"m={spec.clients_per_round}, z={spec.noise_multiplier:g}, k={spec.num_canaries} canaries "
            f"({int(mask.sum())} seen, repeats {spec.canary_repeats}), {spec.participation.value} "
            f"participation, {result['seconds']:.1f} s",
            width=100,
            subsequent_indent="  ",
        )
    )
    if result.get("stopped_at_round") is not None:
        print(
            f"training stopped at round {result['stopped_at_round']} of {spec.num_rounds}: "
            f"{result['stop_reason']} (stop_on_alarm)"
        )
    print(
        f"final model: accuracy {metrics.get('accuracy', float('nan')):.4f}, "
        f"loss {metrics.get('loss', float('nan')):.4f}; clients dropped: {result['num_failures']}"
    )
    print(
        f"mean cosines, final model: seen {fmt_number(cos['final_seen_mean'])}, unseen "
        f"{fmt_number(cos['final_unseen_mean'])}"
    )
    print(
        f"mean cosines, max over rounds: seen {fmt_number(cos['max_seen_mean'])}, unseen "
        f"{fmt_number(cos['max_unseen_mean'])}"
    )
    print_estimates(estimates)
    print(f"delta = {spec.delta:g} for every row")
    bad = [d for d in summary.diagnostics if not d.ok]
    for d in bad:
        print(textwrap.fill(f"note: {d.name}: {d.hint}", width=100, subsequent_indent="  "))
    if bug:
        print(textwrap.fill(str(bug), width=100, subsequent_indent="  "))
    for alert in alerts:
        print(
            textwrap.fill(
                f"{alert['level'].upper()}: {alert['message']}", width=100, subsequent_indent="  "
            )
        )
    if alarm.status == "ok" and verdict.status.value != "claim_refuted":
        print("DP alarm: none (no claim test rejected)")
    print(textwrap.fill(f"alarm guarantee: {guarantee}", width=100, subsequent_indent="  "))
    print(f"verdict: {verdict.status.value} (exit status {code})")
    return code
