"""Record-level audits fed by a Flower app (issue #37, the service's transport; the routes are
``service/routers/record.py``, the app's client ``server/record_http.py``).

The service holds the canary seed and the seen/unseen split; the app gets, per client and round,
only the plan: row ``s`` the sum of the unit canary directions sampled at the client's DP-SGD
step ``s``, from the same family and the same per-step Poisson streams as the built-in engine
(:class:`flaudit.auditor.estimators.record_level.SeededRecordCanaries` over the client's own
seen canaries, client ``i``'s steps numbered from ``i * STEP_STRIDE`` on and never reused).

What a restart needs is in the database (tables ``flaudit_record_*``): per client the running sum
``U_i`` of its updates, its claim so far (smallest noise multiplier, largest sample rate, every
step) and the scale sums of the cause; per round its look and every canary's score. A round is
stored in one transaction guarded by the audit's count of reported rounds: acknowledged means
stored, and two reports never both count.

The math is :mod:`flaudit.auditor.claims.record_external` (looks, claim, cause) and
:mod:`flaudit.auditor.claims.record_alarm` (design, verdict).
"""

from __future__ import annotations

import math
import secrets
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import func, select, update

from ..auditor.canaries import OrthogonalCanaries, new_master_seed, seen_mask
from ..auditor.claims.record_alarm import record_design, record_verdict
from ..auditor.claims.record_external import (
    momentum_factors,
    record_external_cause,
    record_external_claim,
    record_external_look,
)
from ..auditor.estimators.record_level import SeededRecordCanaries
from ..auditor.record_spec import RecordServiceSpec
from ..auditor.results import jsonable
from .tables import (
    Audit,
    RecordAudit,
    RecordClient,
    RecordPlan,
    RecordRound,
    array_to_bytes,
    as_utc,
    bytes_to_array,
    utcnow,
)

__all__ = [
    "MAX_PLAN_VALUES",
    "STEP_STRIDE",
    "RecordProblem",
    "canary_plan",
    "create_record_audit",
    "end_record_audit",
    "is_record_audit",
    "record_evidence_body",
    "record_summary",
    "record_view",
    "report_round",
]

#: Steps of the seed's per-step stream reserved per client (as the built-in engine's).
STEP_STRIDE = 10**9
#: Largest plan (steps x d float32 values) one request may ask for: 2^26 values, 256 MiB.
MAX_PLAN_VALUES = 1 << 26
#: Optimizers the record-level test holds for (docs/estimators.md, "Record-level claim test").
SUPPORTED_OPTIMIZER = "SGD"


#: Serializes this process's writes of new clients and plans (a plan's offset is the sum of the
#: client's earlier plans' steps: two plans must never read the same sum). Several replicas
#: need one process per audit (the proxy routes by audit id, docs/deployment.md).
_WRITES = threading.Lock()


