"""Pydantic schemas of the REST API (request bodies, query models, responses).

The request body of ``POST /audits`` is :class:`flaudit.auditor.spec.AuditSpec` itself. Nothing here
has a field for the canary seed or the run token hash: they cannot be serialized by mistake.
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..auditor.spec import AuditSpec

__all__ = [
    "Heartbeat",
    "AuditStatus",
    "Progress",
    "Alert",
    "AuditCreated",
    "RunTokenOut",
    "ClaimAck",
    "AuditOut",
    "AuditSummary",
    "AuditList",
    "RoundOut",
    "RoundList",
    "CanaryStat",
    "CosinesOut",
    "RoundMetadataQuery",
    "FinalMetricsQuery",
    "IngestAck",
    "Health",
]


#: A verdict's status (``VerdictOut.status``, ``VerdictBrief.status``).
VerdictStatus = Literal["claim_refuted", "consistent", "inconclusive", "no_dp_claim", "running"]


class AuditStatus(str, Enum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


_EPS_EXAMPLE = {
    "epsilon": 1.93,
    "estimator": "two_gaussian",
    "threat_model": "final_model",
    "delta": 1e-6,
    "variance": "null",
    "correction": "n/a",
    "confidence": None,
    "method": "epsilon between N(0, 1/d) and N(mu, 1/d) fitted to the seen canaries",
    "details": {"mu": 0.012, "sigma": 0.01},
}


class Progress(BaseModel):
    round: int = Field(description="Rounds received so far (t).", examples=[3])
    num_rounds: int = Field(description="Rounds planned (T).", examples=[20])
    fraction: float = Field(description="t / T.", examples=[0.15])
    eta_seconds: float | None = Field(
        None,
        description="Estimated seconds until the last round: the time per round (the larger of "
        "the median time between rounds since round 1 and the average since round 1 counting "
        "the wait for the next round) for what is left of the round in progress and each round "
        "after it (start-up not counted; null until two rounds arrived).",
        examples=[42.0],
    )
    waiting_for: str | None = Field(
        None,
        description="What the run is waiting for, in words (its start, round t+1's updates with "
        "the wait so far and the earlier rounds' pace, the final model); null in the list and "
        "once ended.",
        examples=[
            (
                "waiting for round 5's updates (62 s so far; rounds 1-4 came 0.1 s apart: "
                "this one is slower)"
            )
        ],
    )


class Alert(BaseModel):
    level: Literal["error", "warning", "info"]
    message: str = Field(examples=["possible DP bug or wrong claim: ..."])
    details: dict[str, Any] | None = Field(
        None,
        description="The error alarm's record: details.alarm = {round (null: the final look), "
        "look, num_looks, refuted_by}. Kept once fired.",
    )


class AuditDesignOut(BaseModel):
    """What an audit can detect, from its spec alone (before any training)."""

    model_config = ConfigDict(extra="allow")

    claim_mu: float | None = Field(description="The claim's Gaussian-DP μ (null: no DP claim).")
    claim_epsilon: float | None = Field(description="The claim's ε at δ.")
    delta: float
    detectable_noise_scale: float | None = Field(
        description="Largest s such that a run whose noise is s × the claimed noise is caught "
        "in at least the design's power of runs."
    )
    detectable_mu: float | None = None
    detectable_epsilon: float | None = None
    max_refutable_mu: float | None = Field(
        description="Largest claim μ this audit can refute, even with perfect separation."
    )
    testable: bool = Field(description="False: this audit cannot refute its own claim.")
    summary: str = Field(
        examples=[
            (
                "catches noise × 0.8 or smaller (ε ≥ 4.1 at δ = 1e-6) in "
                "95% of runs; cannot refute claims above μ = 3.7"
            )
        ]
    )
    advice: str | None = Field(
        None, description="When not testable or weak: what would make it testable."
    )


class VerdictOut(BaseModel):
    """One verdict, the same sentence on the page, in the CLI and here."""

    status: VerdictStatus
    summary: str = Field(description="One sentence; the page and `flaudit run` show it verbatim.")
    claim: dict[str, Any] | None = Field(
        None, description="mu, epsilon, delta, description of the claim tested (null: none)."
    )
    refuted_by: dict[str, Any] | None = Field(
        None,
        description="claim_refuted only: test, name, threat_model, tier, p_value, level, "
        "claim_mu, mu_lo, epsilon_lo, confidence, round.",
    )
    design: dict[str, Any] | None = Field(None, description="The audit design (AuditDesignOut).")
    largest_valid_bound: dict[str, Any] | None = Field(
        None,
        description="The largest valid lower bound reported: estimator, name, threat_model, "
        "mu, epsilon, delta, confidence (the dashboard's measured tile).",
    )
    tier: str | None = Field(
        None,
        description="Validity tier of the refuting test: independent_canaries (exact for "
        "DP-FedAvg with Gaussian noise) or assumption_free (any mechanism meeting the claim).",
    )
    round: int | None = Field(None, description="Round where the alarm fired (null: at the end).")
    cause: Literal["noise", "weighting", "noise_and_weighting", "noise_calibration"] | None = Field(
        None,
        description="claim_refuted only: what breaks the claim. `noise`: a claim test "
        "rejected it at the heaviest influence the canaries carried (the noise falls short for "
        "the weighting used); `weighting`: the recorded weights alone give the heaviest client "
        "more than the claim (weighting.breaks_claim) while the noise passed; "
        "`noise_and_weighting`: both; `noise_calibration`: a round was noised for a smaller "
        "clip norm than its updates were clipped to, so the recorded norms alone break the "
        "claim (noise_calibration) while the canaries' tests of the mechanism actually run "
        "passed.",
        examples=["noise"],
    )
    noise_calibration: dict[str, Any] | None = Field(
        None,
        description="A round noised for a smaller clip norm than its updates were clipped "
        "to (min_noise_clip_factor below 1): min_factor, effective_noise_multiplier, sentence.",
    )
    noise_split: str | None = Field(
        None,
        description="Adaptive clipping: the configured z, the clipped-count noise sigma_b "
        "and the update noise z_delta the canaries meet, in one sentence.",
    )
    weighting: dict[str, Any] | None = Field(
        None,
        description="A weighted FedAvg (largest round weight_factor above 1): "
        "weight_factor, claim_mu, heaviest_mu (= weight_factor × claim_mu, what correct noise "
        "gives the heaviest client), breaks_claim (heaviest_mu above the claim by more than "
        "1%), matters (the same threshold: at or below it nothing is said about the "
        "weighting).",
    )
    gaps: dict[str, Any] | None = Field(
        None, description="Rounds missing: rounds_received, num_rounds, missing_rounds."
    )
    stopped: bool = Field(False, description="Training was stopped on the alarm.")


class AuditCreated(BaseModel):
    id: str = Field(description="URL-safe audit id.", examples=["q3Zr1d0xT4mA"])
    status: AuditStatus = Field(examples=["queued"])
    links: dict[str, str] = Field(examples=[{"self": "/audits/q3Zr1d0xT4mA"}])
    design: AuditDesignOut | None = Field(
        None, description="What this audit can detect (the same as POST /audits/design)."
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="E.g. the audit cannot test its own claim, and what would make it testable "
        "(the audit is accepted all the same).",
    )
    seed_commitment: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="Commitment to the audit's secret canary seed, made now, before any score "
        "exists (also at GET /audits/{id}/commitment and in the evidence bundle; docs/evidence.md).",
    )
    environment: dict[str, str] | None = Field(
        None,
        description=(
            "engine 'external' only, returned once: what your ServerApp needs "
            "(FLAUDIT_AUDIT_ID, FLAUDIT_URL, FLAUDIT_RUN_TOKEN), for "
            "CanaryAuditStrategy.from_env. The run token is stored only as a hash: if it "
            "leaks, rotate it with POST /audits/{id}/run-token. The canary seed never leaves "
            "the service."
        ),
    )


class RunTokenOut(BaseModel):
    """A fresh run token for an external audit (returned once; the previous one is revoked)."""

    id: str
    environment: dict[str, str] = Field(
        description="FLAUDIT_AUDIT_ID, FLAUDIT_URL and the new FLAUDIT_RUN_TOKEN."
    )


class ClaimAck(BaseModel):
    audit_id: str
    stored: bool = Field(description="False when the same claim was already declared (no-op).")
    spec: AuditSpec = Field(description="The audit's spec completed with the claim.")
    rounds_stored: int = Field(
        0, description="Rounds the audit holds already: a resumed run continues after them."
    )
    resumed: bool = Field(False, description="True when this run took the audit over (resume).")
    design: AuditDesignOut | None = Field(
        None,
        description="What the audit can detect with the canaries chosen for this "
        'federation (num_canaries = "auto" is resolved in `spec`); the ServerApp logs its '
        "summary before round 1.",
    )


class Heartbeat(BaseModel):
    """What a run is doing, sent with its heartbeat (every field optional; a heartbeat without a
    body counts as progress now). Ages are seconds before this heartbeat, measured by the run."""

    model_config = ConfigDict(extra="ignore")

    round: int | None = Field(None, ge=0, description="The round the run is in.")
    phase: str | None = Field(None, max_length=40, examples=["training", "reported"])
    progress_age_seconds: float | None = Field(
        None, ge=0, description="Since the run last moved (a round started or was reported)."
    )
    grid_age_seconds: float | None = Field(
        None, ge=0, description="Since the SuperLink last answered the ServerApp."
    )
    round_timeout_seconds: float | None = Field(
        None,
        gt=0,
        description="How long a round may take without a move: the wrapper sends "
        "twice Flower's Strategy.start(timeout=...) (training, then evaluation).",
    )


class HeartbeatAck(BaseModel):
    audit_id: str
    status: str
    silence_limit_seconds: float = Field(
        description="The audit ends when its run shows no sign of progress for this long "
        "(150 s, at most timeout_seconds): rounds, models, and heartbeats as of what they "
        'report (docs/flower.md, "When an audit ends").'
    )


class MissingRound(BaseModel):
    """A round the run trained but could not report (e.g. its buffer was full while the service
    was away): recorded as a gap, so the rounds after it can be stored."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(
        min_length=1, max_length=300, examples=["buffer full while the service was away"]
    )


