"""Names on the wire between the audit service and a ServerApp (docs/architecture.md).

Everything here is a constant both sides agree on: the Flower run-config keys, the environment
variables of an attached run, the run-identity header and the worker entry points of the
service's engines. Secrets never appear here, only the names under which they travel.
"""

from __future__ import annotations

__all__ = [
    "RUN_ID_HEADER",
    "RUN_CONFIG_KEYS",
    "RUN_CONFIG_AUDIT_ID",
    "RUN_CONFIG_INGEST_URL",
    "RUN_CONFIG_RUN_TOKEN",
    "RUN_CONFIG_NUM_SEEN_CANARIES",
    "RUN_CONFIG_SPEC",
    "SIMULATION_WORKER",
    "DEPLOYMENT_WORKER",
]

#: The header that carries a run's identity (not a secret: it names a run, it grants nothing).
RUN_ID_HEADER = "X-Flaudit-Run-Id"

#: The environment variables a ServerApp attaches with, and the equivalent Flower run-config keys
#: (``flwr run --run-config``; declared in the app's ``[tool.flwr.app.config]``). The run token
#: itself never goes in the run config (apps write it to disk): ``FLAUDIT_RUN_TOKEN`` in the
#: environment, or the path of a file holding it.
RUN_CONFIG_KEYS = {
    "FLAUDIT_AUDIT_ID": "flaudit-audit-id",
    "FLAUDIT_URL": "flaudit-ingest-url",
    "FLAUDIT_RUN_TOKEN_FILE": "flaudit-run-token-file",
}

#: Run-config keys the service writes for its built-in ServerApp on a SuperLink (deployment
#: engine), in a 0600 TOML file, never on a command line. No canary seed among them (issue #29):
#: the ServerApp fetches each round's canary sum from the service, and learns only how many
#: canaries are seen (a count; which ones is the secret).
RUN_CONFIG_AUDIT_ID = "flaudit-audit-id"
RUN_CONFIG_INGEST_URL = "flaudit-ingest-url"
RUN_CONFIG_RUN_TOKEN = "flaudit-run-token"
RUN_CONFIG_NUM_SEEN_CANARIES = "flaudit-num-seen-canaries"
RUN_CONFIG_SPEC = "flaudit-spec"

#: ``"module:function"`` run in each audit's worker process (spawned; ``service/runner.py``), one
#: per engine: Flower's simulation engine, or a SuperLink (deployment engine).
SIMULATION_WORKER = "flaudit.server.engines:simulation_worker"
DEPLOYMENT_WORKER = "flaudit.server.engines:deployment_worker"
