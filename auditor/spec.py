"""The audit specification: one pydantic model shared by the CLI (`audit.toml`), the REST API
(`POST /audits`) and the Flower ServerApp. Every field is validated here, with the field named in
the error, before any training starts.
"""

from __future__ import annotations

import math
import re
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from .bugs import DPBug, InjectedBug
from .canaries import CanaryFamily
from .results import ThreatModel

__all__ = [
    "AUTO_CANARIES",
    "AdaptiveClipping",
    "AuditClaim",
    "AuditSpec",
    "Engine",
    "Participation",
    "ThreatModel",
    "MAX_CANARY_FRACTION",
    "MAX_INTEGER",
    "MAX_MODEL_DIM",
    "BUILTIN_TASK_NAMES",
]

#: ``num_canaries`` of an audit that sizes itself (:mod:`flaudit.auditor.claims.sizing`).
AUTO_CANARIES = "auto"

#: Seen canaries may be at most this fraction of the client population (real + seen canaries)
#: unless the spec raises ``max_canary_fraction``.
MAX_CANARY_FRACTION = 0.5

#: Largest magnitude of any integer in a spec (JavaScript's ``Number.MAX_SAFE_INTEGER``), so every
#: value survives the dashboard and any JSON client unchanged.
MAX_INTEGER = 2**53 - 1
#: Largest model dimension d a built-in task may have: a float32 vector of d values must fit the
#: service's default ingest body limit (1 GiB).
MAX_MODEL_DIM = 2**28
#: ``task_options``: at most this many keys, identifier-like keys, short string values.
MAX_TASK_OPTIONS = 32
MAX_OPTION_STRING = 1000
#: The built-in tasks of ``clients/tasks.py`` (``BUILTIN_TASKS`` there; a test keeps them equal).
BUILTIN_TASK_NAMES = ("synthetic", "digits")

_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_CUSTOM_TASK = re.compile(rf"{_IDENTIFIER}(\.{_IDENTIFIER})*:{_IDENTIFIER}")
_OPTION_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_HOST_PORT = re.compile(
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?):(?P<port>[0-9]{1,5})"
)


def _check_clean(value: Any, where: str) -> None:
    """The rule every spec value obeys: finite floats, integers within :data:`MAX_INTEGER`,
    strings without NUL or lone surrogates (neither can be stored in PostgreSQL or encoded as
    UTF-8), checked through dicts and lists. Nested models check themselves."""
    if value is None or isinstance(value, (bool, Enum, BaseModel)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} must be a finite number, got {value!r}")
    elif isinstance(value, int):
        if abs(value) > MAX_INTEGER:
            raise ValueError(f"{where} must be at most {MAX_INTEGER} in magnitude")
    elif isinstance(value, str):
        if "\x00" in value:
            raise ValueError(f"{where} must not contain NUL characters")
        if any("\ud800" <= ch <= "\udfff" for ch in value):
            raise ValueError(f"{where} must be valid Unicode (it contains a lone surrogate)")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_clean(key, f"{where} key")
            _check_clean(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple, set, frozenset)):
        for index, item in enumerate(value):
            _check_clean(item, f"{where}[{index}]")