class AuditOut(BaseModel):
    """Everything known about one audit, as the dashboard polls it."""

    id: str
    name: str
    status: AuditStatus
    reason: str | None = Field(None, description="Why the audit failed or was cancelled.")
    spec: AuditSpec
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    progress: Progress
    dim: int | None = Field(None, description="Model dimension d (after the initial model).")
    estimates: list[dict[str, Any]] = Field(
        description=(
            "Every current estimate (EpsilonResult.to_dict(): epsilon, estimator, threat_model, "
            "delta, variance, correction, confidence, method, details), including the analytic "
            "ones from dp-accounting."
        ),
        examples=[[_EPS_EXAMPLE]],
    )
    diagnostics: list[dict[str, Any]] = Field(
        description="Checks of the estimators' assumptions (name, value, ok, hint, details)."
    )
    alerts: list[Alert]
    verdict: VerdictOut = Field(description="Does the DP claim hold? One sentence and its parts.")
    gaps: list[dict[str, Any]] = Field(
        default_factory=list,
        description=(
            "Rounds the audit lacks, in round order: {round, kind, reason, cost}; kind "
            "'no_canaries' (trained without canaries: the service was unreachable when the "
            "run fetched them) or 'not_reported' (trained but its update never arrived)."
        ),
        examples=[
            [
                {
                    "round": 4,
                    "kind": "no_canaries",
                    "reason": "service unreachable",
                    "cost": "trained without canaries: ...",
                }
            ]
        ],
    )
    alarm_guarantee: str = Field(
        description=(
            "One sentence stating what the DP alarm guarantees (its false-alarm probability over "
            "every look and test it combines), or that the spec makes no DP claim (noise "
            "multiplier 0), so no DP alarm can fire."
        ),
        examples=[
            (
                "If the implementation satisfies its claim, the error alarm fires with "
                "probability at most 5% over all looks ..."
            )
        ],
    )
    tradeoff: dict[str, Any] | None = Field(
        None,
        description=(
            "The f-DP picture (final model): over a grid of false-positive rates `alpha`, the "
            "claimed trade-off curve `claim` (G_mu of the claim), the `mu_lo` curve of the "
            "valid lower bound, and, once the audit has ended (the seen/unseen split is secret "
            "before), the `empirical` curve of the seen canaries' normal scores and its lower "
            "confidence `band` (DKW, simultaneous at `confidence`); also `claim_mu`, "
            "`mu_lo_value`, `mu_lo_from` (the estimate it comes from), `num_seen`, `null`, "
            "`score`, `threat_model`. Curves not available are null."
        ),
    )
    flower_run_id: str | None = Field(
        None,
        description=(
            "The Flower run on the SuperLink (engine 'deployment'), once the SuperLink accepted "
            "it: `flwr log <id>` shows its ServerApp's log. A service restart leaves that run "
            "training and watches it again."
        ),
        examples=["7236461735498436921"],
    )
    owner: str | None = Field(
        None,
        description=(
            "The service replica holding the running audit's lease (FLAUDIT_INSTANCE_ID; null: "
            "none, or ended). Several replicas share one database: docs/deployment.md, "
            "'Replicas'."
        ),
        examples=["flaudit-1:7:3f2a9c1e"],
    )
    owner_changes: list[dict[str, Any]] = Field(
        default_factory=list,
        description=(
            "Takeovers of the running audit by another replica: {at, from, to, after_round, "
            "last_heartbeat_at, why, count}, the last 20; an info alert names what each one "
            "interrupted. Every acknowledged round was committed before its acknowledgement, "
            "so a takeover loses none."
        ),
    )
    max_weight_factor: float | None = Field(
        None,
        description=(
            "The largest round `weight_factor` the run reported (a weighted FedAvg: the heaviest "
            "reply's influence in units of the C/n the noise is calibrated for); null when never "
            "reported (equal weights). Above 1 the claim does not hold for a client that heavy; "
            "the verdict and an alert say so."
        ),
        examples=[3.2],
    )
    min_noise_clip_factor: float | None = Field(
        None,
        description="The smallest round noise_clip_norm / clip_norm reported (null: never "
        "reported). Below 1 some round got less noise than the clip norm of its updates needs "
        "(Flower's adaptive clipping); the verdict's noise_calibration and an alert say which.",
    )
    bug_injected: str | None = Field(
        None,
        description=(
            "'bug injected: <kind>[=<factor>]' when the run had a deliberate DP bug (spec field "
            "inject_bug; testing only, the claim does not know about it); null otherwise."
        ),
        examples=["bug injected: noise_scale=0.5"],
    )
    histograms: dict[str, Any] = Field(
        description=(
            "Per threat model: bin_edges and counts of seen/unseen canaries and the null density. "
            "While the audit runs the seen/unseen counts are merged as 'canaries'."
        )
    )
    metrics: dict[str, Any] = Field(description="Final model metrics, e.g. accuracy, loss.")
    links: dict[str, str]


