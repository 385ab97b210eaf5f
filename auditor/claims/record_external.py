"""The record-level look of an audit fed by a Flower app (issue #37, the service's transport):
clients that may each run DP-SGD with their OWN parameters (Flower's ``examples/opacus`` gives
even partitions noise 1.0 and odd ones 1.5).

Every client's claim is the Poisson-subsampled Gaussian composed over every step of every round it
trained (:func:`flaudit.auditor.claims.record_alarm.record_claim`), at its smallest noise
multiplier and largest sample rate over those rounds (the curve is monotone in both, so this one
is valid for every round). Clients with the same ``(z, q)`` form a group, tested as the built-in
engine tests its one group: the exact claim test of :func:`decide_record_alarm` on the group's
canaries, each with its claimed signal (:func:`record_external_signals`: the service draws every
plan, so it knows the steps each seen canary was included at, and each client-round's step
weights are :func:`flaudit.auditor.estimators.record_claim.record_step_weights` of the client's
reported steps and momentum, times its ``lr C / B``). Each look's level is split evenly over the
groups it tests, so by the union bound over groups and looks a run that meets its claims alarms
with probability at most ``alpha``. The run's record-level epsilon is the largest of the groups'
(a record lives in one client).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..estimators.record_level import record_level_epsilon, record_level_per_round_epsilon
from ..results import jsonable
from .record_alarm import (
    RECORD_ALPHA,
    decide_record_alarm,
    record_cause,
    record_signals,
    record_verdict,
)

__all__ = [
    "record_external_claim",
    "record_external_cause",
    "record_external_look",
    "record_external_noise_multiplier",
    "record_external_signals",
    "record_external_verdict",
    "record_groups",
]


def record_groups(clients: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The clients that trained (``steps > 0``) grouped by their claim's ``(noise_multiplier,
    sample_rate)``: ``[{noise_multiplier, sample_rate, steps (the most in the group),
    clients (indices)}]`` in order of the first client of each group."""
    groups: dict[tuple[float, float], dict[str, Any]] = {}
    for index, client in enumerate(clients):
        if int(client.get("steps") or 0) <= 0:
            continue
        key = (float(client["noise_multiplier"]), float(client["sample_rate"]))
        group = groups.setdefault(
            key,
            {"noise_multiplier": key[0], "sample_rate": key[1], "steps": 0, "clients": []},
        )
        group["steps"] = max(group["steps"], int(client["steps"]))
        group["clients"].append(index)
    return list(groups.values())


def record_external_signals(
    weight_sums, weight_square_sums, owner, clients: list[dict[str, Any]]
) -> np.ndarray:
    """Every canary's claimed signal in its client's summed update
    (:func:`flaudit.auditor.claims.record_alarm.record_signals` at its client's claimed noise
    multiplier; 0 for the canaries of clients without a claim or with ``z = 0``).

    ``weight_sums[j]``: the sum of the step weights (in units of ``lr C / B``) over the steps
    canary ``j`` was included at; ``weight_square_sums[i]``: client ``i``'s ``sum ||w_r||^2``
    over the rounds its summed update holds; ``clients[i]``: client ``i``'s claim."""
    owner = np.asarray(owner, dtype=np.int64).reshape(-1)
    sums = np.asarray(weight_sums, dtype=np.float64).reshape(-1)
    squares = np.asarray(weight_square_sums, dtype=np.float64).reshape(-1)
    out = np.zeros(owner.size)
    for index, client in enumerate(clients):
        z = client.get("noise_multiplier")
        if z is None or not float(z) > 0:
            continue
        mine = owner == index
        out[mine] = record_signals(sums[mine], squares, owner[mine], noise_multiplier=float(z))
    return out


def record_external_look(
    scores,
    seen_mask,
    owner,
    clients: list[dict[str, Any]],
    *,
    signals,
    dim: int,
    look: int,
    num_looks: int,
    delta: float,
    alpha: float = RECORD_ALPHA,
) -> dict[str, Any]:
    """One look: every group's :func:`decide_record_alarm` at ``alpha / groups``.

    ``scores``: one per canary (NaN: not scored); ``owner[j]``: canary ``j``'s client index;
    ``clients[i]``: client ``i``'s claim (``noise_multiplier``, ``sample_rate``, ``steps``);
    ``signals``: one per canary (:func:`record_external_signals`); ``dim``: the model's
    dimension.
    Returns the look as :meth:`RecordAlarm.to_dict` (``status`` ``error`` / ``ok`` /
    ``no_dp_claim``; ``claim_epsilon`` and ``steps`` of the first rejecting group, else the
    run's) with ``groups`` added (each with its ``claim_epsilon``, ``status``, ``p_value``)."""
    scores = np.asarray(scores, dtype=np.float64)
    seen = np.asarray(seen_mask, dtype=bool)
    owner = np.asarray(owner, dtype=np.int64)
    signals = np.asarray(signals, dtype=np.float64)
    groups = record_groups(clients)
    share = float(alpha) / max(1, len(groups))
    tests, rejected, out_groups = [], [], []
    first_rejecting = None
    for g, group in enumerate(groups):
        mask = np.isin(owner, group["clients"])
        alarm = decide_record_alarm(
            scores[mask],
            seen[mask],
            signals=signals[mask],
            owners=owner[mask],
            dim=int(dim),
            noise_multiplier=group["noise_multiplier"],
            sample_rate=group["sample_rate"],
            steps=group["steps"],
            look=look,
            num_looks=num_looks,
            delta=delta,
            alpha=share,
        )
        for test in alarm.tests:
            test["group"] = g
        tests += alarm.tests
        rejected += [dict(test, group=g) for test in alarm.rejected]
        if alarm.rejected and first_rejecting is None:
            first_rejecting = (group, alarm)
        out_groups.append(
            {
                **group,
                "claim_epsilon": alarm.claim_epsilon,
                "status": alarm.status,
                "p_value": min((t["p_value"] for t in alarm.tests), default=1.0),
            }
        )
    claimed = [g for g in out_groups if g["status"] != "no_dp_claim"]
    if rejected:
        status = "error"
    elif groups and not claimed:
        status = "no_dp_claim"
    else:
        status = "ok"
    if first_rejecting is not None:
        epsilon, steps = first_rejecting[1].claim_epsilon, first_rejecting[0]["steps"]
    else:
        epsilon = max((g["claim_epsilon"] for g in out_groups), default=math.nan)
        steps = max((g["steps"] for g in out_groups), default=0)
    return jsonable(
        {
            "status": status,
            "look": int(look),
            "num_looks": int(num_looks),
            "steps": int(steps),
            "claim_epsilon": epsilon,
            "tests": tests,
            "rejected": rejected,
            "groups": out_groups,
        }
    )