class RecordProblem(Exception):
    """A request the audit cannot take: ``status_code`` (409 state, 422 content) and a sentence
    naming the problem."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail


def is_record_audit(audit) -> bool:
    return (audit.spec or {}).get("level") == "record"


def create_record_audit(store, spec: RecordServiceSpec) -> tuple[Audit, int]:
    """A running record-level audit (its fresh secret seed returned for the commitment only).

    It is stored as an external audit whose run token is already cleared: the user-level
    attach, silence and lease machinery (which needs a token or an owner) leaves it alone, and
    a restart never fails it (the app, not the service, trains)."""
    seed = new_master_seed()
    audit = store.create_audit(
        name=spec.name,
        spec=spec.model_dump(mode="json"),
        canary_seed=seed,
        run_token=secrets.token_urlsafe(16),
    )
    store.clear_run_token(audit.id)
    with store.session() as s, s.begin():
        s.add(RecordAudit(audit_id=audit.id, rounds_reported=0, last_round=0, looks=[]))
        s.execute(update(Audit).where(Audit.id == audit.id).values(alerts=[]))
    return audit, seed


@dataclass
class _State:
    audit: Audit
    spec: RecordServiceSpec
    record: RecordAudit
    clients: dict[str, RecordClient]  # by key


def _load(store, audit_id: str) -> _State:
    audit = store.get_audit(audit_id)
    if audit is None or not is_record_audit(audit):
        raise RecordProblem(404, f"no record-level audit {audit_id!r}")
    with store.session() as s:
        record = s.get(RecordAudit, audit_id)
        rows = s.scalars(select(RecordClient).where(RecordClient.audit_id == audit_id)).all()
        for row in rows:
            s.expunge(row)
        if record is not None:
            s.expunge(record)
    if record is None:
        raise RecordProblem(404, f"no record-level audit {audit_id!r}")
    spec = RecordServiceSpec.model_validate(audit.spec)
    return _State(audit, spec, record, {row.client_key: row for row in rows})


def _running(state: _State) -> None:
    if state.audit.status != "running":
        raise RecordProblem(409, f"the audit has ended ({state.audit.status})")


def _owner(spec: RecordServiceSpec) -> np.ndarray:
    return np.arange(spec.num_canaries) % spec.num_clients


def _index_of(state: _State, key: str, new: list[str]) -> int:
    """The client's index: known, or the next free one (``new`` collects keys to add)."""
    if key in state.clients:
        return state.clients[key].client_index
    if key in new:
        return len(state.clients) + new.index(key)
    index = len(state.clients) + len(new)
    if index >= state.spec.num_clients:
        raise RecordProblem(
            422,
            f"client {key!r} would be client number {index + 1}, but the audit was created for "
            f"num_clients = {state.spec.num_clients}",
        )
    new.append(key)
    return index


def _check_dimension(state: _State, dim: int) -> None:
    if state.record.dim is not None and dim != state.record.dim:
        raise RecordProblem(
            422,
            f"dimension {dim} differs from the model's dimension {state.record.dim} this audit "
            "has seen",
        )
    if dim < state.spec.num_canaries:
        raise RecordProblem(
            422,
            f"dimension {dim} is smaller than num_canaries ({state.spec.num_canaries}): record "
            "canaries are an orthogonal family",
        )


def _check_optimizer(client: str, optimizer: str) -> None:
    if SUPPORTED_OPTIMIZER not in optimizer or "Adam" in optimizer:
        raise RecordProblem(
            422,
            f"client {client!r}: optimizer {optimizer!r} is not supported: the record-level "
            "test holds for torch.optim.SGD (plain or with momentum) under Opacus's DPOptimizer "
            "with flat clipping",
        )


def canary_plan(store, audit_id: str, *, client: str, round: int, dimension: int, dp) -> bytes:
    """The plan of ``client`` for ``round`` as little-endian float32 bytes (``dp.steps`` rows of
    ``dimension``); asked again, the same plan. ``dp``: the client's previous reply's DP
    parameters (its ``sample_rate`` and ``steps`` size the plan)."""
    with _WRITES:
        index, offset, steps, rate = _plan_slot(store, audit_id, client, round, dimension, dp)
    seed = store.canary_seed(audit_id)
    spec = RecordServiceSpec.model_validate(store.get_audit(audit_id).spec)
    seen = seen_mask(seed, spec.num_canaries) & (_owner(spec) == index)
    source = SeededRecordCanaries(seed, seen, sample_rate=rate)
    start = index * STEP_STRIDE + offset
    rows = np.empty((steps, dimension), dtype="<f4")
    for step in range(steps):
        rows[step] = source.step_canary_sum(start + step, dimension)
    return rows.tobytes()