class SpecModel(BaseModel):
    """Base of every spec model: unknown fields refused, NaN/Infinity refused at parse time, and
    :func:`_check_clean` applied to every field, including fields added later."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _every_value_clean(cls, value: Any, info: ValidationInfo) -> Any:
        _check_clean(value, info.field_name or "value")
        return value

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """``true``/``false`` or a string (``"5"``) for a number field is refused, not read as
        1/0 or 5; a string the field names itself stays (``num_canaries = "auto"``)."""
        if isinstance(value, (bool, str)) and info.field_name in cls.model_fields:
            kinds = _annotation_kinds(cls.model_fields[info.field_name].annotation)
            if not kinds & {int, float}:
                return value
            if isinstance(value, bool) and bool not in kinds:
                raise ValueError(f"expected a number, got the boolean {str(value).lower()}")
            if isinstance(value, str) and str not in kinds and value not in kinds:
                raise ValueError(f"expected a number, got the string {value[:40]!r}")
        return value


def _annotation_kinds(annotation: Any) -> set:
    """The types of ``annotation`` (``int | None`` -> ``{int}``), None left out."""
    import typing

    args = typing.get_args(annotation)
    if not args:
        return {annotation}
    if typing.get_origin(annotation) is typing.Annotated:
        return _annotation_kinds(args[0])
    return {a for arg in args if arg is not type(None) for a in _annotation_kinds(arg)}


#: Options of the built-in tasks: type and inclusive bounds (floats: exclusive lower bound 0).
_BUILTIN_TASK_OPTIONS: dict[str, dict[str, tuple[type, float, float]]] = {
    "synthetic": {
        "dim": (int, 1, MAX_MODEL_DIM),
        "alpha": (float, 0, 1e6),
        "samples_per_client": (int, 1, 100_000),
        "hidden": (int, 1, MAX_MODEL_DIM),
        "features": (int, 1, 100_000),
        "classes": (int, 2, 10_000),
        "test_size": (int, 1, 1_000_000),
    },
    "digits": {"alpha": (float, 0, 1e6), "hidden": (int, 1, 100_000)},
}


def builtin_model_dim(task: str, options: dict[str, Any]) -> int:
    """Parameters d of the MLP a built-in task builds with ``options`` (as ``clients/tasks.py``)."""
    if task == "digits":
        hidden = int(options.get("hidden", 256))
        return 64 * hidden + hidden + hidden * hidden + hidden + 10 * hidden + 10
    features = int(options.get("features", 32))
    classes = int(options.get("classes", 10))
    hidden = options.get("hidden")
    if hidden is None:
        hidden = max(
            1, round((int(options.get("dim", 10_000)) - classes) / (features + 1 + classes))
        )
    hidden = int(hidden)
    return features * hidden + hidden + hidden * classes + classes


def _check_builtin_options(task: str, options: dict[str, Any]) -> None:
    known = _BUILTIN_TASK_OPTIONS[task]
    for key, value in options.items():
        if key not in known:
            raise ValueError(
                f"task_options.{key} is not an option of task {task!r} (options: {', '.join(known)})"
            )
        kind, low, high = known[key]
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or (kind is int and not isinstance(value, int)):
            raise ValueError(
                f"task_options.{key} must be {'an integer' if kind is int else 'a number'}, got {value!r}"
            )
        if not ((low < value) if kind is float else (low <= value)) or value > high:
            lower = f"> {low}" if kind is float else f">= {low}"
            raise ValueError(f"task_options.{key} must be {lower} and <= {high}, got {value!r}")
    dim = builtin_model_dim(task, options)
    if dim > MAX_MODEL_DIM:
        raise ValueError(
            f"task_options: the model of task {task!r} would have {dim} parameters; the service "
            f"runs at most {MAX_MODEL_DIM}"
        )


class Participation(str, Enum):
    """How the cohort of round t is chosen (real clients and seen canaries alike)."""

    poisson = "poisson"  # each client independently with probability q
    uniform = "uniform"  # fixed-size uniform sample without replacement
    shuffled = "shuffled"  # shuffled epochs: each client once per epoch, fixed-size cohorts
    batch_then_shuffle = "batch_then_shuffle"  # deliberately wrong (Annamalai et al. 2024)


class Engine(str, Enum):
    simulation = "simulation"  # Flower simulation engine (Ray) in a worker process
    deployment = "deployment"  # a Flower SuperLink with SuperNodes (Deployment Engine)
    external = "external"  # the user's own Flower app, started by the user (docs/flower.md)


class AdaptiveClipping(SpecModel):
    """Adaptive clipping by quantile tracking with a noised clipped-count (Andrew et al. 2021)."""

    initial_clip_norm: float = Field(0.1, gt=0, le=1e6, description="S(0).")
    target_quantile: float = Field(
        0.5, gt=0, lt=1, description="Target fraction of unclipped updates."
    )
    learning_rate: float = Field(
        0.2, gt=0, le=10, description="Geometric update rate of the clip norm."
    )
    clipped_count_stddev: float | None = Field(
        None,
        gt=0,
        le=1e9,
        description="Noise std of the clipped count; default clients_per_round/20. It is a "
        "second Gaussian query on each client and is included in the analytic epsilon.",
    )

    def count_stddev(self, clients_per_round: int) -> float:
        """The clipped-count noise std in use: the configured one or ``clients_per_round / 20``."""
        if self.clipped_count_stddev is not None:
            return float(self.clipped_count_stddev)
        return clients_per_round / 20


class AuditSpec(SpecModel):
    """One audit: a DP-FedAvg training run with canary clients, and what to estimate.

    Every field obeys one rule (:class:`SpecModel`): floats finite, integers at most
    :data:`MAX_INTEGER` in magnitude, strings without NUL or lone surrogates, unknown fields
    refused; errors name the field.
    """

    name: str = Field("audit", max_length=200, description="Free-text label.")
    task: str = Field(
        "synthetic",
        min_length=1,
        max_length=200,
        description="Built-in task (`synthetic`, `digits`) or `module.path:factory` for your own.",
        examples=["digits"],
    )
    task_options: dict[str, float | int | str | bool] = Field(
        default_factory=dict,
        description='Options passed to the task factory, e.g. `{"dim": 10000}` for `synthetic`.',
    )
    num_rounds: int = Field(20, ge=1, le=100_000, description="Training rounds T.")
    num_clients: int = Field(
        100, ge=1, le=10_000_000, description="Real clients in the population."
    )
    clients_per_round: int = Field(
        10,
        ge=1,
        le=10_000_000,
        description="Expected cohort size m (real + canaries) used in the noise calibration.",
    )
    participation: Participation = Field(Participation.poisson)
    max_participations: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="Cap on participations per client over the run (None: no cap).",
    )
    num_canaries: int | Literal["auto"] = Field(
        100,
        description="Canaries k (seen + unseen), 2 to 1000000, or `auto` (engine `external`, its "
        "default): chosen when the ServerApp declares its federation, the fewest that make the "
        "claim testable (catch half the claimed noise in 95% of runs) within the cohort-slot cap "
        "k <= clients_per_round * floor(num_rounds / canary_repeats); `auto` chooses "
        'canary_repeats too (docs/estimators.md, "Sizing the audit").',
        examples=[100, "auto"],
    )
    canary_family: CanaryFamily | None = Field(
        None,
        description="How canaries are drawn: `orthogonal` (columns of a secret random sign + DCT "
        "orthogonal transform: no canary-canary interference, all k cosines in one fast transform "
        "per round; needs num_canaries <= d) or `gaussian` (iid uniform on the sphere, Andrew et "
        "al. 2024). null: orthogonal where num_canaries <= d, else gaussian (d is known when the "
        "run starts).",
    )
    canary_repeats: Literal[1, 2, 4, 8] = Field(
        1, description="Rounds each seen canary is presented in (Andrew et al. §5.2)."
    )
    max_canary_fraction: float = Field(
        MAX_CANARY_FRACTION,
        gt=0,
        le=1,
        description="Largest allowed share of seen canaries in the client population "
        "(default 0.5; 1.0 for engine `external`, whose canaries take cohort slots and never "
        "enlarge the population sampled).",
    )
    clip_norm: float | None = Field(
        1.0, gt=0, le=1e6, description="Fixed clip norm S; null with adaptive."
    )
    adaptive_clipping: AdaptiveClipping | None = None
    noise_multiplier: float = Field(
        1.0, ge=0, le=1e6, description="z: noise std is z * S(t) on the sum."
    )
    configured_noise_multiplier: float | None = Field(
        None,
        ge=0,
        le=1e6,
        allow_inf_nan=False,
        description="Adaptive clipping in a user's Flower app: the z the user configured; "
        "noise_multiplier is then the update noise z_delta = (z^-2 - (2 sigma_b)^-2)^(-1/2) "
        "Flower derives from it (what the canaries meet). Null: noise_multiplier as configured.",
    )
    server_learning_rate: float = Field(1.0, gt=0, le=1e3, description="eta.")
    server_momentum: float = Field(0.0, ge=0, lt=1)
    local_epochs: int = Field(1, ge=1, le=100)
    client_learning_rate: float = Field(0.1, gt=0, le=1e3)
    batch_size: int = Field(32, ge=1, le=1_000_000)
    delta: float = Field(1e-6, gt=0, lt=1, description="delta for every epsilon reported.")
    threat_models: list[Literal[ThreatModel.final_model, ThreatModel.all_iterates]] = Field(
        default_factory=lambda: [ThreatModel.final_model, ThreatModel.all_iterates],
        min_length=1,
        description="What the adversary sees: the final model, every round's model, or both.",
    )
    engine: Engine = Engine.simulation
    superlink_address: str | None = Field(
        None, description="host:port of the SuperLink control API (engine = deployment)."
    )
    data_seed: int = Field(
        0,
        ge=0,
        le=MAX_INTEGER,
        description="Seed for data partitioning and schedules (not secret).",
    )
    timeout_seconds: float = Field(3600, gt=0, le=7 * 24 * 3600)
    start_timeout_seconds: float = Field(
        600,
        gt=0,
        le=7 * 24 * 3600,
        description="engine = external: the audit ends failed ('the run never started') when "
        "no Flower run declares its claim this many seconds after the audit's creation.",
    )
    stop_on_alarm: bool = Field(
        False,
        description="End training at the round where the DP alarm's error level fires (the "
        "claim is refuted), so a broken run stops producing a model; the audit records the "
        "round and the reason. Off by default: the run goes on and the alarm is reported.",
    )
    reveal_seed: bool = Field(
        False,
        description="Once the audit has ended, put its canary seed in the evidence bundle "
        "(GET /audits/{id}/evidence), so a verifier checks it against the commitment published "
        "at creation and recomputes the seen/unseen split. Off by default: the seed is never "
        "shown anywhere else (docs/evidence.md).",
    )
    inject_bug: InjectedBug | None = Field(
        None,
        description="Testing only: run DP-FedAvg with this deliberate DP bug, which the claim "
        "(analytic epsilon, alarms) does not know about. The service accepts it only when the "
        "operator sets FLAUDIT_ALLOW_BUG_INJECTION=1.",
    )

    @field_validator("task")
    @classmethod
    def _check_task(cls, task: str) -> str:
        if task not in BUILTIN_TASK_NAMES and not _CUSTOM_TASK.fullmatch(task):
            raise ValueError(
                f"task must be a built-in task ({', '.join(BUILTIN_TASK_NAMES)}) or "
                f"'module.path:factory', got {task!r}"
            )
        return task

    @field_validator("task_options")
    @classmethod
    def _check_task_options(cls, options: dict, info: ValidationInfo) -> dict:
        if len(options) > MAX_TASK_OPTIONS:
            raise ValueError(f"task_options has {len(options)} keys; at most {MAX_TASK_OPTIONS}")
        for key, value in options.items():
            if not _OPTION_KEY.fullmatch(key):
                raise ValueError(
                    f"task_options key {key[:80]!r} must be an identifier of at most 64 characters"
                )
            if isinstance(value, str) and len(value) > MAX_OPTION_STRING:
                raise ValueError(
                    f"task_options.{key} is longer than {MAX_OPTION_STRING} characters"
                )
        task = info.data.get("task")
        if task in BUILTIN_TASK_NAMES:
            _check_builtin_options(task, options)
        return options

    @field_validator("superlink_address")
    @classmethod
    def _check_address(cls, address: str | None) -> str | None:
        if address is None:
            return None
        match = _HOST_PORT.fullmatch(address)
        if match is None or not 1 <= int(match["port"]) <= 65535:
            raise ValueError(
                f"superlink_address must be host:port (port 1-65535), got {address[:100]!r}"
            )
        return address

    @model_validator(mode="before")
    @classmethod
    def _external_defaults(cls, data: Any) -> Any:
        """Bring-your-own audits (engine ``external``) size themselves (``num_canaries =
        "auto"``) and allow seen canaries up to the whole population (they take cohort slots),
        unless the request says otherwise."""
        if isinstance(data, dict) and data.get("engine") in (Engine.external, "external"):
            data = {"num_canaries": AUTO_CANARIES, "max_canary_fraction": 1.0, **data}
        return data

    @field_validator("num_canaries")
    @classmethod
    def _check_num_canaries(cls, value: int | str) -> int | str:
        if value != AUTO_CANARIES and not 2 <= value <= 1_000_000:
            raise ValueError(
                f"num_canaries must be an integer from 2 to 1000000 or "
                f'"{AUTO_CANARIES}", got {value}'
            )
        return value

    @property
    def sized(self) -> bool:
        """Whether ``num_canaries`` is a number (``"auto"`` waits for the federation)."""
        return self.num_canaries != AUTO_CANARIES

    @model_validator(mode="after")
    def _check_consistency(self) -> AuditSpec:
        if not self.sized:
            if self.engine != Engine.external:
                raise ValueError(
                    "num_canaries: \"auto\" sizes a bring-your-own audit (engine 'external') "
                    "when its ServerApp declares the federation; give a number for engine "
                    f"'{self.engine.value}'"
                )
        if (self.clip_norm is None) == (self.adaptive_clipping is None):
            raise ValueError("set exactly one of clip_norm and adaptive_clipping")
        # "auto": the canaries are chosen with the claim, within these limits
        expected_seen = self.num_canaries / 2 if self.sized else 0
        population = self.num_clients + expected_seen
        if self.clients_per_round > population:
            raise ValueError(
                f"clients_per_round ({self.clients_per_round}) is larger than the population "
                f"({self.num_clients} clients + ~{int(expected_seen)} seen canaries)"
            )
        if expected_seen > self.max_canary_fraction * population:
            raise ValueError(
                f"num_canaries: ~{int(expected_seen)} seen canaries exceed max_canary_fraction="
                f"{self.max_canary_fraction} of the population"
            )
        if self.canary_repeats > self.num_rounds:
            raise ValueError(
                f"canary_repeats ({self.canary_repeats}) must not exceed num_rounds ({self.num_rounds})"
            )
        bug = self.inject_bug
        if bug is not None and self.engine == Engine.external:
            raise ValueError(
                "inject_bug: only audits flaudit runs can have a deliberate bug (engine "
                "simulation or deployment), not an external Flower app"
            )
        if bug is not None and bug.kind is DPBug.extra_participation:
            if self.canary_repeats * bug.factor > self.num_rounds:
                raise ValueError(
                    f"inject_bug: extra_participation={bug.factor:g} needs canary_repeats * "
                    f"factor <= num_rounds ({self.num_rounds})"
                )
        if self.engine == Engine.deployment and not self.superlink_address:
            raise ValueError("superlink_address is required when engine is 'deployment'")
        return self

    @property
    def accounted_noise_multiplier(self) -> float:
        """The noise multiplier of the whole round as one Gaussian mechanism.

        With fixed clipping it is ``noise_multiplier``. With adaptive clipping each client also
        contributes a bit (update clipped or not; sensitivity 1) to a count noised with std
        ``sigma_b``, a second Gaussian query; the two compose to a Gaussian mechanism with
        ``z_total = (z^-2 + sigma_b^-2)^(-1/2)`` (Andrew et al. 2021), which is what the
        analytic epsilon must use. ``0`` means no noise (epsilon is infinite).
        """
        z = self.noise_multiplier
        if self.adaptive_clipping is None or z == 0:
            return z
        sigma_b = self.adaptive_clipping.count_stddev(self.clients_per_round)
        return (z**-2 + sigma_b**-2) ** -0.5

    @property
    def sampling_probability(self) -> float:
        """q = m / N with N = real clients + expected seen canaries (Poisson participation)."""
        seen = self.num_canaries / 2 if self.sized else 0
        return min(1.0, self.clients_per_round / (self.num_clients + seen))


class AuditClaim(SpecModel):
    """The DP claim of a run flaudit does not start (``engine = "external"``).

    The user's ServerApp declares it once, read from its Flower DP strategy and run config
    (:class:`flaudit.server.wrapper.CanaryAuditStrategy`), so the analytic epsilon and every alarm use
    the settings the run really has. :meth:`apply` merges it into the audit's spec.
    """

    noise_multiplier: float = Field(
        ge=0, allow_inf_nan=False, description="z of the Flower DP strategy (update noise)."
    )
    configured_noise_multiplier: float | None = Field(
        None,
        ge=0,
        le=1e6,
        allow_inf_nan=False,
        description="Adaptive clipping: the z the user configured; noise_multiplier is the update "
        "noise z_delta = (z^-2 - (2 sigma_b)^-2)^(-1/2) Flower's adaptive wrappers derive from it "
        "with clipped_count_stddev sigma_b (Andrew et al. 2021).",
    )
    clip_norm: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="Fixed clipping norm S; null with adaptive."
    )
    adaptive_clipping: AdaptiveClipping | None = None
    num_rounds: int = Field(ge=1, le=100_000, description="num_rounds given to strategy.start.")
    num_clients: int = Field(ge=1, le=10_000_000, description="SuperNodes (real clients).")
    clients_per_round: int = Field(
        ge=1, description="Nodes sampled per round (num_sampled_clients)."
    )
    participation: Participation = Field(
        Participation.uniform,
        description="How the strategy samples nodes (Flower's FedAvg: uniform without replacement).",
    )
    strategy: str = Field("", max_length=200, description="The wrapped strategy, for the record.")
    num_canaries: int | Literal["auto"] | None = Field(
        None,
        description="Canaries the ServerApp asks for (CanaryAuditStrategy(num_canaries=...)): "
        "a number fixes them for an audit created with `auto`; `auto` or null keeps the audit's "
        "setting. A number that differs from the one the audit fixed is refused.",
    )
    stop_on_alarm: bool | None = Field(
        None,
        description="The wrapper ends training when the DP alarm fires "
        "(CanaryAuditStrategy(stop_on_alarm=True)); null keeps the audit spec's setting.",
    )

    @field_validator("num_canaries")
    @classmethod
    def _check_num_canaries(cls, value: int | str | None) -> int | str | None:
        if value is not None and value != AUTO_CANARIES and not 2 <= value <= 1_000_000:
            raise ValueError(
                f"num_canaries must be an integer from 2 to 1000000 or "
                f'"{AUTO_CANARIES}", got {value}'
            )
        return value

    def apply(self, spec: AuditSpec) -> AuditSpec:
        """``spec`` with the claimed settings (validated again as a whole).

        Raises
        ------
        pydantic.ValidationError
            If the merged spec is inconsistent (e.g. more seen canaries than
            ``max_canary_fraction`` allows for ``num_clients``).
        ValueError
            If the claim asks for a number of canaries other than the one the audit fixed.
        """
        values = spec.model_dump()
        values.update(
            self.model_dump(
                exclude={"strategy", "num_canaries"}
                | ({"stop_on_alarm"} if self.stop_on_alarm is None else set())
            )
        )
        wanted = self.num_canaries
        if wanted not in (None, AUTO_CANARIES) and wanted != spec.num_canaries:
            if spec.sized:
                raise ValueError(
                    f"num_canaries: the ServerApp asks for {wanted} canaries, but the audit was "
                    f"created with {spec.num_canaries}; create the audit with "
                    'num_canaries = "auto" (flaudit attach --canaries auto) to let the app '
                    "choose, or drop num_canaries from CanaryAuditStrategy"
                )
            values["num_canaries"] = wanted
        return AuditSpec.model_validate(values)