class VerdictBrief(BaseModel):
    """The verdict as the audit list shows it (the whole verdict: ``GET /audits/{id}``)."""

    status: VerdictStatus
    summary: str = Field(description="The verdict's sentence, as on the audit's page.")
    claim: dict[str, Any] | None = Field(
        None, description="The claim tested (epsilon, delta, mu), as in the whole verdict."
    )
    largest_valid_bound: dict[str, Any] | None = Field(
        None,
        description="The measured valid lower bound, as in the whole verdict: the number "
        "the list shows beside the verdict.",
    )


class AuditSummary(BaseModel):
    id: str
    name: str
    status: AuditStatus
    verdict: VerdictBrief = Field(description="Does the DP claim hold? (status and sentence)")
    progress: Progress
    headline_epsilon: float | None = Field(
        None,
        description=(
            "The two-Gaussian estimate: final model with null variance if available, else the "
            "all-iterates one."
        ),
    )
    created_at: datetime


class AuditList(BaseModel):
    items: list[AuditSummary]
    total: int = Field(description="Audits matching the filter (for paging).")


class RoundOut(BaseModel):
    round: int
    clip_norm: float
    cohort_size: int
    num_canaries_inserted: int | None = Field(
        None, description="Seen canaries inserted this round; null until the audit has ended."
    )
    num_failures: int
    clipped_fraction: float | None = None
    noise_stddev: float | None = None
    train_loss: float | None = None
    accuracy: float | None = None
    update_norm: float | None = Field(
        None,
        description="Euclidean norm of the round's released update rho_bar_t (the vector ingested "
        "for round t: the noisy aggregate before the server optimizer).",
    )
    weight_factor: float | None = Field(
        None,
        description="The round's weight factor as reported (weighted aggregation; null: "
        "not reported, equal weights).",
    )
    noise_clip_norm: float | None = Field(
        None,
        description="The clip norm the round's noise was calibrated for (null: not "
        "reported, taken as clip_norm).",
    )
    noise_clip_factor: float | None = Field(
        None,
        description="noise_clip_norm / clip_norm: below 1 the round was noised for a "
        "smaller clip norm than its updates were clipped to (its effective noise multiplier is "
        "z × this factor).",
    )
    received_at: datetime
    estimates: list[dict[str, Any]] = Field(description="Estimates after this round.")


