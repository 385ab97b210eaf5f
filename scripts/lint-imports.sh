#!/usr/bin/env bash
# The parts import one way: run import-linter's `lint-imports` with the contracts in
# pyproject.toml ([tool.importlinter]; docs/architecture.md says them in words).
# Installed, flaudit is one package (flaudit.auditor, flaudit.service, ...); in the repository its
# parts are top-level folders side by side, which import-linter cannot walk as one package. So
# this lays the parts out as the installed package does, in a temporary folder, and lints that.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/flaudit"
cp flaudit/__init__.py "$tmp/flaudit/"
for part in auditor protocol service server clients commands; do
  cp -r "$part" "$tmp/flaudit/$part"
done
find "$tmp" -name __pycache__ -prune -exec rm -rf {} +
cp pyproject.toml "$tmp/"
LINT="${LINT_IMPORTS:-$PWD/.venv/bin/lint-imports}"
cd "$tmp" && PYTHONPATH="$tmp" "$LINT" pyproject.toml "$@"
