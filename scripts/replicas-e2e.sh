#!/usr/bin/env bash
# End-to-end test of replicas behind one URL (issue #41; docs/deployment.md, "Replicas"):
# three `flaudit serve` replicas on loopback ports, one PostgreSQL database, HAProxy routing by
# audit id with health checks, two external audits running through the proxy and a quiet third,
# one replica killed with SIGKILL mid-audit; every audit must end with its verdict, no
# acknowledged round lost (checked against the database) and the takeovers named, each within
# 60 s (scripts/replicas_e2e.py does the run and the checks). About 1.5 minutes.
#
# Needs: HAProxy (Debian's haproxy; found on PATH or in /usr/sbin), a PostgreSQL server
# (FLAUDIT_TEST_POSTGRES_URL, else the local one on 127.0.0.1:5432 as user postgres), and the
# project's Python (.venv, or $FLAUDIT_PYTHON). A fresh database flaudit_replicas_<random> is
# created on that server and dropped at the end. What is missing makes a user's run exit 0 with
# "skipped: ...", and CI's (FLAUDIT_REQUIRE_ALL=1, which .ci/run sets, or CI=true) fail.
#
# Usage: bash scripts/replicas-e2e.sh [--results PATH]   (options of scripts/replicas_e2e.py)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
T0=$SECONDS
E2E_NAME=replicas-e2e
# shellcheck source=scripts/e2e-lib.sh
source scripts/e2e-lib.sh  # say, die, strict, skip

PY="${FLAUDIT_PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || skip "no project Python at $PY (bash scripts/setup.sh, or set FLAUDIT_PYTHON)"
HAPROXY="$(command -v haproxy || true)"
[ -n "$HAPROXY" ] || { [ -x /usr/sbin/haproxy ] && HAPROXY=/usr/sbin/haproxy; }
[ -n "$HAPROXY" ] || skip "HAProxy is not installed (Debian: apt-get install haproxy)"
command -v psql >/dev/null || skip "psql is not installed (Debian: apt-get install postgresql-client)"

SERVER_URL="${FLAUDIT_TEST_POSTGRES_URL:-postgresql+psycopg://postgres@127.0.0.1:5432/test}"
LIBPQ_URL="${SERVER_URL/postgresql+psycopg:/postgresql:}"
PGCONNECT_TIMEOUT=5 timeout 20 psql "$LIBPQ_URL" -qtAX -c 'select 1' >/dev/null 2>&1 \
  || skip "no PostgreSQL server answers at ${SERVER_URL#*@} (set FLAUDIT_TEST_POSTGRES_URL)"
DB="flaudit_replicas_$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
base="${SERVER_URL%%\?*}"
query=""
[ "$base" = "$SERVER_URL" ] || query="?${SERVER_URL#*\?}"
DB_URL="${base%/*}/$DB$query"
timeout 30 psql "$LIBPQ_URL" -qtAX -c "CREATE DATABASE $DB" >/dev/null \
  || die "could not create database $DB on ${SERVER_URL#*@}"
trap 'timeout 30 psql "$LIBPQ_URL" -qtAX -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true' EXIT
say "PostgreSQL ${SERVER_URL#*@} (database $DB), $($HAPROXY -v | head -1 | cut -d' ' -f1-3)"

export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
timeout -k 10 170 "$PY" scripts/replicas_e2e.py --database-url "$DB_URL" --haproxy "$HAPROXY" "$@" \
  || die "the replicas test failed (exit $?)"
say "passed in $((SECONDS - T0)) s"