class RoundList(BaseModel):
    items: list[RoundOut]


class CanaryStat(BaseModel):
    index: int = Field(description="Canary index j.")
    max_cosine: float | None = Field(
        None, description="max over rounds of cos(c_j, Δ_t) (all-iterates statistic)."
    )
    last_cosine: float | None = Field(None, description="cos(c_j, Δ_t) of the latest round.")
    final_cosine: float | None = Field(
        None,
        description="cos(c_j, θ_T − θ_0): the final model's change from the initial model; "
        "the final-model statistic every final-model estimate uses.",
    )
    final_model_cosine: float | None = Field(
        None,
        description="cos(c_j, θ_T), Alg. 2 as literally written (θ_0 not subtracted); "
        "for comparison only, no estimate uses it.",
    )
    seen: bool | None = Field(
        None, description="Whether canary j was inserted; null until the audit has ended."
    )


class CosinesOut(BaseModel):
    audit_id: str
    status: AuditStatus
    dim: int | None
    scale_dof: int | None = Field(
        None,
        description=(
            "Degrees of freedom of the noise scale that the statistics of one release share "
            "(d - k for orthogonal canaries, d for plain cosines): pass it as `scale_dof` of "
            "`flaudit.auditor.claims.AuditLook` to `flaudit.auditor.claims.summarize` to "
            "recompute the exact normal-score tests. Null before the initial model."
        ),
    )
    delta: float
    num_rounds: int = Field(description="Rounds covered by max_cosine.")
    labels_published: bool = Field(description="True once the audit has ended.")
    total: int = Field(description="Number of canaries k.")
    offset: int = Field(description="Index of the first canary in this page.")
    limit: int = Field(description="Page size asked for.")
    items: list[CanaryStat]