def _plan_slot(store, audit_id: str, client: str, round: int, dimension: int, dp):
    """The client's index and its plan's ``(offset, steps, sample_rate)``, stored if new."""
    state = _load(store, audit_id)
    _running(state)
    spec = state.spec
    if round > spec.num_rounds:
        raise RecordProblem(
            422, f"round {round} is past the audit's num_rounds ({spec.num_rounds})"
        )
    if round <= state.record.last_round:
        raise RecordProblem(409, f"round {round} was already reported: no plan for it any more")
    _check_dimension(state, dimension)
    _check_optimizer(client, dp.optimizer)
    if dp.steps * dimension > MAX_PLAN_VALUES:
        raise RecordProblem(
            422,
            f"a plan of {dp.steps} steps x {dimension} values is {dp.steps * dimension} float32 "
            f"values, over the limit of {MAX_PLAN_VALUES} ({MAX_PLAN_VALUES * 4 >> 20} MiB)",
        )
    new: list[str] = []
    index = _index_of(state, client, new)
    with store.session() as s, s.begin():
        for i, key in enumerate(new):
            s.add(
                RecordClient(
                    audit_id=audit_id,
                    client_index=len(state.clients) + i,
                    client_key=key,
                    state=_fresh_client_state(),
                )
            )
        plan = s.get(RecordPlan, (audit_id, index, round))
        if plan is None:
            used = s.scalar(
                select(func.coalesce(func.sum(RecordPlan.steps), 0)).where(
                    RecordPlan.audit_id == audit_id, RecordPlan.client_index == index
                )
            )
            plan = RecordPlan(
                audit_id=audit_id,
                client_index=index,
                round=round,
                offset=int(used),
                steps=int(dp.steps),
                sample_rate=float(dp.sample_rate),
            )
            s.add(plan)
        return index, plan.offset, plan.steps, plan.sample_rate


def _fresh_client_state() -> dict[str, Any]:
    return {
        "rounds_trained": 0,
        "steps": 0,
        "noise_scale_sq": 0.0,
        "shift_scale": 0.0,
        "noise_multiplier": None,
        "sample_rate": None,
        "rounds": [],
    }


def _claims(clients_state: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "noise_multiplier": c["noise_multiplier"],
            "sample_rate": c["sample_rate"],
            "steps": c["steps"],
            "rounds_trained": c["rounds_trained"],
        }
        for c in clients_state
    ]


def _score(
    seed: int,
    spec,
    dim: int,
    states: list[dict],
    totals: list[np.ndarray | None],
    earlier: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
):
    """Every canary's cosine with its client's summed update and its projections in noise
    units (over ``sqrt(sum_r (lr C / B)^2 sum m_t^2)``) and shift units (over
    ``sum_r (lr C / B) q sum_{planned t} m_t``); NaN for canaries of clients never planned.
    Clients without a sum in ``totals`` (not in this round: their sums did not change) keep
    their canaries' entries of ``earlier`` (the last round's arrays)."""
    k = spec.num_canaries
    owner = _owner(spec)
    if earlier is None:
        scores, noise, shift = (np.full(k, np.nan) for _ in range(3))
    else:
        scores, noise, shift = (np.array(a, dtype=np.float64) for a in earlier)
    family = OrthogonalCanaries(seed, dim)
    for i, (state, total) in enumerate(zip(states, totals, strict=True)):
        if total is None or state["shift_scale"] <= 0:
            continue
        norm = float(np.linalg.norm(total))
        if not math.isfinite(norm) or norm == 0:
            continue
        mine = np.flatnonzero(owner == i)
        projection = family.dots(-total, family.positions(mine))
        scores[mine] = projection / norm
        noise[mine] = projection / math.sqrt(state["noise_scale_sq"])
        shift[mine] = projection / state["shift_scale"]
    return scores, noise, shift


def _clean_update(key: str, vector: np.ndarray) -> None:
    if not np.all(np.isfinite(vector)):
        bad = int(np.count_nonzero(~np.isfinite(vector)))
        raise RecordProblem(422, f"client {key!r}: the update has {bad} NaN or infinite value(s)")


def report_round(store, audit_id: str, round: int, head, data: memoryview) -> dict[str, Any]:
    """Store round ``round`` (``head``: the validated JSON head; ``data``: the updates) and run
    its look; a round already stored answers its stored look (``"repeated": true``)."""
    with _WRITES:
        return _report_round(store, audit_id, round, head, data)


