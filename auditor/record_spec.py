"""The spec of a record-level audit (issue #37): DP-SGD inside every client, audited with record
canaries (``clients/record_canaries.py``), run by ``flaudit run`` in the built-in record-level
engine (``server/record_engine.py``).

A file is a record-level spec when it says ``"level": "record"``; every other field is validated
here (the same hygiene as :class:`flaudit.auditor.spec.AuditSpec`: unknown fields refused, errors
name the field) before any training starts.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from .bugs import DPBug, InjectedBug
from .spec import BUILTIN_TASK_NAMES, SpecModel

__all__ = ["RECORD_BUGS", "RecordLevelSpec", "RecordServiceSpec", "is_record_level"]

#: Deliberate bugs the record-level engine can inject into its clients' DP-SGD (testing only):
#: the optimizer adds ``factor`` times the claimed noise (``noise_scale``), none at all
#: (``no_noise``), or skips per-example clipping while a canary example's gradient has norm
#: ``factor * max_grad_norm`` (``no_clipping``).
RECORD_BUGS = (DPBug.noise_scale, DPBug.no_noise, DPBug.no_clipping)


def is_record_level(data: object) -> bool:
    """Whether a parsed spec file is a record-level spec (``"level": "record"``)."""
    return isinstance(data, dict) and data.get("level") == "record"


class RecordLevelSpec(SpecModel):
    """One record-level audit: FedAvg over clients that each train with Opacus DP-SGD
    (Poisson sampling, flat clipping, SGD) with record canaries added to their clipped gradient
    sums; the claim is the record-level epsilon of the whole run."""

    level: Literal["record"] = Field(description='Always "record": a record-level audit.')
    name: str = Field("record-level audit", max_length=200, description="Free-text label.")
    task: Literal[BUILTIN_TASK_NAMES] = Field(  # type: ignore[valid-type]
        "digits", description="Built-in offline task whose training data the clients split."
    )
    task_options: dict[str, float | int | str | bool] = Field(
        default_factory=dict, description='Options of the task, e.g. {"hidden": 32}.'
    )
    num_rounds: int = Field(5, ge=1, le=1000, description="FedAvg rounds R.")
    num_clients: int = Field(10, ge=1, le=1000, description="Clients; the data is split evenly.")
    clients_per_round: int | None = Field(
        None, ge=1, le=1000, description="Clients sampled per round (null: all of them)."
    )
    num_canaries: int = Field(
        1000,
        ge=2,
        le=1_000_000,
        description="Record canaries k, spread over the clients (canary j lives in client "
        "j mod num_clients); each is seen (sampled at every step like a real example) or never "
        "included, by a fair secret coin. At most the model's dimension.",
    )
    noise_multiplier: float = Field(1.0, ge=0, le=1e6, description="Opacus's z.")
    max_grad_norm: float = Field(1.0, gt=0, le=1e6, description="Opacus's flat clip norm C.")
    batch_size: int = Field(
        16,
        ge=1,
        le=100_000,
        description="Batch size of the client's data loader; Opacus's Poisson rate is "
        "q = 1 / ceil(n / batch_size) for n examples per client.",
    )
    local_epochs: int = Field(1, ge=1, le=100, description="Epochs of DP-SGD per round.")
    learning_rate: float = Field(0.5, gt=0, le=1e3, description="Client SGD learning rate.")
    momentum: float = Field(0.0, ge=0, lt=1, description="Client SGD momentum (0: plain SGD).")
    delta: float = Field(1e-5, gt=0, lt=1, description="delta for every epsilon reported.")
    data_seed: int = Field(0, ge=0, le=2**53 - 1, description="Seed of the data split (public).")
    timeout_seconds: float = Field(600, gt=0, le=7 * 24 * 3600)
    stop_on_alarm: bool = Field(
        False, description="End training at the round where the record-level alarm fires."
    )
    reveal_seed: bool = Field(
        False,
        description="Put the canary seed (and its commitment's salt) in the evidence bundle, "
        "so a verifier checks the seen set against the commitment printed before training.",
    )
    inject_bug: InjectedBug | None = Field(
        None,
        description="Testing only: a deliberate DP bug in the clients' DP-SGD that the claim "
        "does not know about: " + ", ".join(b.value for b in RECORD_BUGS) + ".",
    )

    @field_validator("inject_bug")
    @classmethod
    def _check_bug(cls, bug: InjectedBug | None) -> InjectedBug | None:
        if bug is not None and bug.kind not in RECORD_BUGS:
            raise ValueError(
                f"{bug.kind.value} cannot be injected into a record-level audit; choose one of "
                + ", ".join(b.value for b in RECORD_BUGS)
            )
        return bug

    @model_validator(mode="after")
    def _check_consistency(self) -> RecordLevelSpec:
        if self.clients_per_round is not None and self.clients_per_round > self.num_clients:
            raise ValueError(
                f"clients_per_round ({self.clients_per_round}) is larger than num_clients "
                f"({self.num_clients})"
            )
        return self

    @property
    def cohort_size(self) -> int:
        """Clients trained per round."""
        return self.num_clients if self.clients_per_round is None else self.clients_per_round


class RecordServiceSpec(SpecModel):
    """A record-level audit in the service (issue #37), fed by the user's own Flower app: the
    service trains nothing, the app's strategy wrapper asks for each client's canary plan and
    reports every round's updates with each client's DP parameters (``server/record_http.py``).
    The claim is composed from what every client reports, client by client."""

    level: Literal["record"] = Field(description='Always "record": a record-level audit.')
    engine: Literal["external"] = Field(
        "external",
        description='Always "external": a Flower app feeds the audit (the built-in record-level '
        "engine runs in `flaudit run`, not in the service).",
    )
    name: str = Field("record-level audit", max_length=200, description="Free-text label.")
    num_rounds: int = Field(..., ge=1, le=1000, description="Rounds the app trains.")
    num_clients: int = Field(
        ...,
        ge=1,
        le=1000,
        description="Clients the app has; the service numbers them 0..num_clients-1 in order of "
        "first appearance and refuses one more.",
    )
    num_canaries: int = Field(
        1000,
        ge=2,
        le=1_000_000,
        description="Record canaries k (canary j lives in client j mod num_clients); each is "
        "seen or never included by a fair secret coin. At most the model's dimension.",
    )
    delta: float = Field(1e-5, gt=0, lt=1, description="delta for every epsilon reported.")

    @model_validator(mode="before")
    @classmethod
    def _engine_only(cls, data: object) -> object:
        if isinstance(data, dict):
            builtin = sorted(set(data) & {"task", "batch_size", "noise_multiplier", "inject_bug"})
            if builtin:
                raise ValueError(
                    f"{', '.join(builtin)}: the service runs a record-level audit only as "
                    '"engine": "external" (your Flower app trains and reports its own DP '
                    "parameters); the built-in record-level engine runs with `flaudit run`"
                )
        return data