#: Largest cohort or client count an ingest request may report (the spec allows 10^7 clients).
MAX_COHORT = 100_000_000


class RoundMetadataQuery(BaseModel):
    """Metadata of round t sent as query parameters with the round's released update."""

    model_config = ConfigDict(extra="ignore")

    clip_norm: float = Field(gt=0, le=1e30, allow_inf_nan=False, description="S(t).")
    cohort_size: int = Field(
        ge=0, le=MAX_COHORT, description="Real clients that returned an update + canaries."
    )
    num_canaries_inserted: int = Field(
        ge=0, le=MAX_COHORT, description="Seen canaries inserted this round."
    )
    num_failures: int = Field(0, ge=0, le=MAX_COHORT, description="Clients dropped this round.")
    clipped_fraction: float | None = Field(
        None, ge=0, le=1, description="Fraction of real client updates that were clipped."
    )
    noise_stddev: float | None = Field(
        None,
        ge=0,
        le=1e30,
        allow_inf_nan=False,
        description="Std of the Gaussian noise on the sum (z*S(t)).",
    )
    train_loss: float | None = Field(
        None, ge=-1e30, le=1e30, allow_inf_nan=False, description="Mean client train loss."
    )
    accuracy: float | None = Field(None, ge=0, le=1, description="Model accuracy after the round.")
    num_participants: int | None = Field(
        None,
        ge=0,
        le=1_000_000,
        description=(
            "Number of canary indices appended to the body as little-endian int32 after the d "
            "float32 values: the round's participants (seen canaries inserted and unseen canaries "
            "whose drawn rounds include t, merged). Omit it on every round of an audit that "
            "reports no participants (then no known-rounds statistic)."
        ),
    )
    weight_factor: float | None = Field(
        None,
        ge=1,
        le=MAX_COHORT,
        allow_inf_nan=False,
        description=(
            "Weighted aggregation (a FedAvg weighting replies by num-examples): the heaviest "
            "reply's weight × replies / total weight, i.e. its influence in units of the C/n the "
            "noise is calibrated for (CanaryAuditStrategy inserts canaries at that weight). "
            "Omit it, or send 1, for equal weights. Above 1 the verdict says the weighting "
            "protects a client that heavy only at weight_factor × the claimed μ."
        ),
    )
    noise_clip_norm: float | None = Field(
        None,
        gt=0,
        le=1e30,
        allow_inf_nan=False,
        description="The clip norm the round's noise was calibrated for (noise std z * "
        "noise_clip_norm on the sum), when it is not clip_norm: Flower's adaptive-clipping "
        "wrappers add the noise for the clip norm after its geometric update. Below clip_norm "
        "the round got less noise than its updates need (effective noise multiplier z * "
        "noise_clip_norm / clip_norm); the verdict and an alert say so. Omit it when equal.",
    )
    canaries_missing: str | None = Field(
        None,
        min_length=1,
        max_length=300,
        description=(
            "Why round t was trained without its canaries (the wrapper could not fetch them: "
            "service unreachable). Requires num_canaries_inserted=0; the round is stored and "
            "listed in the audit's gaps (kind 'no_canaries')."
        ),
    )


