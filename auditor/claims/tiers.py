"""Validity tiers: what a claim test assumes beyond the claim itself."""

from __future__ import annotations

from enum import Enum

__all__ = ["ValidityTier", "AlarmTest"]


class ValidityTier(str, Enum):
    """How much a refutation relies on.

    ``independent_canaries``: normal-score tests (:mod:`flaudit.auditor.claims.normal_scores`).
    Exact for DP-FedAvg with Gaussian noise: the seen canaries' coordinates are independent
    Gaussians around a signal of at most the claimed ``1/z`` (orthogonal canaries, isotropic
    noise), studentized by a noise scale measured where no canary is (the scale they share is
    part of the exact law). They reach the Neyman-Pearson power when that scale rests on many
    coordinates.

    ``assumption_free``: the one-run f-DP guessing game (Mahloujifar et al. 2025) on random
    seen/unseen labels: valid for every mechanism that meets its claim, dependent canaries
    included; less powerful.
    """

    independent_canaries = "independent_canaries"
    assumption_free = "assumption_free"


class AlarmTest(str, Enum):
    """The claim tests the alarm combines (``ClaimTestResult.details["test"]``)."""

    known_rounds_normal_scores = "known_rounds_normal_scores"
    final_model_normal_scores = "final_model_normal_scores"
    known_rounds_fdp_one_run = "known_rounds_fdp_one_run"

    @property
    def tier(self) -> ValidityTier:
        if self is AlarmTest.known_rounds_fdp_one_run:
            return ValidityTier.assumption_free
        return ValidityTier.independent_canaries
