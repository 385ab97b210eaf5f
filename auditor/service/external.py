"""Audits of a run flaudit does not start (``engine = "external"``): the user's own Flower app.

The secret canary seed never leaves the service. The app's :class:`flaudit.server.wrapper.CanaryAuditStrategy`
holds only the audit id, the ingest URL and a run token; it

1. declares its DP claim (``PUT /audits/{id}/claim``), read from the wrapped Flower strategy;
2. reports ``theta_0`` as for any audit (sets ``d``);
3. before aggregating round ``t``, fetches the round's canary vectors
   (``GET /audits/{id}/rounds/{t}/canaries``): the seen canaries that :func:`round_canaries`
   schedules for ``t``, by the same rule as a built-in audit
   (:func:`flaudit.server.schedules.canary_schedule`, ``canary_repeats`` rounds each, seeded by
   ``data_seed``);
4. reports ``Delta_t`` and the final model as for any audit.

One run per audit: the wrapper sends a run identity (header :data:`RUN_ID_HEADER`, a random id
per ServerApp process) with every request; the first run to declare its claim owns the audit,
and requests of any other run are refused (409) unless it resumes explicitly
(``PUT .../claim?resume=true``, the same claim), which hands the audit over to it.

Who was inserted in round ``t`` is therefore a function of the stored spec and seed
(:func:`round_canaries`), for built-in and external audits alike: nothing extra is stored.
"""

from __future__ import annotations

import numpy as np

from flaudit.auditor.canaries import Canaries, canary_vectors, resolve_canary_family, seen_mask
from flaudit.auditor.spec import AuditSpec

from ..claims.sizing import auto_sizing, spec_cap

__all__ = [
    "size_to_federation", "canary_plan", "round_canaries", "round_participants", "round_canary_vectors",
    "round_canary_sum", "attach_environment", "RUN_CONFIG_KEYS", "RUN_ID_HEADER",
]

#: The header that carries a run's identity (not a secret: it names a run, it grants nothing).
RUN_ID_HEADER = "X-Flaudit-Run-Id"

#: The environment variables a ServerApp attaches with, and the equivalent Flower run-config keys
#: (``flwr run --run-config``; declared in the app's ``[tool.flwr.app.config]``). The run token
#: itself never goes in the run config (apps write it to disk): ``FLAUDIT_RUN_TOKEN`` in the
#: environment, or the path of a file holding it.
RUN_CONFIG_KEYS = {
    "FLAUDIT_AUDIT_ID": "flaudit-audit-id",
    "FLAUDIT_URL": "flaudit-ingest-url",
    "FLAUDIT_RUN_TOKEN_FILE": "flaudit-run-token-file",
}


def canary_plan(seed: int, spec: AuditSpec):
    """The audit's :class:`flaudit.server.schedules.CanarySchedule`: the one rule (built-in and
    external audits alike) for which canaries are in each round; seen canaries take cohort slots,
    at most ``clients_per_round`` per round."""
    from flaudit.server.schedules import CanarySchedule

    return CanarySchedule.from_mask(
        seen_mask(seed, spec.num_canaries), num_rounds=spec.num_rounds,
        canary_repeats=spec.canary_repeats, seed=spec.data_seed,
        max_per_round=spec.clients_per_round,
    )


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
                f"num_canaries: \"auto\" found no room for canaries: the federation has "
                f"{spec.clients_per_round} sampled client(s) per round and {spec.num_rounds} "
                "round(s), and an audit needs at least 2 canaries (seen canaries take cohort "
                "slots); train more rounds or sample more clients per round")
        spec = AuditSpec.model_validate({**spec.model_dump(), "num_canaries": sizing.num_canaries,
                                         "canary_repeats": sizing.canary_repeats})
    cap = spec_cap(spec)
    if cap is not None and spec.num_canaries > cap:
        raise ValueError(
            f"num_canaries: {spec.num_canaries} canaries do not fit this federation: seen "
            "canaries take cohort slots and any canary may be seen, so at most "
            f"{spec.clients_per_round} sampled clients per round × "
            f"{spec.num_rounds // spec.canary_repeats} rounds per canary period = {cap} canaries "
            "fit; use num_canaries = \"auto\" (flaudit attach --canaries auto), at most "
            f"{cap} canaries, more rounds or fewer canary_repeats")
    canary_plan(seed, spec)  # the schedule itself (never refuses within the cap)
    return spec


def round_canaries(seed: int, spec: AuditSpec, t: int) -> np.ndarray:
    """Indices ``j`` of the seen canaries inserted in round ``t`` (1-based), ascending
    (:func:`canary_plan`).

    Raises
    ------
    ValueError
        If ``t`` is not in ``1 .. num_rounds``.
    """
    return canary_plan(seed, spec).seen(t)


def round_participants(seed: int, spec: AuditSpec, t: int) -> np.ndarray:
    """Canary indices "in" round ``t`` for the known-rounds statistic, ascending: the seen
    canaries inserted (:func:`round_canaries`) and the unseen canaries whose rounds, drawn by
    the same rule, include ``t`` -- what the built-in ServerApp reports with each round.
    """
    return canary_plan(seed, spec).participants(t)


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
