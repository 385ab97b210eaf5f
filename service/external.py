"""Audits of a run flaudit does not start (``engine = "external"``): the user's own Flower app.

The secret canary seed never leaves the service. The app's :class:`flaudit.server.wrapper.CanaryAuditStrategy`
holds only the audit id, the ingest URL and a run token; it

1. declares its DP claim (``PUT /audits/{id}/claim``), read from the wrapped Flower strategy;
2. reports ``theta_0`` as for any audit (sets ``d``);
3. before aggregating round ``t``, fetches the round's canary vectors
   (``GET /audits/{id}/rounds/{t}/canaries``): the seen canaries that :func:`round_canaries`
   schedules for ``t``, by the same rule as a built-in audit
   (:func:`flaudit.auditor.schedules.canary_schedule`, ``canary_repeats`` rounds each, seeded by
   ``data_seed``);
4. reports ``Delta_t`` and the final model as for any audit.

One run per audit: the wrapper sends a run identity (header :data:`RUN_ID_HEADER`, a random id
per ServerApp process) with every request; the first run to declare its claim owns the audit,
and requests of any other run are refused (409) unless it resumes explicitly
(``PUT .../claim?resume=true``, the same claim), which hands the audit over to it.

The built-in ServerApp on a SuperLink (``engine = "deployment"``, issue #29) never holds the
seed either: it fetches each round's canary sum from the same route (``GET .../canary-sum``,
:func:`round_canary_sum`, by the built-in rule: uncapped), and the service derives the round's
participants itself (:func:`round_participants`), as for an external run.

Who was inserted in round ``t`` is therefore a function of the stored spec and seed
(:func:`round_canaries`, :func:`flaudit.auditor.schedules.audit_canary_plan`), for built-in and
external audits alike: nothing extra is stored.
"""

from __future__ import annotations

import numpy as np

from ..auditor.canaries import Canaries, canary_vectors, resolve_canary_family
from ..auditor.claims.sizing import auto_sizing, spec_cap
from ..auditor.schedules import audit_canary_plan
from ..auditor.spec import AuditSpec

__all__ = [
    "size_to_federation",
    "round_canaries",
    "round_participants",
    "round_canary_vectors",
    "round_canary_sum",
    "attach_environment",
]


def size_to_federation(seed: int, spec: AuditSpec) -> AuditSpec:
    """``spec`` (completed with its claim) with its canaries fitted to the federation:
    ``num_canaries = "auto"`` chosen (:func:`flaudit.auditor.claims.sizing.auto_sizing`,
    ``canary_repeats`` with it), and any number checked against the cohort-slot cap
    (:func:`flaudit.auditor.claims.sizing.max_canaries`).

    Raises
    ------
    ValueError
        The federation cannot hold the canaries (the message says what to change).
    """
    if not spec.sized:
        sizing = auto_sizing(spec)
        if sizing.num_canaries < 2:
            raise ValueError(
                f'num_canaries: "auto" found no room for canaries: the federation has '
                f"{spec.clients_per_round} sampled client(s) per round and {spec.num_rounds} "
                "round(s), and an audit needs at least 2 canaries (seen canaries take cohort "
                "slots); train more rounds or sample more clients per round"
            )
        spec = AuditSpec.model_validate(
            {
                **spec.model_dump(),
                "num_canaries": sizing.num_canaries,
                "canary_repeats": sizing.canary_repeats,
            }
        )
    cap = spec_cap(spec)
    if cap is not None and spec.num_canaries > cap:
        raise ValueError(
            f"num_canaries: {spec.num_canaries} canaries do not fit this federation: seen "
            "canaries take cohort slots and any canary may be seen, so at most "
            f"{spec.clients_per_round} sampled clients per round × "
            f"{spec.num_rounds // spec.canary_repeats} rounds per canary period = {cap} canaries "
            'fit; use num_canaries = "auto" (flaudit attach --canaries auto), at most '
            f"{cap} canaries, more rounds or fewer canary_repeats"
        )
    audit_canary_plan(seed, spec)  # the schedule itself (never refuses within the cap)
    return spec


def round_canaries(seed: int, spec: AuditSpec, t: int) -> np.ndarray:
    """Indices ``j`` of the seen canaries inserted in round ``t`` (1-based), ascending
    (:func:`flaudit.auditor.schedules.audit_canary_plan`: the spec's engine says the rule).

    Raises
    ------
    ValueError
        If ``t`` is not in ``1 .. num_rounds``.
    """
    return audit_canary_plan(seed, spec).seen(t)


def round_participants(seed: int, spec: AuditSpec, t: int) -> np.ndarray:
    """Canary indices "in" round ``t`` for the known-rounds statistic, ascending: the seen
    canaries inserted (:func:`round_canaries`) and the unseen canaries whose rounds, drawn by
    the same rule, include ``t`` -- what the built-in ServerApp reports with each round of a
    simulation audit; the service derives them itself for deployment and external audits.
    """
    return audit_canary_plan(seed, spec).participants(t)


def round_canary_vectors(seed: int, spec: AuditSpec, t: int, dim: int) -> np.ndarray:
    """The unit canary vectors of round ``t``, float32 of shape ``(c, dim)`` (rows ascending j),
    of the audit's canary family (resolved from the spec, ``k`` and ``d`` as the tracker does)."""
    family = resolve_canary_family(spec.canary_family, num_canaries=spec.num_canaries, dim=dim)
    return canary_vectors(seed, round_canaries(seed, spec, t), dim, family=family)


def round_canary_sum(seed: int, spec: AuditSpec, t: int, dim: int) -> tuple[np.ndarray, int]:
    """``(sum of round t's unit canaries, c)``: float32 ``(dim,)`` and the number of canaries.

    What the wrapper needs to insert the round's ``c`` canaries as ``c`` replies of
    ``clip_norm * sum / c`` each (docs/estimators.md, "Canary replies from the round's sum"):
    ``4 d`` bytes on the wire whatever ``c``. One fast transform for the orthogonal family.
    """
    family = resolve_canary_family(spec.canary_family, num_canaries=spec.num_canaries, dim=dim)
    indices = round_canaries(seed, spec, t)
    canaries = Canaries(seed, dim, family=family)
    if canaries._orthogonal is not None:
        total = canaries._orthogonal.sum_of(indices, dtype=np.float32)
    else:
        total = canaries.sum_of(indices).astype(np.float32)
    return total, int(indices.size)


def attach_environment(*, audit_id: str, ingest_url: str, run_token: str) -> dict[str, str]:
    """The environment lines a ServerApp needs to attach (``CanaryAuditStrategy.from_env``)."""
    return {
        "FLAUDIT_AUDIT_ID": audit_id,
        "FLAUDIT_URL": ingest_url.rstrip("/"),
        "FLAUDIT_RUN_TOKEN": run_token,
    }
