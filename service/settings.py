"""Service settings: read once from the environment (or passed explicitly in tests).

Environment variables
---------------------
``FLAUDIT_DATABASE_URL``
    SQLAlchemy URL; default ``sqlite:///.flaudit/flaudit.db``. PostgreSQL:
    ``postgresql+psycopg://user@host:5432/db``.
``FLAUDIT_API_KEY`` / ``FLAUDIT_API_KEY_FILE``
    API key(s) for mutating routes. The file may hold several keys, one per line (``#`` comments
    and blank lines are ignored).
``FLAUDIT_SECRET_KEY`` / ``FLAUDIT_SECRET_KEY_FILE``
    Required: the key(s) that encrypt the canary seeds at rest (``flaudit generate-secret-key``).
    The file may hold several, one per line: the first encrypts, all decrypt (rotation: see
    ``flaudit rotate-secret-key``).
``FLAUDIT_REQUIRE_KEY_FOR_READS``
    ``1`` to require an API key on read routes too (default: reads are open).
``FLAUDIT_ALLOW_CUSTOM_TASKS``
    ``1`` to accept ``task = "module.path:factory"`` in ``POST /audits`` (default: built-in tasks
    only, since a custom task imports and runs code in the worker).
``FLAUDIT_ALLOW_BUG_INJECTION``
    ``1`` to accept the spec field ``inject_bug`` in ``POST /audits``: the run then has a
    deliberate DP bug (testing only; the audit is marked "bug injected"). Default: refused.
``FLAUDIT_MAX_CONCURRENT_AUDITS``
    Worker processes running at the same time (default 1).
``FLAUDIT_PUBLIC_URL``
    Base URL the workers use to reach this service's ingest routes (default
    ``http://<host>:<port>`` of ``flaudit serve``).
``FLAUDIT_MAX_BODY_BYTES``
    Largest ingest body accepted (default 1 GiB); bodies are also limited to ``4 * d``.
``FLAUDIT_MAX_JSON_BODY_BYTES``
    Largest body on every other route (default 64 KiB), refused before authentication.
``FLAUDIT_BODY_TIMEOUT_SECONDS``
    Time allowed to receive a request body, from its first byte (default 60).
``FLAUDIT_HEADER_TIMEOUT_SECONDS``
    Time allowed to receive a request line and headers, from the connection's opening or the
    end of the previous response on a keep-alive connection (default 10; ``flaudit serve
    --header-timeout-seconds``).
``FLAUDIT_TIMEOUT_GRACE_SECONDS``
    Seconds the runner waits beyond an audit's ``timeout_seconds`` (engine start-up) before it
    kills the worker (default 30).
``FLAUDIT_LEASE_SECONDS``
    A running audit's owner lease (default 30): the instance running it renews it every third
    of this; another instance fails the audit (a simulation), adopts it (a deployment audit's
    Flower run) or takes it over (an external audit) only after the lease expired (at once for
    an owner provably gone on the same host), so within the lease plus a third of it (40 s by
    default). An external audit's run reaching another replica moves its lease at once.
``FLAUDIT_SILENCE_CHECK_SECONDS``
    How often the runner looks for external audits whose run went silent for longer than their
    spec's ``timeout_seconds`` and ends them (default 2).
``FLAUDIT_INSTANCE_ID``
    Name of this instance in the leases (default ``<hostname>:<pid>:<random>``; unique per
    replica: two replicas with one name would renew each other's leases).
``FLAUDIT_CANARY_CACHE_BYTES``
    Memory the service may use to keep canaries between rounds (default 256 MiB in total).
"""

from __future__ import annotations

import math
import os
import secrets
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..protocol.wire import DEPLOYMENT_WORKER, SIMULATION_WORKER
from .sealing import SeedCipher

__all__ = ["Settings", "load_api_keys"]


def load_api_keys(
    *, key: str | None = None, key_file: str | None = None, variable: str = "FLAUDIT_API_KEY_FILE"
) -> tuple[str, ...]:
    """Collect API keys from a literal key and/or a file with one key per line.

    Raises
    ------
    ValueError
        If ``key_file`` names a file that cannot be read.
    """
    keys: list[str] = []
    if key and key.strip():
        keys.append(key.strip())
    if key_file:
        try:
            text = Path(key_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"key_file: cannot read {variable} ({exc.strerror})") from None
        for line in text.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                keys.append(line)
    return tuple(dict.fromkeys(keys))