def record_external_noise_multiplier(
    looks: list[dict[str, Any]], clients: list[dict[str, Any]]
) -> float:
    """The noise multiplier the verdict names: that of the first group that rejected (the claim
    refuted), else the largest claimed (0.0: no claim)."""
    for look in looks:
        if look.get("rejected"):
            return float(look["groups"][look["rejected"][0]["group"]]["noise_multiplier"])
    z = [float(c["noise_multiplier"]) for c in clients if c.get("noise_multiplier") is not None]
    return max(z, default=0.0)


def record_external_cause(
    noise_units, shift_units, seen_mask, owner, look: dict[str, Any]
) -> dict[str, Any] | None:
    """The cause (:func:`record_cause`) measured on the canaries of the first group that
    rejected at ``look`` (None when nothing rejected). ``noise_units`` are in units of each
    canary's claimed noise scale without ``z`` (``(lr / B) C sqrt(sum m_t^2)``), so the group's
    ``z`` turns them into the ratio to the claimed ``z C``."""
    if not look.get("rejected"):
        return None
    group = look["groups"][look["rejected"][0]["group"]]
    mask = np.isin(np.asarray(owner), group["clients"])
    cause = record_cause(
        np.asarray(noise_units, dtype=np.float64)[mask],
        np.asarray(shift_units, dtype=np.float64)[mask],
        np.asarray(seen_mask, dtype=bool)[mask],
        noise_multiplier=group["noise_multiplier"],
    ).to_dict()
    cause["clients"] = list(group["clients"])
    return cause


def record_external_claim(
    clients: list[dict[str, Any]], *, delta: float, accountant: str = "pld"
) -> dict[str, Any]:
    """The claim over the run, client by client: each group's epsilon over its most steps
    (dp-accounting ``accountant``) and per round (the figure a per-round PrivacyEngine, as
    Flower's ``examples/opacus`` rebuilds, prints), and the run's (the largest)."""
    groups = []
    for group in record_groups(clients):
        z, q, steps = group["noise_multiplier"], group["sample_rate"], group["steps"]
        members = [clients[i] for i in group["clients"]]
        rounds = max(int(c.get("rounds_trained") or 1) for c in members)
        per_round = max(1, round(steps / rounds))
        if z == 0:
            run_eps = round_eps = math.inf
        else:
            run = record_level_epsilon(z, q, [steps], delta, accountants=(accountant,))
            one = record_level_per_round_epsilon(z, q, per_round, delta, accountants=(accountant,))
            run_eps, round_eps = float(run[0].epsilon), float(one[0].epsilon)
        groups.append(
            {
                **group,
                "rounds_trained": rounds,
                "steps_per_round": per_round,
                "epsilon": run_eps,
                "epsilon_per_round": round_eps,
            }
        )
    return jsonable(
        {
            "accountant": accountant,
            "delta": float(delta),
            "epsilon": max((g["epsilon"] for g in groups), default=math.nan),
            "epsilon_per_round": max((g["epsilon_per_round"] for g in groups), default=math.nan),
            "groups": groups,
        }
    )


def record_external_verdict(
    looks: list[dict[str, Any]],
    clients: list[dict[str, Any]],
    *,
    cause: dict[str, Any] | None,
    design: dict[str, Any],
    delta: float,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run's claim (:func:`record_external_claim` of the final ``clients``) and its verdict
    from the ``looks``: inconclusive when no client reported a noise multiplier. The service's
    end of an audit and ``flaudit verify`` both call this, so the two cannot drift apart."""
    claim = record_external_claim(clients, delta=delta)
    if not any(c.get("noise_multiplier") is not None for c in clients):
        verdict = {
            "status": "inconclusive",
            "summary": "Inconclusive: no round was reported, so there is nothing to test.",
        }
        return claim, verdict
    epsilon = claim["epsilon"]
    verdict = record_verdict(
        noise_multiplier=record_external_noise_multiplier(looks, clients),
        looks=looks,
        cause=cause,
        design=design,
        run_epsilon=float(epsilon) if isinstance(epsilon, float | int) else math.inf,
        delta=delta,
    )
    return claim, verdict