def _report_round(store, audit_id: str, round: int, head, data: memoryview) -> dict[str, Any]:
    state = _load(store, audit_id)
    spec = state.spec
    with store.session() as s:
        stored = s.get(RecordRound, (audit_id, round))
        if stored is not None:
            return _round_answer(state.audit, stored.look, round, repeated=True)
    _running(state)
    if round > spec.num_rounds:
        raise RecordProblem(
            422, f"round {round} is past the audit's num_rounds ({spec.num_rounds})"
        )
    if round <= state.record.last_round:
        raise RecordProblem(
            409, f"round {round} comes after round {state.record.last_round} was reported"
        )
    dim = int(head.dimension)
    _check_dimension(state, dim)
    n = len(head.clients)
    expected = n * dim * 4
    if len(data) != expected:
        raise RecordProblem(
            400,
            f"truncated body: {n} client update(s) of dimension {dim} in float32 are {expected} "
            f"bytes after the head, {len(data)} came",
        )
    keys = [c.client for c in head.clients]
    if len(set(keys)) != n:
        raise RecordProblem(422, "a client appears twice in the round's head")
    updates = np.frombuffer(data, dtype="<f4").reshape(n, dim) if n else np.empty((0, dim))
    new: list[str] = []
    indices = []
    for key, entry, vector in zip(keys, head.clients, updates, strict=True):
        _clean_update(key, vector)
        _check_optimizer(key, entry.dp.optimizer)
        indices.append(_index_of(state, key, new))
    num = len(state.clients) + len(new)
    states = [dict(_fresh_client_state()) for _ in range(num)]
    totals: list[np.ndarray | None] = [None] * num
    with store.session() as s:
        for row in s.scalars(select(RecordClient).where(RecordClient.audit_id == audit_id)):
            states[row.client_index] = dict(row.state)
            if row.client_index in indices:  # only this round's sums: O(n d) memory, not O(N d)
                totals[row.client_index] = bytes_to_array(row.totals)
        previous = s.scalars(
            select(RecordRound)
            .where(RecordRound.audit_id == audit_id)
            .order_by(RecordRound.round.desc())
            .limit(1)
        ).first()
        earlier = None
        if previous is not None:
            earlier = tuple(
                bytes_to_array(a)
                for a in (previous.scores, previous.noise_units, previous.shift_units)
            )
        plans = {
            p.client_index: p
            for p in s.scalars(
                select(RecordPlan).where(RecordPlan.audit_id == audit_id, RecordPlan.round == round)
            )
        }
    round_clients = []
    for key, index, entry, vector in zip(keys, indices, head.clients, updates, strict=True):
        dp = entry.dp
        plan = plans.get(index)
        planned = 0 if plan is None else int(plan.steps)
        q_plan = 0.0 if plan is None else float(plan.sample_rate)
        factors = momentum_factors(int(dp.steps), float(dp.momentum))
        scale = float(dp.lr) * float(dp.max_grad_norm) / float(dp.expected_batch_size)
        c = states[index]
        c["rounds_trained"] += 1
        c["steps"] += int(dp.steps)
        if planned:  # U_i sums the rounds with canaries: the others only add noise to it
            c["noise_scale_sq"] += scale**2 * float(np.sum(factors**2))
        c["shift_scale"] += scale * q_plan * float(np.sum(factors[: min(planned, dp.steps)]))
        rates = [float(dp.sample_rate)] + ([q_plan] if plan is not None else [])
        c["noise_multiplier"] = (
            float(dp.noise_multiplier)
            if c["noise_multiplier"] is None
            else min(c["noise_multiplier"], float(dp.noise_multiplier))
        )
        c["sample_rate"] = max(rates + ([c["sample_rate"]] if c["sample_rate"] else []))
        c["rounds"] = [*c["rounds"], {"round": round, "planned_steps": planned, **dp.model_dump()}]
        if planned:
            total = totals[index]
            totals[index] = (np.zeros(dim) if total is None else total) + vector.astype(np.float64)
        round_clients.append(
            {"client": key, "index": index, "planned_steps": planned, "dp": dp.model_dump()}
        )
    seed = store.canary_seed(audit_id)
    seen = seen_mask(seed, spec.num_canaries)
    scores, noise, shift = _score(seed, spec, dim, states, totals, earlier)
    look_number = state.record.rounds_reported + 1
    try:
        look = record_external_look(
            scores,
            seen,
            _owner(spec),
            _claims(states),
            look=look_number,
            num_looks=spec.num_rounds + 1,
            delta=spec.delta,
        )
    except (ValueError, OverflowError, FloatingPointError) as error:
        raise RecordProblem(
            422, f"the claim cannot be computed for these DP parameters: {error}"
        ) from None
    look["round"] = round
    look["claims"] = _claims(states)
    cause = state.record.cause
    if cause is None and look["status"] == "error":
        cause = record_external_cause(noise, shift, seen, _owner(spec), look)
    design = state.record.design
    if design is None and round_clients:
        first = round_clients[0]["dp"]
        design = _design(spec, first)
    with store.session() as s, s.begin():
        changed = s.execute(
            update(RecordAudit)
            .where(
                RecordAudit.audit_id == audit_id,
                RecordAudit.rounds_reported == state.record.rounds_reported,
            )
            .values(
                rounds_reported=look_number,
                last_round=round,
                dim=dim,
                looks=[*(state.record.looks or []), look],
                cause=cause,
                design=design,
            )
        ).rowcount
        if not changed:
            raise RecordProblem(409, "another report changed the audit meanwhile; send it again")
        for index in range(num):
            row = s.get(RecordClient, (audit_id, index))
            if row is None:
                key = new[index - len(state.clients)]
                s.add(
                    RecordClient(
                        audit_id=audit_id,
                        client_index=index,
                        client_key=key,
                        state=jsonable(states[index]),
                        totals=array_to_bytes(totals[index]),
                    )
                )
            elif index in indices:
                row.state = jsonable(states[index])
                if totals[index] is not None:
                    row.totals = array_to_bytes(totals[index])
        s.add(
            RecordRound(
                audit_id=audit_id,
                round=round,
                created_at=utcnow(),
                clients=jsonable(round_clients),
                look=look,
                scores=array_to_bytes(scores),
                noise_units=array_to_bytes(noise),
                shift_units=array_to_bytes(shift),
            )
        )
        s.execute(
            update(Audit)
            .where(Audit.id == audit_id)
            .values(
                dim=dim,
                rounds_stored=look_number,
                last_round_at=utcnow(),
                updated_at=utcnow(),
                started_at=state.audit.started_at or utcnow(),
            )
        )
    answer = _round_answer(state.audit, look, round)
    if cause is not None:
        answer["cause"] = cause
    return answer


