"""Record-level audits fed by a Flower app (issue #37, the service's transport; the routes are
``service/routers/record.py``, the app's client ``server/record_http.py``).

The service holds the canary seed and the seen/unseen split; the app gets, per client and round,
only the plan: row ``s`` the sum of the unit canary directions sampled at the client's DP-SGD
step ``s``, from the same family and the same per-step Poisson streams as the built-in engine
(:class:`flaudit.auditor.estimators.record_level.SeededRecordCanaries` over the client's own
seen canaries, client ``i``'s steps numbered from ``i * STEP_STRIDE`` on and never reused).

What a restart needs is in the database (tables ``flaudit_record_*``): per client the running sum
``U_i`` of its updates, its claim so far (smallest noise multiplier, largest sample rate, every
step), the scale sums of the cause and, per own canary, the sum of the step weights of the steps
it was included at (the numerator of its claimed signal); per round its look and every canary's
score, projections and claimed signal (what ``flaudit verify`` recomputes the looks from). A
round is stored in one transaction guarded by the audit's count of reported rounds: acknowledged means
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

from ..auditor.canaries import OrthogonalCanaries, seen_mask
from ..auditor.claims.record_alarm import record_design
from ..auditor.claims.record_external import (
    record_external_cause,
    record_external_look,
    record_external_signals,
    record_external_verdict,
)
from ..auditor.estimators.record_claim import record_step_weights
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
    bytes_to_array,
    utcnow,
)

__all__ = [
    "MAX_PLAN_VALUES",
    "canary_owner",
    "client_claims",
    "STEP_STRIDE",
    "RecordProblem",
    "canary_plan",
    "create_record_audit",
    "end_record_audit",
    "is_record_audit",
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


def create_record_audit(store, spec: RecordServiceSpec, seed: int) -> Audit:
    """A running record-level audit with the secret canary ``seed`` (drawn by the router, where
    every audit's seed is drawn).

    It is stored as an external audit whose run token is already cleared: the user-level
    attach, silence and lease machinery (which needs a token or an owner) leaves it alone, and
    a restart never fails it (the app, not the service, trains)."""
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
    return audit


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


def canary_owner(spec: RecordServiceSpec) -> np.ndarray:
    """Canary ``j``'s client index: ``j mod num_clients`` (as the built-in engine)."""
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
    seen = seen_mask(seed, spec.num_canaries) & (canary_owner(spec) == index)
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
        "weight_sums": None,  # per own canary (ascending index): sum of w_t at its inclusions
    }


def _signals(spec, states: list[dict[str, Any]]) -> np.ndarray:
    """Every canary's claimed signal from the clients' stored weight sums and claims
    (:func:`record_external_signals`; ``noise_scale_sq`` is the client's ``sum ||w_r||^2`` with
    ``w`` in units of ``lr C / B``)."""
    owner = canary_owner(spec)
    sums = np.zeros(spec.num_canaries)
    for i, state in enumerate(states):
        if state.get("weight_sums") is not None:
            sums[owner == i] = np.asarray(state["weight_sums"], dtype=np.float64)
    squares = np.asarray([float(state["noise_scale_sq"]) for state in states])
    return record_external_signals(sums, squares, owner, client_claims(states))


def client_claims(clients_state: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each client's claim so far (``noise_multiplier``, ``sample_rate``, ``steps``,
    ``rounds_trained``) from its stored state."""
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
    earlier: tuple[np.ndarray, ...] | None = None,
):
    """Every canary's cosine with its client's summed update and its projections in noise
    units (over ``sqrt(sum_r (lr C / B)^2 sum m_t^2)``) and shift units (over
    ``sum_r (lr C / B) q sum_{planned t} m_t``); NaN for canaries of clients never planned.
    Clients without a sum in ``totals`` (not in this round: their sums did not change) keep
    their canaries' entries of ``earlier`` (the last round's arrays)."""
    k = spec.num_canaries
    owner = canary_owner(spec)
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
    seed = store.canary_seed(audit_id)
    seen = seen_mask(seed, spec.num_canaries)
    owner = canary_owner(spec)
    round_clients = []
    for key, index, entry, vector in zip(keys, indices, head.clients, updates, strict=True):
        dp = entry.dp
        plan = plans.get(index)
        planned = 0 if plan is None else int(plan.steps)
        q_plan = 0.0 if plan is None else float(plan.sample_rate)
        # torch.optim.SGD's step weights of the round (restarted every round), in lr C / B
        factors = record_step_weights(int(dp.steps), momentum=float(dp.momentum))
        scale = float(dp.lr) * float(dp.max_grad_norm) / float(dp.expected_batch_size)
        c = states[index]
        c["rounds_trained"] += 1
        c["steps"] += int(dp.steps)
        if planned:  # U_i sums the rounds with canaries: the others only add noise to it
            c["noise_scale_sq"] += scale**2 * float(np.sum(factors**2))
            source = SeededRecordCanaries(seed, seen & (owner == index), sample_rate=q_plan)
            included = source.included_weight_sums(
                index * STEP_STRIDE + int(plan.offset), scale * factors[: min(planned, dp.steps)]
            )[owner == index]
            before = c.get("weight_sums")
            c["weight_sums"] = (included + (0.0 if before is None else np.asarray(before))).tolist()
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
    scores, noise, shift = _score(seed, spec, dim, states, totals, earlier)
    look_number = state.record.rounds_reported + 1
    try:
        signals = _signals(spec, states)
        signals[np.isnan(scores)] = 0.0  # a client whose sum could not be scored: no weight
        look = record_external_look(
            scores,
            seen,
            owner,
            client_claims(states),
            signals=signals,
            dim=dim,
            look=look_number,
            num_looks=spec.num_rounds + 1,
            delta=spec.delta,
        )
    except (ValueError, OverflowError, FloatingPointError) as error:
        raise RecordProblem(
            422, f"the claim cannot be computed for these DP parameters: {error}"
        ) from None
    look["round"] = round
    look["claims"] = client_claims(states)
    cause = state.record.cause
    if cause is None and look["status"] == "error":
        cause = record_external_cause(noise, shift, seen, owner, look)
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
                signals=array_to_bytes(signals),
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
    claims = client_claims([row.state for row in sorted(state.clients.values(), key=_by_index)])
    seed = store.canary_seed(audit_id)
    seen = seen_mask(seed, spec.num_canaries)
    owner = canary_owner(spec)
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
                bytes_to_array(last.signals),
            )
    if units is not None:
        final = record_external_look(
            units[0],
            seen,
            owner,
            claims,
            signals=np.zeros(spec.num_canaries) if units[3] is None else units[3],
            dim=int(state.record.dim),
            look=spec.num_rounds + 1,
            num_looks=spec.num_rounds + 1,
            delta=spec.delta,
        )
        final["round"] = None
        final["claims"] = claims
        looks.append(final)
        if cause is None and final["status"] == "error":
            cause = record_external_cause(units[1], units[2], seen, owner, final)
    design = state.record.design or {
        "claim_epsilon": math.inf,
        "refutable": False,
        "power": 0.0,
        "summary": "no round was reported, so nothing could be designed",
    }
    claim, verdict = record_external_verdict(
        looks, claims, cause=cause, design=design, delta=spec.delta
    )
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
