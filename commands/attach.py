"""``flaudit attach``: create an audit for your own Flower app and print its environment.

Creates an audit with ``"engine": "external"`` on a running service (``POST /audits``) and
prints, once, the lines your ServerApp needs (``CanaryAuditStrategy.from_env``)::

    eval "$(flaudit attach --url http://127.0.0.1:8000 --canaries 64)"
    flower-superlink --insecure ...        # the ServerApp inherits the SuperLink's environment

``--rotate AUDIT_ID`` revokes a leaked run token and prints the new lines. The API key comes
from ``FLAUDIT_API_KEY`` or ``--api-key-file`` (first line) and is never printed.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from ..auditor.spec import AuditSpec
from ..protocol.wire import RUN_CONFIG_KEYS


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=os.environ.get("FLAUDIT_URL", "http://127.0.0.1:8000"),
        help="Service root (default $FLAUDIT_URL or http://127.0.0.1:8000).",
    )
    parser.add_argument(
        "--api-key-file", help="File whose first line is the API key (default: $FLAUDIT_API_KEY)."
    )
    parser.add_argument("--name", default="my flower app", help="Label of the audit.")
    parser.add_argument(
        "--canaries",
        type=_canaries,
        default="auto",
        help="Canaries k (about half seen), or 'auto' (default): chosen when "
        "your ServerApp declares its federation, the fewest that make the claim "
        "testable, within the k <= sampled clients per round x rounds the "
        "federation holds (the ServerApp log says what the audit will catch).",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        choices=(1, 2, 4, 8),
        help="Rounds each seen canary is inserted in (default 1; with "
        "--canaries auto, chosen with the canaries).",
    )
    parser.add_argument("--delta", type=float, default=1e-5, help="delta of every epsilon.")
    parser.add_argument(
        "--max-canary-fraction",
        type=float,
        default=None,
        help="Largest share of seen canaries in the population (small "
        "federations need more than the default 0.5).",
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="The audit ends failed ('the run never started') if no ServerApp "
        "declares its claim within this many seconds (default 600).",
    )
    parser.add_argument(
        "--rotate",
        metavar="AUDIT_ID",
        help="Rotate the run token of this audit instead of creating one.",
    )
    parser.add_argument(
        "--format",
        choices=("sh", "dotenv", "json", "run-config"),
        default="sh",
        help="sh: export lines (eval them); dotenv: KEY=value; json; run-config: "
        "a TOML file for `flwr run --run-config` (flaudit-audit-id = ...; needs "
        "--token-file: the run token never goes in the run config).",
    )
    parser.add_argument(
        "--token-file",
        metavar="PATH",
        help="Write the run token to PATH (mode 0600) and print its path "
        "instead of the token (required with --format run-config; PATH must be "
        "readable where the ServerApp runs).",
    )


def _canaries(value: str) -> int | str:
    """``--canaries``: an integer of at least 2, or ``auto``."""
    if value.strip().lower() == "auto":
        return "auto"
    try:
        k = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {value!r}") from None
    if k < 2:
        raise argparse.ArgumentTypeError(f"at least 2 canaries, got {k}")
    return k


def _api_key(args: argparse.Namespace) -> str:
    """The API key (first key of ``--api-key-file``, else ``$FLAUDIT_API_KEY``).

    Raises
    ------
    ValueError
        Saying which source is missing, unreadable or empty (never the key).
    """
    if args.api_key_file:
        try:
            with open(args.api_key_file, encoding="utf-8") as handle:
                lines = [line.strip() for line in handle]
        except OSError as exc:
            raise ValueError(
                f"cannot read --api-key-file {args.api_key_file!r} ({exc.strerror or exc})"
            ) from None
        except UnicodeDecodeError:
            raise ValueError(f"--api-key-file {args.api_key_file!r} is not a text file") from None
        keys = [line for line in lines if line and not line.startswith("#")]
        if not keys:
            raise ValueError(f"--api-key-file {args.api_key_file!r} holds no key")
        return keys[0]
    key = os.environ.get("FLAUDIT_API_KEY", "").strip()
    if not key:
        raise ValueError("set FLAUDIT_API_KEY or pass --api-key-file")
    return key


def main(args: argparse.Namespace) -> int:
    import json

    import httpx

    if args.format == "run-config" and not args.token_file:
        print(
            "flaudit attach: --format run-config needs --token-file PATH (apps write their run "
            "config to disk, so the run token goes in a file the ServerApp reads)",
            file=sys.stderr,
        )
        return 2
    try:
        headers = {"Authorization": f"Bearer {_api_key(args)}"}
    except ValueError as exc:
        print(f"flaudit attach: error: {exc}", file=sys.stderr)
        return 2
    base = args.url.rstrip("/")
    try:
        if args.rotate:
            response = httpx.post(
                f"{base}/audits/{args.rotate}/run-token", headers=headers, timeout=30
            )
        else:
            body = {
                "name": args.name,
                "engine": "external",
                "num_canaries": args.canaries,
                "delta": args.delta,
            }
            if args.repeats is not None:
                body["canary_repeats"] = args.repeats
            if args.max_canary_fraction is not None:
                body["max_canary_fraction"] = args.max_canary_fraction
            if args.start_timeout is not None:
                body["start_timeout_seconds"] = args.start_timeout
            response = httpx.post(f"{base}/audits", json=body, headers=headers, timeout=30)
    except httpx.HTTPError as error:
        print(
            f"flaudit attach: cannot reach the service at {base} ({type(error).__name__}); "
            "is `flaudit serve` running there?",
            file=sys.stderr,
        )
        return 1
    if response.status_code >= 400:
        print(
            f"flaudit attach: HTTP {response.status_code}: {response.text[:500]}", file=sys.stderr
        )
        return 1
    created = response.json()
    env = created["environment"]
    if args.token_file:  # apps write their run config to disk: the token goes in a file
        path = os.path.abspath(args.token_file)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(env.pop("FLAUDIT_RUN_TOKEN") + "\n")
        env["FLAUDIT_RUN_TOKEN_FILE"] = path
    if args.format == "json":
        print(json.dumps(env))
    elif args.format == "run-config":
        for key, value in env.items():
            print(f"{RUN_CONFIG_KEYS[key]} = {json.dumps(value)}")
    else:
        prefix = "export " if args.format == "sh" else ""
        for key, value in env.items():
            print(f"{prefix}{key}={shlex.quote(value)}")
    print(
        f"flaudit: audit {env['FLAUDIT_AUDIT_ID']} waits for your ServerApp; these lines are "
        "shown once (rotate a leaked token with `flaudit attach --rotate "
        f"{env['FLAUDIT_AUDIT_ID']}`); follow it at {base}/audits/{env['FLAUDIT_AUDIT_ID']}",
        file=sys.stderr,
    )
    summary = (created.get("design") or {}).get("summary")
    if summary:  # with --canaries auto: the ServerApp's log gives the design before round 1
        print(f"flaudit: design: {summary}", file=sys.stderr)
    start = (
        AuditSpec.model_fields["start_timeout_seconds"].default
        if args.start_timeout is None
        else args.start_timeout
    )
    if not args.rotate:
        print(
            f"flaudit: if no ServerApp declares its claim within {float(start):g} s, the audit "
            "ends failed: the run never started (--start-timeout)",
            file=sys.stderr,
        )
    return 0