def _design(spec: RecordServiceSpec, dp: dict) -> dict[str, Any]:
    """The design line from the first reported client's parameters: its steps per round over
    every round (the first round of each client carries no canaries, so a little optimistic)."""
    inputs = {
        "num_canaries": spec.num_canaries,
        "noise_multiplier": float(dp["noise_multiplier"]),
        "sample_rate": float(dp["sample_rate"]),
        "steps": int(dp["steps"]) * spec.num_rounds,
        "delta": spec.delta,
        "num_looks": spec.num_rounds + 1,
    }
    return jsonable({**record_design(**inputs), "inputs": inputs})


def _round_answer(audit, look: dict, round: int, *, repeated: bool = False) -> dict[str, Any]:
    out = {
        "id": audit.id,
        "status": "running" if audit.status == "running" else audit.status,
        "round": round,
        "look": look["look"],
        "alarm": look["status"],
        "claim_epsilon": look["claim_epsilon"],
        "p_value": min((t["p_value"] for t in look["tests"]), default=1.0),
    }
    if repeated:
        out["repeated"] = True
    return out


def end_record_audit(store, audit_id: str) -> dict[str, Any]:
    """The final look on the last stored scores, the claim over the run, the cause and the
    verdict; the audit ends ``succeeded``. Ended already: the stored verdict."""
    state = _load(store, audit_id)
    if state.audit.status != "running":
        if state.record.verdict is None:
            raise RecordProblem(
                409, f"the audit has ended ({state.audit.status}) without a verdict"
            )
        return _final_answer(state.audit.id, state.record)
    spec = state.spec
    claims = _claims([row.state for row in sorted(state.clients.values(), key=_by_index)])
    seed = store.canary_seed(audit_id)
    seen = seen_mask(seed, spec.num_canaries)
    owner = _owner(spec)
    looks = list(state.record.looks or [])
    cause = state.record.cause
    with store.session() as s:
        last = s.scalars(
            select(RecordRound)
            .where(RecordRound.audit_id == audit_id)
            .order_by(RecordRound.round.desc())
            .limit(1)
        ).first()
        units = None
        if last is not None:
            units = (
                bytes_to_array(last.scores),
                bytes_to_array(last.noise_units),
                bytes_to_array(last.shift_units),
            )
    if units is not None:
        final = record_external_look(
            units[0],
            seen,
            owner,
            claims,
            look=spec.num_rounds + 1,
            num_looks=spec.num_rounds + 1,
            delta=spec.delta,
        )
        final["round"] = None
        final["claims"] = claims
        looks.append(final)
        if cause is None and final["status"] == "error":
            cause = record_external_cause(units[1], units[2], seen, owner, final)
    claim = record_external_claim(claims, delta=spec.delta)
    design = state.record.design or {
        "claim_epsilon": math.inf,
        "refutable": False,
        "power": 0.0,
        "summary": "no round was reported, so nothing could be designed",
    }
    z = [c["noise_multiplier"] for c in claims if c["noise_multiplier"] is not None]
    run_epsilon = claim["epsilon"]
    verdict = record_verdict(
        noise_multiplier=max(z) if z else 0.0,
        looks=looks,
        cause=cause,
        design=design,
        run_epsilon=float(run_epsilon) if isinstance(run_epsilon, float | int) else math.inf,
        delta=spec.delta,
    )
    if not z:
        verdict = {
            "status": "inconclusive",
            "summary": "Inconclusive: no round was reported, so there is nothing to test.",
        }
    with store.session() as s, s.begin():
        s.execute(
            update(RecordAudit)
            .where(RecordAudit.audit_id == audit_id)
            .values(
                looks=jsonable(looks),
                cause=jsonable(cause),
                claim=claim,
                verdict=verdict,
                design=design,
            )
        )
    store.finish(audit_id, status="succeeded", reason=None, only_if=("running",))
    return _final_answer(audit_id, _load(store, audit_id).record)


