"""``flaudit verify BUNDLE [--public-key FILE | --url URL]``: check an evidence bundle offline.

Recomputes the verdict, every bound, p-value and estimate from the bundle's statistics with the
code the service ran (:func:`flaudit.auditor.claims.evidence.recompute`), checks the canary-seed
commitment when the seed is revealed, then the Ed25519 signature over the canonical form.
``--public-key`` takes a file saved from ``GET /keys`` (or one key's JSON, or a PEM public key);
``--url`` reads ``/keys`` of a running service; with neither the key in the bundle is used,
which shows the bundle is intact but not who signed it.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import urllib.request
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_public_key,
)

from ..auditor.claims.evidence import ATOL, RTOL, canonical_json, digest, recompute, signed_part
from ..auditor.claims.record_evidence import is_record_bundle, recompute_record

#: Exit statuses (documented in ``--help`` and docs/evidence.md).
OK, USAGE, MISMATCH, BAD_SIGNATURE, BAD_COMMITMENT = 0, 2, 3, 4, 5

EPILOG = f"""\
exit status:
  0  every recomputed number matches (relative tolerance {RTOL:g}, absolute {ATOL:g}) and the
     signature is valid
  3  a recorded number differs from the recomputed one (the first is named: field, recorded,
     recomputed)
  4  bad signature, unsigned bundle, or a key the given public keys do not list
  5  the revealed canary seed does not match the commitment published at creation
  2  usage (unreadable bundle, bad arguments)"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument(
        "bundle", type=Path, help="evidence bundle (JSON from GET /audits/{id}/evidence)"
    )
    parser.add_argument(
        "--allow-unsigned",
        action="store_true",
        help="accept a bundle without a signature (flaudit run --evidence): "
        "the numbers are still recomputed",
    )
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument(
        "--public-key",
        type=Path,
        default=None,
        help="file with the service's public keys: GET /keys saved as JSON, one "
        "key's JSON, or a PEM Ed25519 public key",
    )
    keys.add_argument(
        "--url", default=None, help="base URL of the service whose GET /keys lists the signing key"
    )


def _raw_public(text: str) -> bytes:
    if "BEGIN PUBLIC KEY" in text:
        key = load_pem_public_key(text.encode("ascii"))
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError("the PEM public key is not an Ed25519 key")
        return key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64decode(text.strip(), validate=True)


def load_keys(text: str) -> list[dict]:
    """Keys as ``[{key_id?, public_key (base64), retired_at?}]`` from GET /keys JSON, one key's
    JSON, or PEM."""
    stripped = text.strip()
    if stripped.startswith(("{", "[")):
        data = json.loads(stripped)
        if isinstance(data, dict) and "keys" in data:
            data = data["keys"]
        return data if isinstance(data, list) else [data]
    return [
        {
            "key_id": None,
            "public_key": base64.b64encode(_raw_public(text)).decode("ascii"),
            "retired_at": None,
        }
    ]


def check_signature(bundle: dict, keys: list[dict] | None) -> tuple[bool, str]:
    """(valid, message): the signature over the canonical form, by a key in ``keys`` (None: the
    key the bundle names)."""
    signature = bundle.get("signature")
    if not isinstance(signature, dict) or signature.get("algorithm") != "Ed25519":
        return False, "the bundle is not signed (no Ed25519 signature)"
    key_id = signature.get("key_id")
    if keys is None:
        public, note = (
            signature.get("public_key", ""),
            (
                " (the key the bundle carries: pass --public-key or --url to check it is the "
                "service's)"
            ),
        )
        listed = None
    else:
        listed = next(
            (
                k
                for k in keys
                if k.get("key_id") in (key_id, None)
                and k.get("public_key") == signature.get("public_key")
            ),
            None,
        )
        if listed is None:
            return False, f"signing key {key_id} is not among the given public keys"
        public, note = listed["public_key"], ""
    try:
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public))
        key.verify(
            base64.b64decode(signature.get("value", "")), canonical_json(signed_part(bundle))
        )
    except (InvalidSignature, ValueError):
        return False, f"bad signature (key {key_id})"
    if signature.get("digest") != digest(bundle):
        return False, "the signature is valid but the recorded digest is not the bundle's"
    retired = (listed or {}).get("retired_at")
    state = f", retired at {retired}" if retired else ""
    return True, f"signed by key {key_id}{state}{note}; evidence hash {signature['digest']}"


def main(args: argparse.Namespace) -> int:
    try:
        bundle = json.loads(args.bundle.read_text(encoding="utf-8"))
        keys = None
        if args.public_key is not None:
            keys = load_keys(args.public_key.read_text(encoding="utf-8"))
        elif args.url is not None:
            with urllib.request.urlopen(args.url.rstrip("/") + "/keys", timeout=30) as response:
                keys = load_keys(response.read().decode("utf-8"))
        result = (recompute_record if is_record_bundle(bundle) else recompute)(bundle)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"flaudit verify: error: {exc}", file=sys.stderr)
        return USAGE
    for check in result.checks:
        mark = {True: "ok", False: "MISMATCH", None: "not checked"}[check.ok]
        print(f"{mark:12s}{check.name}" + (f" ({check.note})" if check.note else ""))
    if result.commitment_failed:
        print(f"flaudit verify: commitment mismatch: {result.mismatch}", file=sys.stderr)
        return BAD_COMMITMENT
    if result.mismatch is not None:
        print(f"flaudit verify: mismatch: {result.mismatch}", file=sys.stderr)
        return MISMATCH
    if args.allow_unsigned and bundle.get("signature") is None:
        print(
            f"{'unsigned':12s}signature: none (--allow-unsigned): who produced the bundle "
            "is not checked"
        )
        print(
            f"verified: every recomputed number matches (rtol {RTOL:g}, atol {ATOL:g}); "
            f"verdict: {bundle['verdict'].get('summary')}"
        )
        return OK
    valid, message = check_signature(bundle, keys)
    print(f"{'ok' if valid else 'BAD':12s}signature: {message}")
    if not valid:
        print(f"flaudit verify: {message}", file=sys.stderr)
        return BAD_SIGNATURE
    print(
        f"verified: every recomputed number matches (rtol {RTOL:g}, atol {ATOL:g}); verdict: "
        f"{bundle['verdict'].get('summary')}"
    )
    return OK
