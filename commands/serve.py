"""``flaudit serve``: the audit service (REST API + dashboard) with uvicorn.

Heavy imports (FastAPI, uvicorn, SQLAlchemy) happen inside :func:`main`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..service.app import create_app
from ..service.http_protocol import MAX_HEAD_BYTES, http_protocol
from ..service.settings import Settings

DEMO_SPEC = Path(__file__).resolve().parents[1] / "examples" / "quick-audit.json"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host", default="127.0.0.1", help="Interface to bind (default 127.0.0.1)."
    )
    parser.add_argument("--port", type=int, default=8000, help="Port (default 8000).")
    parser.add_argument(
        "--database-url",
        default=None,
        help="SQLAlchemy URL (default $FLAUDIT_DATABASE_URL or sqlite:///.flaudit/flaudit.db); "
        "PostgreSQL: postgresql+psycopg://user@host:5432/db",
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help=f"Submit {DEMO_SPEC.relative_to(DEMO_SPEC.parents[1])} on start-up if no audit exists.",
    )
    parser.add_argument(
        "--max-concurrent-audits",
        type=int,
        default=None,
        help="Audits running at the same time (default $FLAUDIT_MAX_CONCURRENT_AUDITS or 1).",
    )
    parser.add_argument(
        "--header-timeout-seconds",
        type=float,
        default=None,
        metavar="SECONDS",
        help="Time a client has to send a request line and headers, from the connection's "
        "opening or the end of the previous response; then 408 and close "
        "(default $FLAUDIT_HEADER_TIMEOUT_SECONDS or 10).",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level of the service and uvicorn (default info)",
    )


def main(args: argparse.Namespace) -> int:
    import logging
    import os

    import uvicorn

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    overrides: dict = {}
    if args.database_url:
        overrides["database_url"] = args.database_url
    if args.max_concurrent_audits is not None:
        overrides["max_concurrent_audits"] = args.max_concurrent_audits
    if args.header_timeout_seconds is not None:
        overrides["header_timeout_seconds"] = args.header_timeout_seconds
    if not os.environ.get("FLAUDIT_PUBLIC_URL"):
        host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
        overrides["public_url"] = f"http://{host}:{args.port}"
    if args.demo:
        overrides["demo_spec_path"] = str(DEMO_SPEC)
    try:
        settings = Settings.from_env(**overrides)
        settings.seed_cipher()  # a missing or invalid secret key stops here, with how to fix it
    except ValueError as exc:
        print(f"flaudit serve: {exc}")
        return 2
    if not settings.api_keys:
        logging.getLogger("flaudit.service").warning(
            "no API key configured: POST /audits, cancel and DELETE answer 503 until you set "
            "FLAUDIT_API_KEY or FLAUDIT_API_KEY_FILE"
        )
    uvicorn.run(
        create_app(settings),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        workers=1,
        # request heads must arrive within settings.header_timeout_seconds and are refused
        # with 431 over MAX_HEAD_BYTES (16 KiB), whichever parser uvicorn picks
        # (http_protocol.py; it gives h11 its own limit, so h11_max_incomplete_event_size is
        # not passed); idle keep-alive connections are closed after 5 s; bodies are bounded in
        # size and read time by service/limits.py
        http=http_protocol(
            header_timeout_seconds=settings.header_timeout_seconds, max_head_bytes=MAX_HEAD_BYTES
        ),
        timeout_keep_alive=5,
    )
    return 0