def _by_index(row: RecordClient) -> int:
    return row.client_index


def _final_answer(audit_id: str, record: RecordAudit) -> dict[str, Any]:
    return {
        "id": audit_id,
        "status": record.verdict["status"],
        "summary": record.verdict["summary"],
        "cause": record.cause,
        "claim": record.claim,
        "looks": len(record.looks or []),
    }


def record_view(store, audit) -> dict[str, Any]:
    """``GET /audits/{id}`` of a record-level audit: level, status, the claim over the run and
    per round, the design line, the looks, the alarm, the verdict with its cause in words; the
    seen/unseen split only once ended, the seed never."""
    with store.session() as s:
        record = s.get(RecordAudit, audit.id)
        rows = s.scalars(
            select(RecordClient)
            .where(RecordClient.audit_id == audit.id)
            .order_by(RecordClient.client_index)
        ).all()
        clients = [
            {"client": r.client_key, "index": r.client_index, **_public_state(r.state)}
            for r in rows
        ]
    spec = RecordServiceSpec.model_validate(audit.spec)
    looks = list(record.looks or []) if record else []
    claim = (record.claim if record else None) or record_external_claim(
        _claims(clients), delta=spec.delta
    )
    alarm = next((look for look in looks if look["status"] == "error"), None)
    return jsonable(
        {
            "id": audit.id,
            "name": audit.name,
            "level": "record",
            "engine": "external",
            "status": audit.status,
            "reason": audit.reason,
            "spec": audit.spec,
            "created_at": _iso(audit.created_at),
            "finished_at": _iso(audit.finished_at),
            "progress": {
                "rounds_reported": record.rounds_reported if record else 0,
                "last_round": record.last_round if record else 0,
                "num_rounds": spec.num_rounds,
            },
            "dim": record.dim if record else None,
            "claim": claim,
            "design": record.design if record else None,
            "looks": [_look_summary(look) for look in looks],
            "alarm": None if alarm is None else _look_summary(alarm),
            "cause": record.cause if record else None,
            "verdict": record.verdict if record else None,
            "clients": clients,
            "links": {"self": f"/audits/{audit.id}"},
        }
    )


