"""The audit service's engines, as its worker processes run them (``service/runner.py`` starts
``"module:function"`` names from :mod:`flaudit.protocol.wire` in a spawned process, so the service
itself never imports Flower code).

``simulation_worker`` trains in Flower's simulation engine; ``deployment_worker`` submits the
audit's ServerApp to a SuperLink and watches it. Both report rounds to the service over HTTP
(:class:`.http_reporter.HttpRoundReporter` -> ingest routes): one data path.
"""

from __future__ import annotations

from ..auditor.spec import AuditSpec
from .deployment import deployment_worker as run_on_superlink
from .http_reporter import HttpRoundReporter
from .simulation import run_simulation_audit

__all__ = ["simulation_worker", "deployment_worker"]


def simulation_worker(payload: dict) -> None:
    """Run one audit in Flower's simulation engine, reporting rounds to the service over HTTP."""
    spec = AuditSpec.model_validate(payload["spec"])
    reporter = HttpRoundReporter(payload["base_url"], payload["audit_id"], payload["token"])
    run_simulation_audit(
        spec,
        canary_seed=int(payload["seed"]),
        reporter=reporter,
        timeout=float(payload["timeout"]),
        progress=None,
    )


def deployment_worker(payload: dict) -> None:
    """Run one audit on a Flower SuperLink (deployment engine) from the worker process.

    Delegates to :func:`.deployment.deployment_worker`: it submits the run with the run token and
    the number of seen canaries (never the seed: issue #29) in a private run-config file, watches
    it, and turns SIGTERM (what the runner sends first on cancel or timeout) into a stop request
    on the SuperLink (``flwr stop``) within the runner's grace period. Its errors name the Flower
    run and the SuperLink's reason, with the seed and the run token redacted.
    """
    run_on_superlink(payload)
