#!/usr/bin/env bash
# Create .venv and install flaudit with the given extras (idempotent: reinstalls only when
# pyproject.toml changed). Usage: scripts/setup.sh [extras]   e.g. scripts/setup.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
# pip, quietly: without its notes about local mirror folders that do not exist on this machine
# ("WARNING: Location ... is ignored") and without setuptools' generic warning about editable
# installs (the project's packages are meant to be imported from this checkout)
pip_quiet() {
  PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip "$@" 2>&1 \
    | { grep -v "^WARNING: Location" || true; }
}
if [ ! -x .venv/bin/python ]; then
  if ! "$PY" -m venv .venv >/dev/null 2>&1; then
    # Debian/Ubuntu ship venv separately; install it when we may, else say what is missing
    rm -rf .venv
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    else
      echo "flaudit: '$PY -m venv' failed; install your distribution's python3-venv package" >&2
      exit 1
    fi
    "$PY" -m venv .venv
  fi
  pip_quiet install --quiet --upgrade pip
fi
STAMP=".venv/.flaudit-installed-${EXTRAS:-base}"
HASH="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$HASH" ]; then
  SPEC="."
  [ -n "$EXTRAS" ] && SPEC=".[${EXTRAS}]"
  echo "flaudit: installing dependencies into .venv (the first time: 2-6 minutes)..."
  pip_quiet install --quiet -e "$SPEC"
  echo "$HASH" > "$STAMP"
fi
