#!/usr/bin/env bash
# Apply ruff's mechanical changes to the whole tree ([tool.ruff] in pyproject.toml): the fixes
# ruff marks safe for the rules below, then the formatter; then print what is left for a person
# (exit 1 if anything is). Run on a clean working tree and review `git diff --stat` before
# committing; tests/test_architecture.py::test_ruff_lint_and_format_pass checks the result.
#   I001 import order           UP006/UP035 list[...] and collections.abc   UP037 quoted annotations
#   UP017 datetime.UTC          UP008 super()   UP041 TimeoutError          F541 f-string without {}
#   PIE808 range(0, n)          F401 imports left unused by the fixes above (e.g. timezone after
#                               UP017); ruff never removes an __init__.py's re-exports this way
set -euo pipefail
cd "$(dirname "$0")/.."
RUFF="${RUFF:-.venv/bin/ruff}"
[ -x "$RUFF" ] || RUFF=ruff  # without .venv: ruff on PATH
MECHANICAL="I001,UP006,UP035,UP037,UP017,UP008,UP041,F541,PIE808,F401"
echo "== ruff check --fix --select $MECHANICAL"
"$RUFF" check --fix --select "$MECHANICAL" --exit-zero --quiet .
echo "== ruff format"
"$RUFF" format .
echo "== what is left"
left=0
"$RUFF" check --statistics . || left=1
"$RUFF" format --check --quiet . || left=1
# the architecture test's limit on a source file's length (tests/test_architecture.py)
long=$(find auditor protocol service server clients commands -name '*.py' -exec wc -l {} + \
  | awk '$2 != "total" && $1 > 700')
if [ -n "$long" ]; then
  echo "source files over 700 lines after formatting (move a cohesive part to its own module):"
  echo "$long"
  left=1
fi
[ "$left" = 0 ] && echo "nothing: ruff check and ruff format --check pass"
exit "$left"