def default_instance_id() -> str:
    """``<hostname>:<pid>:<random>``: unique per service process, readable in the database."""
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{secrets.token_hex(4)}"


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _env_number(name: str, default, kind: type = float):
    """``kind(value)`` of the variable ``name`` (``default`` if unset or blank); a value that is
    not a number is refused naming the variable."""
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        return kind(value)
    except ValueError:
        what = "an integer" if kind is int else "a number of seconds"
        raise ValueError(f"{name} must be {what}, got {value!r}") from None


@dataclass(frozen=True)
class Settings:
    """Configuration of one service instance.

    The runner starts worker processes that report rounds back over HTTP to ``public_url``.
    ``worker_target`` is ``"module:function"`` run in each worker (see
    :mod:`flaudit.service.runner`); tests replace it with a light engine.
    """

    database_url: str = "sqlite:///.flaudit/flaudit.db"
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    secret_keys: tuple[str, ...] = field(default=(), repr=False)
    require_key_for_reads: bool = False
    max_concurrent_audits: int = 1
    public_url: str = "http://127.0.0.1:8000"
    max_body_bytes: int = 1 << 30
    max_json_body_bytes: int = 64 << 10
    body_timeout_seconds: float = 60.0
    header_timeout_seconds: float = 10.0
    canary_cache_bytes: int = 256 << 20
    worker_target: str = SIMULATION_WORKER
    deployment_target: str = DEPLOYMENT_WORKER
    runner_poll_seconds: float = 0.5
    start_runner: bool = True
    cancel_grace_seconds: float = 3.0
    timeout_grace_seconds: float = 30.0
    demo_spec_path: str | None = None
    allow_custom_tasks: bool = False
    lease_seconds: float = 30.0
    instance_id: str = field(default_factory=lambda: default_instance_id())
    allow_bug_injection: bool = False
    silence_check_seconds: float = 2.0
    webhook_backoff_seconds: float = 10.0
    webhook_max_attempts: int = 8
    webhook_timeout_seconds: float = 10.0
    webhook_allow_private: bool = False

    def __post_init__(self) -> None:
        if self.max_concurrent_audits < 1:
            raise ValueError("max_concurrent_audits must be >= 1")
        if self.max_body_bytes < 8:
            raise ValueError("max_body_bytes must be >= 8")
        if self.max_json_body_bytes < 1024:
            raise ValueError("max_json_body_bytes must be >= 1024")
        if not (math.isfinite(self.body_timeout_seconds) and self.body_timeout_seconds > 0):
            raise ValueError(
                "body_timeout_seconds (FLAUDIT_BODY_TIMEOUT_SECONDS) must be a finite number of "
                f"seconds > 0, got {self.body_timeout_seconds!r}"
            )
        if not (math.isfinite(self.header_timeout_seconds) and self.header_timeout_seconds > 0):
            raise ValueError(
                "header_timeout_seconds (FLAUDIT_HEADER_TIMEOUT_SECONDS, flaudit serve "
                "--header-timeout-seconds) must be a finite number of seconds > 0, got "
                f"{self.header_timeout_seconds!r}"
            )
        if not (math.isfinite(self.lease_seconds) and self.lease_seconds > 0):
            raise ValueError(
                "lease_seconds (FLAUDIT_LEASE_SECONDS) must be a finite number of seconds > 0, "
                f"got {self.lease_seconds!r}"
            )
        if not (math.isfinite(self.silence_check_seconds) and self.silence_check_seconds > 0):
            raise ValueError(
                "silence_check_seconds (FLAUDIT_SILENCE_CHECK_SECONDS) must be a finite number of "
                f"seconds > 0, got {self.silence_check_seconds!r}"
            )
        if not (
            math.isfinite(self.webhook_backoff_seconds)
            and self.webhook_backoff_seconds > 0
            and math.isfinite(self.webhook_timeout_seconds)
            and self.webhook_timeout_seconds > 0
            and self.webhook_max_attempts >= 1
        ):
            raise ValueError(
                "webhook_backoff_seconds and webhook_timeout_seconds must be finite "
                "numbers of seconds > 0, webhook_max_attempts >= 1"
            )
        if not 1 <= len(self.instance_id) <= 64:
            raise ValueError("instance_id must have 1 to 64 characters")
        if self.canary_cache_bytes < 0:
            raise ValueError("canary_cache_bytes must be >= 0")
        if not (math.isfinite(self.timeout_grace_seconds) and self.timeout_grace_seconds >= 0):
            raise ValueError(
                "timeout_grace_seconds (FLAUDIT_TIMEOUT_GRACE_SECONDS) must be a finite number "
                f"of seconds >= 0, got {self.timeout_grace_seconds!r}"
            )

    def seed_cipher(self):
        """The :class:`~flaudit.service.sealing.SeedCipher` of ``secret_keys``.

        Raises
        ------
        SecretKeyError
            No secret key configured, or a key that is not valid.
        """

        return SeedCipher(self.secret_keys)

    @classmethod
    def from_env(cls, **overrides) -> Settings:
        """Settings from ``FLAUDIT_*`` environment variables; keyword overrides win."""
        env = os.environ
        base = cls(
            database_url=env.get("FLAUDIT_DATABASE_URL") or cls.database_url,
            api_keys=load_api_keys(
                key=env.get("FLAUDIT_API_KEY"), key_file=env.get("FLAUDIT_API_KEY_FILE")
            ),
            secret_keys=load_api_keys(
                key=env.get("FLAUDIT_SECRET_KEY"),
                key_file=env.get("FLAUDIT_SECRET_KEY_FILE"),
                variable="FLAUDIT_SECRET_KEY_FILE",
            ),
            require_key_for_reads=_env_bool("FLAUDIT_REQUIRE_KEY_FOR_READS", False),
            max_concurrent_audits=_env_number("FLAUDIT_MAX_CONCURRENT_AUDITS", 1, int),
            public_url=env.get("FLAUDIT_PUBLIC_URL") or cls.public_url,
            max_body_bytes=_env_number("FLAUDIT_MAX_BODY_BYTES", cls.max_body_bytes, int),
            max_json_body_bytes=_env_number(
                "FLAUDIT_MAX_JSON_BODY_BYTES", cls.max_json_body_bytes, int
            ),
            body_timeout_seconds=_env_number(
                "FLAUDIT_BODY_TIMEOUT_SECONDS", cls.body_timeout_seconds
            ),
            header_timeout_seconds=_env_number(
                "FLAUDIT_HEADER_TIMEOUT_SECONDS", cls.header_timeout_seconds
            ),
            canary_cache_bytes=_env_number(
                "FLAUDIT_CANARY_CACHE_BYTES", cls.canary_cache_bytes, int
            ),
            worker_target=env.get("FLAUDIT_WORKER_TARGET") or cls.worker_target,
            allow_custom_tasks=_env_bool("FLAUDIT_ALLOW_CUSTOM_TASKS", False),
            lease_seconds=_env_number("FLAUDIT_LEASE_SECONDS", cls.lease_seconds),
            instance_id=env.get("FLAUDIT_INSTANCE_ID") or default_instance_id(),
            allow_bug_injection=_env_bool("FLAUDIT_ALLOW_BUG_INJECTION", False),
            timeout_grace_seconds=_env_number(
                "FLAUDIT_TIMEOUT_GRACE_SECONDS", cls.timeout_grace_seconds
            ),
            silence_check_seconds=_env_number(
                "FLAUDIT_SILENCE_CHECK_SECONDS", cls.silence_check_seconds
            ),
            webhook_backoff_seconds=_env_number(
                "FLAUDIT_WEBHOOK_BACKOFF_SECONDS", cls.webhook_backoff_seconds
            ),
            webhook_max_attempts=_env_number(
                "FLAUDIT_WEBHOOK_MAX_ATTEMPTS", cls.webhook_max_attempts, int
            ),
            webhook_timeout_seconds=_env_number(
                "FLAUDIT_WEBHOOK_TIMEOUT_SECONDS", cls.webhook_timeout_seconds
            ),
            webhook_allow_private=_env_bool("FLAUDIT_WEBHOOK_ALLOW_PRIVATE", False),
        )
        return replace(base, **overrides)
