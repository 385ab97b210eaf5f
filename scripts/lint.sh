#!/usr/bin/env bash
# Lint and style, checked without changing a file: ruff's rules and format ([tool.ruff] in
# pyproject.toml) and the import layers (scripts/lint-imports.sh). CI runs the same checks as
# tests in tests/test_architecture.py. `ruff check --fix .` and `ruff format .` apply what ruff
# can fix by itself; the rest it names with a rule code (`ruff rule CODE` explains one).
set -euo pipefail
cd "$(dirname "$0")/.."
RUFF="${RUFF:-.venv/bin/ruff}"
[ -x "$RUFF" ] || RUFF=ruff  # without .venv: the tools on PATH
[ -x .venv/bin/lint-imports ] || export LINT_IMPORTS="${LINT_IMPORTS:-$(command -v lint-imports || true)}"
failed=0
echo "== ruff check"
"$RUFF" check . || failed=1
echo "== ruff format --check"
"$RUFF" format --check --output-format concise . || failed=1  # `ruff format --diff` shows how
echo "== lint-imports"
bash scripts/lint-imports.sh || failed=1
exit "$failed"
