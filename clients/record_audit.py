"""The record-level audit's entry for a Flower + Opacus client that must never break training
(issue #37): every reason the audit cannot read the client's DP-SGD becomes a refusal sentence,
and the client trains on exactly as it would without flaudit.

    optimizer, refusal = try_add_record_canaries(optimizer, canaries)   # flaudit
    if refusal: print(refusal)          # or send it to the server in the round's metrics

Refused, with the optimizer returned untouched:

* Opacus is not installed (this module does not import it at the top; the ``record`` extra,
  ``opacus==1.6.0``);
* an optimizer the cosine statistic does not hold for
  (:data:`flaudit.clients.record_canaries.SUPPORTED` names what is supported);
* secure aggregation (``secure_aggregation=True``: SecAgg+ or any masking of the updates), under
  which the server sees only the cohort's sum and never one client's update.

During training, :class:`FailOpenCanaries` stands between the optimizer and the canary source:
a source that fails (a transport error, a wrong length) stops the canaries from that step on
(zeros are added, which changes nothing) and keeps the error in :attr:`FailOpenCanaries.error`;
the step is never lost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "SECURE_AGGREGATION_REFUSAL",
    "FailOpenCanaries",
    "RecordCanaryAttempt",
    "try_add_record_canaries",
]

#: The refusal under secure aggregation (what can be audited then is said with it).
SECURE_AGGREGATION_REFUSAL = (
    "record-level audit refused: with secure aggregation (SecAgg+) the server only sees the "
    "cohort's masked sum, never one client's update, so record canaries cannot be scored per "
    "client. What can be audited then is the user-level claim of the aggregate (canary "
    "clients, `flaudit run` or the service's external engine), which SecAgg+ leaves intact; "
    "training goes on without record canaries"
)


@dataclass(frozen=True)
class RecordCanaryAttempt:
    """``optimizer`` to train with (the record-canary one, or the original untouched) and
    ``refusal`` (None: the canaries are in; else one sentence saying why not)."""

    optimizer: object
    refusal: str | None

    def __iter__(self):  # optimizer, refusal = try_add_record_canaries(...)
        return iter((self.optimizer, self.refusal))


class FailOpenCanaries:
    """A canary source that never raises into the optimizer: the first failure of ``source``
    (or a sum of the wrong shape or not finite) is kept in :attr:`error` with its step, and
    zeros are returned from then on (the canaries stop; the step goes on)."""

    def __init__(self, source) -> None:
        self.source = source
        self.sample_rate = getattr(source, "sample_rate", None)
        self.error: str | None = None

    def __repr__(self) -> str:
        return f"FailOpenCanaries({self.source!r}, failed={self.error is not None})"

    def step_canary_sum(self, step: int, dim: int) -> np.ndarray:
        if self.error is None:
            try:
                total = np.asarray(self.source.step_canary_sum(step, dim))
                if total.dtype not in (np.float32, np.float64):  # float32 stays float32
                    total = total.astype(np.float64)
                if total.shape != (dim,) or not np.all(np.isfinite(total)):
                    raise ValueError(f"the canary sum has shape {total.shape}, not ({dim},)")
                return total
            except Exception as error:  # fail open: the audit stops, training does not
                self.error = (
                    f"record canaries stopped at step {step}: {type(error).__name__}: {error}"
                )
        return np.zeros(dim, dtype=np.float32)


def try_add_record_canaries(
    optimizer,
    canaries,
    *,
    sample_rate: float | None = None,
    secure_aggregation: bool = False,
) -> RecordCanaryAttempt:
    """:func:`flaudit.clients.record_canaries.add_record_canaries` that never raises for what
    the audit cannot read: the canaries (behind :class:`FailOpenCanaries`) are added where
    they can be, else the optimizer comes back untouched with a refusal sentence."""
    if secure_aggregation:
        return RecordCanaryAttempt(optimizer, SECURE_AGGREGATION_REFUSAL)
    if not callable(getattr(canaries, "step_canary_sum", None)):
        return RecordCanaryAttempt(
            optimizer,
            "record-level audit refused: the canary source has no step_canary_sum(step, dim); "
            "training goes on without record canaries",
        )
    try:
        import opacus  # noqa: F401  (only whether it is there)
    except ImportError as error:
        return RecordCanaryAttempt(
            optimizer,
            f"record-level audit refused: Opacus is not installed ({error}); record canaries "
            "live in Opacus's DPOptimizer (pip install 'opacus==1.6.0', the record extra); "
            "training goes on without them",
        )
    # deferred: Opacus may be absent, which the check above turns into a refusal
    from .record_canaries import UnsupportedOptimizerError, add_record_canaries

    try:
        added = add_record_canaries(optimizer, FailOpenCanaries(canaries), sample_rate=sample_rate)
    except (UnsupportedOptimizerError, TypeError, ValueError) as error:
        return RecordCanaryAttempt(
            optimizer,
            f"record-level audit refused: {error}; training goes on without record canaries",
        )
    return RecordCanaryAttempt(added, None)
