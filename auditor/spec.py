"""The audit specification: one pydantic model shared by the CLI (`audit.toml`), the REST API
(`POST /audits`) and the Flower ServerApp. Every field is validated here, with the field named in
the error, before any training starts.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "AdaptiveClipping",
    "AuditSpec",
    "Engine",
    "Participation",
    "ThreatModel",
    "MAX_CANARY_FRACTION",
]

#: Seen canaries may be at most this fraction of the client population (real + seen canaries)
#: unless the spec raises ``max_canary_fraction``.
MAX_CANARY_FRACTION = 0.5


class ThreatModel(str, Enum):
    """What the adversary sees: only the final model, or every round's model."""

    final_model = "final_model"
    all_iterates = "all_iterates"


class Participation(str, Enum):
    """How the cohort of round t is chosen (real clients and seen canaries alike)."""

    poisson = "poisson"  # each client independently with probability q
    uniform = "uniform"  # fixed-size uniform sample without replacement
    shuffled = "shuffled"  # shuffled epochs: each client once per epoch, fixed-size cohorts
    batch_then_shuffle = "batch_then_shuffle"  # deliberately wrong (Annamalai et al. 2024)


class Engine(str, Enum):
    simulation = "simulation"  # Flower simulation engine (Ray) in a worker process
    deployment = "deployment"  # a Flower SuperLink with SuperNodes (Deployment Engine)


class AdaptiveClipping(BaseModel):
    """Adaptive clipping by quantile tracking with a noised clipped-count (Andrew et al. 2021)."""

    model_config = ConfigDict(extra="forbid")

    initial_clip_norm: float = Field(0.1, gt=0, description="S(0).")
    target_quantile: float = Field(0.5, gt=0, lt=1, description="Target fraction of unclipped updates.")
    learning_rate: float = Field(0.2, gt=0, description="Geometric update rate of the clip norm.")
    clipped_count_stddev: float | None = Field(
        None,
        gt=0,
        description="Noise std of the clipped count; default clients_per_round/20. It is a "
        "second Gaussian query on each client and is included in the analytic epsilon.",
    )

    def count_stddev(self, clients_per_round: int) -> float:
        """The clipped-count noise std in use: the configured one or ``clients_per_round / 20``."""
        if self.clipped_count_stddev is not None:
            return float(self.clipped_count_stddev)
        return clients_per_round / 20


class AuditSpec(BaseModel):
    """One audit: a DP-FedAvg training run with canary clients, and what to estimate."""

    model_config = ConfigDict(extra="forbid", use_enum_values=False)

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
        description="Options passed to the task factory, e.g. `{\"dim\": 10000}` for `synthetic`.",
    )
    num_rounds: int = Field(20, ge=1, le=100_000, description="Training rounds T.")
    num_clients: int = Field(100, ge=1, le=10_000_000, description="Real clients in the population.")
    clients_per_round: int = Field(
        10,
        ge=1,
        description="Expected cohort size m (real + canaries) used in the noise calibration.",
    )
    participation: Participation = Field(Participation.poisson)
    max_participations: int | None = Field(
        None, ge=1, description="Cap on participations per client over the run (None: no cap)."
    )
    num_canaries: int = Field(100, ge=2, le=1_000_000, description="Canaries k (seen + unseen).")
    canary_repeats: Literal[1, 2, 4, 8] = Field(
        1, description="Rounds each seen canary is presented in (Andrew et al. §5.2)."
    )
    max_canary_fraction: float = Field(
        MAX_CANARY_FRACTION,
        gt=0,
        le=1,
        description="Largest allowed share of seen canaries in the client population.",
    )
    clip_norm: float | None = Field(1.0, gt=0, description="Fixed clip norm S; null with adaptive.")
    adaptive_clipping: AdaptiveClipping | None = None
    noise_multiplier: float = Field(1.0, ge=0, description="z: noise std is z * S(t) on the sum.")
    server_learning_rate: float = Field(1.0, gt=0, description="eta.")
    server_momentum: float = Field(0.0, ge=0, lt=1)
    local_epochs: int = Field(1, ge=1, le=100)
    client_learning_rate: float = Field(0.1, gt=0)
    batch_size: int = Field(32, ge=1)
    delta: float = Field(1e-6, gt=0, lt=1, description="delta for every epsilon reported.")
    threat_models: list[ThreatModel] = Field(
        default_factory=lambda: [ThreatModel.final_model, ThreatModel.all_iterates], min_length=1
    )
    engine: Engine = Engine.simulation
    superlink_address: str | None = Field(
        None, description="host:port of the SuperLink control API (engine = deployment)."
    )
    data_seed: int = Field(0, ge=0, description="Seed for data partitioning and schedules (not secret).")
    timeout_seconds: float = Field(3600, gt=0, le=7 * 24 * 3600)

    @model_validator(mode="after")
    def _check_consistency(self) -> "AuditSpec":
        if (self.clip_norm is None) == (self.adaptive_clipping is None):
            raise ValueError("set exactly one of clip_norm and adaptive_clipping")
        expected_seen = self.num_canaries / 2
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
        return min(1.0, self.clients_per_round / (self.num_clients + self.num_canaries / 2))
