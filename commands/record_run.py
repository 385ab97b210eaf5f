"""``flaudit run`` on a record-level spec (``"level": "record"``, issue #37): DP-SGD inside every
client (Opacus, Poisson sampling) audited with record canaries, in the built-in record-level
engine (:mod:`flaudit.server.record_engine`).

The same shape as the user-level run: the audit design before training (stderr), the canary seed
drawn fresh and only its commitment printed, the alarm after every round and at the end
(:func:`flaudit.auditor.claims.record_alarm.decide_record_alarm`), a verdict with its cause and the
exit status of :data:`flaudit.commands.run.EXIT_CODES`. The claim is the record-level epsilon of
the whole run (dp-accounting, Opacus's accountant beside it); the per-round figure a Flower +
Opacus client prints is stated beside it.
"""

from __future__ import annotations

import json
import math
import sys
import textwrap

import numpy as np

from ..auditor.canaries import new_master_seed, seen_mask
from ..auditor.claims.evidence import BUNDLE_FORMAT, jsonable
from ..auditor.claims.record_alarm import RECORD_ALPHA, RecordLooks, record_cause, record_design
from ..auditor.estimators.record_level import record_level_epsilon, record_level_per_round_epsilon
from ..auditor.record_spec import RecordLevelSpec
from ..service.evidence import versions
from ._run_outputs import commit, print_run_error
from .run import validated_spec

__all__ = ["main"]

#: Exit status per verdict (as ``flaudit run``'s).
EXIT_CODES = {"consistent": 0, "claim_refuted": 3, "inconclusive": 4, "no_dp_claim": 5}


def _wrap(text: str, **kwargs) -> str:
    return textwrap.fill(text, width=100, subsequent_indent="  ", **kwargs)