class FinalMetricsQuery(BaseModel):
    model_config = ConfigDict(extra="ignore")

    accuracy: float | None = Field(None, ge=0, le=1, description="Accuracy of the final model.")
    loss: float | None = Field(
        None, ge=-1e30, le=1e30, allow_inf_nan=False, description="Loss of the final model."
    )


class IngestAck(BaseModel):
    audit_id: str
    stored: bool = Field(description="False when the same item was already stored (no-op).")
    round: int | None = None
    dim: int | None = None
    alarm: Literal["error"] | None = Field(
        None,
        description="Rounds: 'error' once the DP alarm's error level has fired (the claim is "
        "refuted, with the alarm's confidence over every look); null otherwise.",
    )
    stop: bool = Field(
        False,
        description="Rounds: true when the spec asks to stop on alarm (stop_on_alarm) and the "
        "alarm has fired: end training now and send the final model.",
    )
    stop_reason: str | None = Field(
        None, description="Why to stop, e.g. 'claim refuted at round 3'.", examples=[None]
    )
    alarm_round: int | None = Field(None, description="Rounds: where the alarm fired.")
    alarm_cause: str | None = Field(
        None,
        description="Rounds: what the alarm rejected, in words (the error alert's message, "
        "and the noise calibration when a round was noised for a smaller clip norm).",
    )


class Health(BaseModel):
    status: str = Field(examples=["ok"])
    detail: dict[str, Any] = Field(default_factory=dict)
