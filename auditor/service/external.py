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

Who was inserted in round ``t`` is therefore a function of the stored spec and seed
(:func:`round_canaries`), for built-in and external audits alike: nothing extra is stored.
"""

from __future__ import annotations

import numpy as np

from flaudit.auditor.canaries import Canaries, canary_vectors, resolve_canary_family, seen_mask
from flaudit.auditor.spec import AuditSpec

__all__ = [
    "round_canaries", "round_participants", "round_canary_vectors", "round_canary_sum",
    "attach_environment",
    "RUN_CONFIG_KEYS",
]

#: The environment variables a ServerApp attaches with, and the equivalent Flower run-config keys
#: (``flwr run --run-config``; declared in the app's ``[tool.flwr.app.config]``).
RUN_CONFIG_KEYS = {
    "FLAUDIT_AUDIT_ID": "flaudit-audit-id",
    "FLAUDIT_URL": "flaudit-ingest-url",
    "FLAUDIT_RUN_TOKEN": "flaudit-run-token",
}


def round_canaries(seed: int, spec: AuditSpec, t: int) -> np.ndarray:
    """Indices ``j`` of the seen canaries inserted in round ``t`` (1-based), ascending.

    The same rule as the built-in ServerApp: the seen set from the secret seed, each seen canary
    in ``canary_repeats`` rounds (one per period) drawn from ``data_seed``.

    Raises
    ------
    ValueError
        If ``t`` is not in ``1 .. num_rounds``.
    """
    from flaudit.server.schedules import canary_schedule

    if not 1 <= t <= spec.num_rounds:
        raise ValueError(f"round must be in 1..{spec.num_rounds}, got {t}")
    seen = np.flatnonzero(seen_mask(seed, spec.num_canaries))
    positions = canary_schedule(
        int(seen.size),
        num_rounds=spec.num_rounds,
        canary_repeats=spec.canary_repeats,
        seed=spec.data_seed,
    )[t - 1]
    return np.sort(seen[positions])


def round_participants(seed: int, spec: AuditSpec, t: int) -> np.ndarray:
    """Canary indices "in" round ``t`` for the known-rounds statistic, ascending: the seen
    canaries inserted (:func:`round_canaries`) and the unseen canaries whose rounds, drawn by
    the same rule (:func:`flaudit.server.schedules.unseen_canary_rounds`), include ``t`` -- what the
    built-in ServerApp reports with each round.
    """
    from flaudit.server.schedules import unseen_canary_rounds

    unseen = np.flatnonzero(~seen_mask(seed, spec.num_canaries))
    rounds = unseen_canary_rounds(int(unseen.size), num_rounds=spec.num_rounds,
                                  repeats=spec.canary_repeats, seed=spec.data_seed)
    virtual = unseen[np.any(rounds == t - 1, axis=1)]
    return np.sort(np.concatenate([round_canaries(seed, spec, t), virtual]))


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
