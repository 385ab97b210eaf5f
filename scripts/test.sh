#!/usr/bin/env bash
# Set up and run the whole test suite. Installs what the tests need: the project with its
# test extras in .venv, and Debian's chromium for the dashboard browser test (when root).
# PostgreSQL tests run when FLAUDIT_TEST_POSTGRES_URL is set (see README); .ci/run sets it. The
# topology test otherwise starts a private cluster with Debian's initdb, or skips saying why.
# Skipped tests are counted by reason at the end of the summary ("NOT TESTED"); under
# FLAUDIT_REQUIRE_ALL=1 (.ci/run) a skip is an error instead (tests/skip_policy.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "flaudit: installing Debian chromium for the browser test..."
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "flaudit: could not install chromium; the browser test will fail"
  else
    echo "flaudit: chromium not found and not root; install Debian's 'chromium' package for the browser test"
  fi
fi
if [ -z "${FLAUDIT_TEST_POSTGRES_URL:-}" ]; then
  echo "flaudit: FLAUDIT_TEST_POSTGRES_URL is not set: the PostgreSQL store tests will be skipped" \
    "(README, 'Tests'; the summary counts them under NOT TESTED)"
fi
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
export FLWR_HOME="${FLWR_HOME:-$(mktemp -d)}"
# One BLAS/OpenMP thread per process (tests/conftest.py sets the same before anything imports
# numpy or torch): a thread per core spin-waits on a busy 2-core machine (3.4x the CPU time).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}" \
  MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
# Two pytest workers (pytest-xdist; the machine's two cores), each test file on one worker
# (`--dist loadfile`: a file's module fixtures, its service or its SuperLink, stay in one process),
# handed out in the collection's order, which puts the slowest files first (tests/slow_first.py;
# xdist's own order, the files with most tests first, left the long one-test files for the end).
# Pass `-n 0` to run in one process.
exec .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder "$@"
