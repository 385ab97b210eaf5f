# Shared by the end-to-end scripts (scripts/compose-e2e.sh, scripts/replicas-e2e.sh), sourced after
# `E2E_NAME=<name>; T0=$SECONDS`: log lines, failing, and the CI rule that a missing
# prerequisite fails under CI (FLAUDIT_REQUIRE_ALL=1, which .ci/run sets, or CI=true) where a
# user's run is skipped (exit 0).
say() { printf '[%s %4ds] %s\n' "$E2E_NAME" "$((SECONDS - T0))" "$*"; }
die() { say "FAILED: $*"; exit 1; }
strict() {  # under CI: FLAUDIT_REQUIRE_ALL=1 (.ci/run sets it) or CI=true
  local v
  for v in "${FLAUDIT_REQUIRE_ALL:-}" "${CI:-}"; do
    case "${v,,}" in 1|true|yes) return 0 ;; esac
  done
  return 1
}
skip() {  # REASON: a user's run without the prerequisite is not a failure; CI's is
  strict && die "$* (under CI the $E2E_NAME test must run, so this is a failure)"
  say "skipped: $*"; exit 0
}
