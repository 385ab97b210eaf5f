"""Tests only, never in your app: a planted DP bug, chosen per run with the run-config key
``planted-bug`` (``"short-noise"``), so that a test can check that the audit catches it.

``ShortNoise`` is Flower's ``DifferentialPrivacyServerSideFixedClipping`` that declares its
noise multiplier ``z`` (the audit reads it as the claim) but adds noise ``0.5 z C / n``.
"""

from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping

#: The factor ``ShortNoise`` applies to the noise it adds.
NOISE_FACTOR = 0.5


class ShortNoise(DifferentialPrivacyServerSideFixedClipping):
    """Claims ``noise_multiplier``, adds ``NOISE_FACTOR`` times that noise."""

    def aggregate_train(self, server_round, replies):
        claimed = self.noise_multiplier
        self.noise_multiplier = claimed * NOISE_FACTOR
        try:
            return super().aggregate_train(server_round, replies)
        finally:
            self.noise_multiplier = claimed


def dp_wrapper_class(run_config):
    """Flower's DP wrapper, or ``ShortNoise`` when the run config asks for the planted bug."""
    bug = run_config.get("planted-bug", "")
    if bug == "short-noise":
        return ShortNoise
    if bug:
        raise ValueError(f"unknown planted-bug {bug!r} (known: 'short-noise')")
    return DifferentialPrivacyServerSideFixedClipping