def main(args, data: dict) -> int:
    """Run the record-level audit of ``data`` (the parsed spec file) with ``flaudit run``'s
    ``args``; return the exit status."""
    spec = validated_spec(RecordLevelSpec, data, args, what=f"record-level spec {args.spec}")
    if spec is None:
        return 2
    if getattr(args, "junit", None) is not None:
        print("flaudit run: --junit is not available for record-level audits yet", file=sys.stderr)
        return 2
    if getattr(args, "bootstrap", 0):
        print("flaudit run: --bootstrap is ignored for a record-level audit", file=sys.stderr)

    # deferred: torch and Opacus load only once a valid spec is about to train
    from ..clients.record_canaries import opacus_epsilon
    from ..server.record_engine import record_plan, run_record_audit

    try:
        plan = record_plan(spec)
    except ValueError as error:
        print(f"flaudit run: error: {error}", file=sys.stderr)
        return 2
    q, per_round = plan["sample_rate"], plan["steps_per_round"]
    rounds_max = spec.num_rounds
    steps_max = per_round * rounds_max
    num_looks = spec.num_rounds + 1
    z = spec.noise_multiplier
    design = record_design(
        num_canaries=spec.num_canaries,
        noise_multiplier=z,
        sample_rate=q,
        steps=steps_max,
        delta=spec.delta,
        num_looks=num_looks,
    )
    print(_wrap(f"audit design: {design['summary']}"), file=sys.stderr)
    claim_rows = []
    if z > 0:
        claim_rows = [
            e.to_dict()
            for e in record_level_epsilon(z, q, per_round, spec.delta, rounds_trained=rounds_max)
        ]
        per_round_eps = [
            e.epsilon for e in record_level_per_round_epsilon(z, q, per_round, spec.delta)
        ]
        claim_rows.append(
            {
                "accountant": "opacus_rdp",
                "epsilon": opacus_epsilon(z, q, steps_max, spec.delta),
                "method": f"Opacus's RDPAccountant over {steps_max} steps",
            }
        )

    seed = new_master_seed()
    commitment = commit(seed)
    print(f"canary seed commitment: {commitment['commitment']}", file=sys.stderr)
    seen = seen_mask(seed, spec.num_canaries)
    owners = np.arange(spec.num_canaries) % spec.num_clients  # canary j lives in client j mod N
    judged = RecordLooks(
        seen, owners, noise_multiplier=z, sample_rate=q, num_looks=num_looks, delta=spec.delta
    )
    looks = judged.looks
    observed: list[dict] = []  # per look: the scores and projections (the evidence)
    state: dict = {"last": None}

    def look_at(view, look: int, round_: int | None):
        """The alarm at ``look`` on ``view``'s scores (the first error keeps its cause)."""
        alarm = judged.add(
            round_,
            look,
            cosines=view.scores,
            signals=view.signals,
            dim=view.dim,
            steps=view.steps,
            noise_units=view.noise_units,
            shift_units=view.shift_units,
        )
        observed.append(
            {
                "round": round_,
                "look": look,
                "steps": view.steps,
                "scores": view.scores,
                "signals": view.signals,
                "noise_units": view.noise_units,
                "shift_units": view.shift_units,
            }
        )
        return alarm

    def on_round(view) -> bool:
        state["last"] = view
        alarm = look_at(view, view.round, view.round)
        return alarm.status == "error" and spec.stop_on_alarm

    try:
        result = run_record_audit(spec, canary_seed=seed, on_round=on_round, timeout=args.timeout)
    except (TimeoutError, ValueError) as error:
        return print_run_error(error)

    last = state["last"]
    look_at(last, num_looks, None)
    measured = record_cause(last.noise_units, last.shift_units, seen, noise_multiplier=z)
    run_eps = min(
        (r["epsilon"] for r in claim_rows if r.get("accountant") != "opacus_rdp"),
        default=math.inf,
    )
    verdict = judged.verdict(design=design, run_epsilon=run_eps)
    status, sentence = verdict["status"], verdict["summary"]
    code = EXIT_CODES[status]
    if args.evidence is not None:
        bundle = {
            "format": BUNDLE_FORMAT,
            "level": "record",
            "audit": {"id": None, "name": spec.name, "status": "succeeded", "reason": None},
            "spec": spec.model_dump(mode="json"),
            "claim": claim_rows,
            "design": design,
            "statistics": {
                "dim": result["dim"],
                "num_canaries": spec.num_canaries,
                "sample_rate": q,
                "steps_per_round": per_round,
                "seen": seen,  # the audit has ended: the seen set is no longer secret
                "looks": observed,
            },
            "looks": looks,
            "cause": judged.cause,
            "verdict": verdict,
            "canary_seed": {
                **commitment,
                "salt": commitment["salt"] if spec.reveal_seed else None,
                "seed": str(seed) if spec.reveal_seed else None,
            },
            "versions": versions(),
        }
        args.evidence.write_text(json.dumps(jsonable(bundle), indent=1), encoding="utf-8")
    guarantee = (
        f"If every client's DP-SGD meets its record-level claim, the alarm fires with "
        f"probability at most {RECORD_ALPHA:.0%} over all {num_looks} looks (after every round "
        "and at the end)."
    )
    if args.json:
        out = {
            "verdict": {"status": status, "summary": sentence},
            "exit_code": code,
            "spec": spec.model_dump(mode="json"),
            "run": result,
            "design": design,
            "claim": claim_rows,
            "looks": looks,
            "measured": measured.to_dict(),
            "cause": judged.cause,
            "alarm_guarantee": guarantee,
            "bug_injected": None if spec.inject_bug is None else spec.inject_bug.label,
        }
        print(json.dumps(out, indent=2, default=float))
        return code

    print(_wrap(sentence))
    print(
        _wrap(
            f"audit {spec.name!r} (record level): task {spec.task}, d={result['dim']}, "
            f"{spec.num_clients} clients x {result['examples_per_client']} examples, "
            f"R={spec.num_rounds} rounds, DP-SGD z={z:g}, C={spec.max_grad_norm:g}, "
            f"q={q:.4g}, {per_round} steps per round, momentum {spec.momentum:g}; "
            f"k={spec.num_canaries} record canaries ({int(seen.sum())} seen); "
            f"{result['seconds']:.1f} s"
        )
    )
    if result.get("stopped_at_round") is not None:
        print(f"training stopped at round {result['stopped_at_round']} (stop_on_alarm)")
    metrics = result["metrics"]
    print(
        f"final model: accuracy {metrics.get('accuracy', float('nan')):.4f}, "
        f"loss {metrics.get('loss', float('nan')):.4f}"
    )
    for row in claim_rows:
        print(f"claim: epsilon {row['epsilon']:.4g}  {row['method']}")
    if claim_rows:
        print(
            _wrap(
                f"A Flower + Opacus client that rebuilds its PrivacyEngine every round prints "
                f"the per-round epsilon ({min(per_round_eps):.3g}); the run's record-level "
                f"epsilon over its {rounds_max} rounds is {run_eps:.3g}: the audit tests the "
                "run's."
            )
        )
    print(
        _wrap(
            f"measured from the canaries: noise {measured.noise_ratio:.3f} (+/- "
            f"{measured.noise_ratio_se:.3f}) x the claimed z*C; a seen canary's shift "
            f"{measured.sensitivity_ratio:.3f} (+/- {measured.sensitivity_ratio_se:.3f}) x C per "
            "inclusion"
        )
    )
    for look in looks:
        tests = ", ".join(f"p = {t['p_value']:.3g} (level {t['level']:.2g})" for t in look["tests"])
        where = "final" if look["round"] is None else f"round {look['round']}"
        print(
            f"look {where}: {look['status']}, {look['steps']} steps, claim eps {look['claim_epsilon']:.3g}; {tests}"
        )
    if spec.inject_bug is not None:
        print(
            _wrap(
                f"BUG INJECTED (testing only): {spec.inject_bug.label}: the claim does not know "
                "about it"
            )
        )
    print(_wrap(f"alarm guarantee: {guarantee}"))
    print(f"verdict: {status} (exit status {code})")
    return code
