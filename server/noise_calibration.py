"""Adaptive clipping, as Flower runs it, seen from outside its DP wrapper (issue #38).

* The split of the noise multiplier (Andrew et al. 2021): the user configures ``z`` and the
  clipped-count noise ``sigma_b``; Flower's adaptive wrappers noise the updates with
  ``z_delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)`` and keep it as ``noise_multiplier``. The canaries
  meet ``z_delta`` only: :func:`configured_noise_multiplier`, :func:`split_sentence`.
* The clip norm the noise is calibrated for: Flower's adaptive wrappers (Message API and legacy,
  server- and client-side) move the clipping norm by its geometric update *before* they add the
  noise, so round ``t`` is noised for ``C_{t+1}`` while its updates were clipped to ``C_t``.
  :class:`NoiseCalibration` records both per round (the wrapper reads the norm before and after
  the DP wrapper aggregates) and warns once per run when a round got less noise than its clip
  norm needs (factor ``C_noise / C_clip < 1``: the effective noise multiplier of that round is
  ``z_delta * C_noise / C_clip``).
* :func:`alarm_line`: the ServerApp log's line when the service's DP alarm fires.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from logging import WARNING
from typing import Any

from flwr.common.logger import log

from ..auditor.noise_calibration import noise_split_sentence as split_sentence
from ..auditor.noise_calibration import shortfall_text

__all__ = [
    "NoiseCalibration",
    "alarm_line",
    "configured_noise_multiplier",
    "effective_noise_multiplier",
    "log_alarm",
    "split_sentence",
    "update_noise_multiplier",
]


def update_noise_multiplier(z: float, sigma_b: float) -> float:
    """``z_delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)``: the update noise multiplier of adaptive
    clipping at configured ``z`` and clipped-count noise ``sigma_b`` (``z < 2 sigma_b``)."""
    if z == 0:
        return 0.0
    if not 0 < z < 2 * sigma_b:
        raise ValueError(
            f"adaptive clipping needs 0 < z < 2 * sigma_b, got z = {z}, sigma_b = {sigma_b}"
        )
    return (z**-2 - (2 * sigma_b) ** -2) ** -0.5


def configured_noise_multiplier(z_delta: float, sigma_b: float) -> float:
    """The ``z`` a user configured, from the update noise ``z_delta`` Flower's adaptive wrappers
    keep and their ``clipped_count_stddev`` ``sigma_b``: ``(z_delta^-2 + (2 sigma_b)^-2)^(-1/2)``."""
    if z_delta == 0 or not sigma_b:
        return float(z_delta)
    return (z_delta**-2 + (2 * sigma_b) ** -2) ** -0.5


class NoiseCalibration:
    """Per round: the clip norm the updates were clipped to and the one the noise was
    calibrated for, and their ratio ``factor[t] = noise_clip_norm / clip_norm``."""

    def __init__(self) -> None:
        self.clip_norms: dict[int, float] = {}
        self.noise_clip_norms: dict[int, float] = {}
        self.factors: dict[int, float] = {}
        self._warned = False

    def record(
        self, server_round: int, clip_norm: float, noise_clip_norm: float, noise_multiplier: float
    ) -> float:
        """Record round ``t``; returns its factor. Below 1 (noised for a smaller norm than the
        updates were clipped to) the ServerApp log says so, once per run."""
        t = int(server_round)
        factor = float(noise_clip_norm) / float(clip_norm)
        self.clip_norms[t], self.noise_clip_norms[t] = float(clip_norm), float(noise_clip_norm)
        self.factors[t] = factor
        if factor < 1 - 1e-9 and not self._warned and noise_multiplier > 0:
            self._warned = True
            log(
                WARNING,
                "flaudit: round %d: the DP wrapper clipped the updates to %.4g but added "
                "the noise for clip norm %.4g (%s x): the round's effective noise multiplier is "
                "%.4g, not %.4g. Flower's adaptive-clipping wrappers update the clip norm before "
                "they add the noise; the audit records the factor of every round (noise_clip_norm). "
                "(Said once per run.)",
                t,
                clip_norm,
                noise_clip_norm,
                shortfall_text(factor),
                noise_multiplier * factor,
                noise_multiplier,
            )
        return factor

    @property
    def min_factor(self) -> float | None:
        return min(self.factors.values()) if self.factors else None


def alarm_line(ack: Mapping[str, Any] | None) -> str | None:
    """The ServerApp log's line for a round acknowledgement whose DP alarm fired (None: no
    alarm): where, and the cause the service names."""
    if not isinstance(ack, Mapping) or ack.get("alarm") != "error":
        return None
    where = ack.get("alarm_round")
    cause = ack.get("alarm_cause") or "the claim tests rejected the claim"
    at = f" at round {where}" if where is not None else ""
    return f"flaudit: the DP alarm fired{at}: {cause}"


def log_alarm(reporter: Any, ack: Mapping[str, Any] | None) -> None:
    """Log :func:`alarm_line` once per run (``reporter.alarm_logged``) and keep the service's
    stop request (``reporter.stop_reason``) when it asks to end training."""
    if not isinstance(ack, Mapping):
        return
    if ack.get("stop"):
        reporter.stop_reason = str(ack.get("stop_reason") or "the DP alarm fired")
    line = alarm_line(ack)
    if line is not None and not getattr(reporter, "alarm_logged", False):
        reporter.alarm_logged = True
        log(WARNING, "%s", line)


def effective_noise_multiplier(noise_multiplier: float, factor: float | None) -> float:
    """``z_delta * C_noise / C_clip``: the noise multiplier a round really had."""
    return float(noise_multiplier) * (
        1.0 if factor is None or not math.isfinite(factor) else float(factor)
    )
