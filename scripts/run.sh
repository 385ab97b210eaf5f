#!/usr/bin/env bash
# The main job on the embedded default: audit service + dashboard on http://127.0.0.1:8000,
# SQLite in .flaudit/, Flower simulation engine, and a demo audit on a built-in offline task.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export FLWR_TELEMETRY_ENABLED="${FLWR_TELEMETRY_ENABLED:-0}"
export FLWR_DISABLE_UPDATE_CHECK="${FLWR_DISABLE_UPDATE_CHECK:-1}"
mkdir -p .flaudit
if [ -z "${FLAUDIT_API_KEY:-}" ] && [ -z "${FLAUDIT_API_KEY_FILE:-}" ]; then
  if [ ! -f .flaudit/api-key ]; then
    .venv/bin/python -c "import secrets; print(secrets.token_urlsafe(24))" > .flaudit/api-key
    chmod 600 .flaudit/api-key
  fi
  export FLAUDIT_API_KEY_FILE="$PWD/.flaudit/api-key"
  echo "flaudit: API key for mutating routes is in .flaudit/api-key"
fi
if [ -z "${FLAUDIT_SECRET_KEY:-}" ] && [ -z "${FLAUDIT_SECRET_KEY_FILE:-}" ]; then
  if [ ! -f .flaudit/secret-key ]; then
    (umask 077 && .venv/bin/flaudit generate-secret-key > .flaudit/secret-key)
  fi
  export FLAUDIT_SECRET_KEY_FILE="$PWD/.flaudit/secret-key"
  echo "flaudit: the key that encrypts canary seeds at rest is in .flaudit/secret-key (back it up)"
fi
exec .venv/bin/flaudit serve --host 127.0.0.1 --port "${PORT:-8000}" \
  --database-url "${FLAUDIT_DATABASE_URL:-sqlite:///.flaudit/flaudit.db}" --demo "$@"