def _iso(value) -> str | None:
    value = as_utc(value)
    return None if value is None else value.isoformat()


def _public_state(state: dict) -> dict:
    return {
        "rounds_trained": state.get("rounds_trained", 0),
        "steps": state.get("steps", 0),
        "planned_steps": sum(int(r.get("planned_steps", 0)) for r in state.get("rounds", [])),
        "noise_multiplier": state.get("noise_multiplier"),
        "sample_rate": state.get("sample_rate"),
    }


def _look_summary(look: dict) -> dict:
    return {
        "round": look.get("round"),
        "look": look["look"],
        "status": look["status"],
        "steps": look["steps"],
        "claim_epsilon": look["claim_epsilon"],
        "p_value": min((t["p_value"] for t in look["tests"]), default=1.0),
        "groups": [
            {
                k: g[k]
                for k in ("noise_multiplier", "sample_rate", "steps", "clients", "status")
                if k in g
            }
            for g in look.get("groups", [])
        ],
    }


def record_evidence_body(store, audit) -> dict[str, Any]:
    """The evidence bundle of an ended record-level audit, before its signature
    (:func:`flaudit.auditor.claims.record_evidence.recompute_record` recomputes it): every
    look's scores and projections with the clients' claims at that look, the seen set (the
    audit has ended), the design, claim, looks, cause and verdict. The seed stays secret (its
    commitment is in ``canary_seed``)."""
    spec = RecordServiceSpec.model_validate(audit.spec)
    with store.session() as s:
        record = s.get(RecordAudit, audit.id)
        rows = s.scalars(
            select(RecordRound).where(RecordRound.audit_id == audit.id).order_by(RecordRound.round)
        ).all()
        rounds = [
            {
                "round": r.round,
                "clients": r.clients,
                "scores": bytes_to_array(r.scores),
                "noise_units": bytes_to_array(r.noise_units),
                "shift_units": bytes_to_array(r.shift_units),
            }
            for r in rows
        ]
    seed = store.canary_seed(audit.id)
    return jsonable(
        {
            "level": "record",
            "spec": audit.spec,
            "statistics": {
                "seen": seen_mask(seed, spec.num_canaries),
                "owner": _owner(spec),
                "dim": record.dim,
                "rounds": rounds,
            },
            "design": record.design,
            "claim": record.claim,
            "looks": record.looks or [],
            "cause": record.cause,
            "verdict": record.verdict,
        }
    )


def record_summary(store, audit) -> dict[str, Any]:
    """A record-level audit as the audit list shows it (``AuditSummary``)."""
    with store.session() as s:
        record = s.get(RecordAudit, audit.id)
    verdict = (record.verdict if record else None) or {
        "status": "running",
        "summary": "Record-level audit running: "
        + (
            "the alarm fired."
            if record and any(look["status"] == "error" for look in record.looks or [])
            else "no alarm so far."
        ),
    }
    claim = record.claim if record else None
    epsilon = None if not claim else claim.get("epsilon")
    return {
        "id": audit.id,
        "name": audit.name,
        "status": audit.status,
        "verdict": {
            "status": verdict["status"],
            "summary": verdict["summary"],
            "claim": None if epsilon is None else {"epsilon": epsilon, "delta": claim["delta"]},
            "largest_valid_bound": None,
        },
        "progress": {
            "round": record.last_round if record else 0,
            "num_rounds": int(audit.spec.get("num_rounds", 0)),
            "fraction": (record.last_round if record else 0) / int(audit.spec["num_rounds"]),
            "eta_seconds": None,
            "waiting_for": None,
        },
        "headline_epsilon": None,
        "created_at": _iso(audit.created_at),
    }
