"""How a ServerApp attaches to its audit: the environment variables and run-config keys that
``flaudit attach`` prints (``FLAUDIT_AUDIT_ID``, ``FLAUDIT_URL``, the run token or its file), read
into the service client (:class:`.http_reporter.HttpRoundReporter`) both wrappers report through."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..protocol.wire import RUN_CONFIG_KEYS
from .http_reporter import HttpRoundReporter
from .reporting import RoundReporter

__all__ = ["ENV_AUDIT_ID", "ENV_RUN_TOKEN", "ENV_RUN_TOKEN_FILE", "ENV_URL"]


ENV_AUDIT_ID = "FLAUDIT_AUDIT_ID"
ENV_URL = "FLAUDIT_URL"
ENV_RUN_TOKEN = "FLAUDIT_RUN_TOKEN"
ENV_RUN_TOKEN_FILE = "FLAUDIT_RUN_TOKEN_FILE"


def reporter_from_env(
    run_config: Mapping[str, Any] | None,
    *,
    on_service_error: str | None = None,
    resume: bool | None = None,
) -> RoundReporter:
    """The service client of the audit named by the environment or the run config (``from_env``):
    ``on_service_error`` from ``FLAUDIT_ON_SERVICE_ERROR`` or the run-config key
    ``flaudit-on-service-error`` (default ``"continue"``), ``resume`` from ``FLAUDIT_RESUME``."""

    config = dict(run_config or {})
    if str(config.get("flaudit-run-token", "") or ""):
        raise ValueError(
            "run config 'flaudit-run-token': the run token must not be in the run config "
            "(apps write it to disk); pass it as FLAUDIT_RUN_TOKEN in the ServerApp's "
            "environment or in a file named by 'flaudit-run-token-file' (`flaudit attach "
            "--format run-config --token-file PATH` writes one), and rotate this one "
            "(`flaudit attach --rotate AUDIT_ID`)"
        )
    values = {}
    for env, key in RUN_CONFIG_KEYS.items():
        values[env] = os.environ.get(env) or str(config.get(key, "") or "")
    token = os.environ.get(ENV_RUN_TOKEN, "")
    token_file = values.pop(ENV_RUN_TOKEN_FILE, "")
    if not token and token_file:
        try:
            with open(token_file, encoding="utf-8") as handle:
                token = handle.readline().strip()
        except OSError as error:
            raise ValueError(
                f"{ENV_RUN_TOKEN_FILE}: cannot read the run token file {token_file!r} "
                f"({type(error).__name__}) where the ServerApp runs"
            ) from None
    values[ENV_RUN_TOKEN] = token
    for env, value in values.items():
        if not value:
            if env == ENV_RUN_TOKEN:
                env = f"{ENV_RUN_TOKEN} (or {ENV_RUN_TOKEN_FILE})"
            key = RUN_CONFIG_KEYS.get(env, RUN_CONFIG_KEYS[ENV_RUN_TOKEN_FILE])
            raise ValueError(
                f"{env} is not set (nor the run-config key {key!r}): print the lines with "
                '`flaudit attach` (or POST /audits with "engine": "external") and export '
                "them where the ServerApp runs (the SuperLink's environment)"
            )
    if on_service_error is None:
        on_service_error = (
            os.environ.get("FLAUDIT_ON_SERVICE_ERROR")
            or str(config.get("flaudit-on-service-error", "") or "")
            or "continue"
        )
    if resume is None:
        resume = os.environ.get("FLAUDIT_RESUME", "").strip().lower() in {"1", "true", "yes"}
    return HttpRoundReporter(
        values[ENV_URL],
        values[ENV_AUDIT_ID],
        values[ENV_RUN_TOKEN],
        on_service_error=on_service_error,
        resume=bool(resume),
    )
