"""Generate the route reference of ``docs/api.md`` from the service's OpenAPI schema.

    .venv/bin/python -m flaudit.service.apidoc --write docs/api.md

Rewrites the part of the file between the ``<!-- routes:begin -->`` and ``<!-- routes:end -->``
markers (the walk-through above them is hand-written).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .app import create_app
from .settings import Settings

BEGIN, END = "<!-- routes:begin -->", "<!-- routes:end -->"


def _schema_name(schema: dict) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in schema or "oneOf" in schema:
        return " or ".join(_schema_name(s) for s in schema.get("anyOf") or schema["oneOf"])
    kind = schema.get("type", "object")
    if kind == "array":
        return f"list[{_schema_name(schema.get('items', {}))}]"
    if "enum" in schema:
        return " \\| ".join(str(v) for v in schema["enum"])
    return kind


def routes_markdown() -> str:

    spec = create_app(Settings(start_runner=False)).openapi()
    lines: list[str] = []
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            secured = (
                "API key"
                if op.get("tags") == ["audits"] and method in ("post", "delete")
                else (
                    "run token"
                    if op.get("tags") == ["ingest"]
                    else "open (API key if `FLAUDIT_REQUIRE_KEY_FOR_READS=1`)"
                )
            )
            if op.get("tags") == ["health"]:
                secured = "open"
            if op.get("tags") == ["record-level audits"]:
                secured = "API key"  # every method: a plan derives from the secret seed
            if op.get("tags") == ["webhooks"] and path.startswith("/webhooks"):
                secured = "API key"  # every method: the subscriptions are the operator's
            lines.append(f"### `{method.upper()} {path}`")
            lines.append("")
            lines.append(f"**{op.get('summary', '')}** — auth: {secured}.")
            lines.append("")
            if op.get("description"):
                lines.append(op["description"].strip())
                lines.append("")
            params = op.get("parameters", [])
            if params:
                lines.append("| parameter | in | type | required | description |")
                lines.append("|---|---|---|---|---|")
                for p in params:
                    desc = p.get("description") or p.get("schema", {}).get("description") or ""
                    lines.append(
                        f"| `{p['name']}` | {p['in']} | {_schema_name(p.get('schema', {}))} | "
                        f"{'yes' if p.get('required') else 'no'} | {desc.replace('|', '/')} |"
                    )
                lines.append("")
            body = op.get("requestBody")
            if body:
                for media, content in body.get("content", {}).items():
                    lines.append(
                        f"Body: `{media}` {_schema_name(content.get('schema', {}))}"
                        + (f" — {body['description']}" if body.get("description") else "")
                    )
                lines.append("")
            codes = []
            for code, resp in op.get("responses", {}).items():
                codes.append(f"`{code}` {resp.get('description', '')}".strip())
            lines.append("Responses: " + "; ".join(codes) + ".")
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the API route reference into a file.")
    parser.add_argument("--write", type=Path, help="Markdown file with the route markers.")
    args = parser.parse_args(argv)
    block = f"{BEGIN}\n{routes_markdown()}\n{END}"
    if not args.write:
        print(block)
        return 0
    text = args.write.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{args.write}: markers {BEGIN} / {END} not found")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    args.write.write_text(head + block + tail, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
