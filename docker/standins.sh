#!/usr/bin/env bash
# Stand-ins for the registry base images, for machines that reach Debian's packages and PyPI but
# no container registry. One Debian bookworm root file system (debootstrap) is imported three
# times, each following the conventions of the upstream image it stands in for:
#   flaudit-standin/python:3.11-slim   python:3.11-slim-bookworm: root, `python`/`pip` on PATH,
#                                      pip usable (no PEP 668 EXTERNALLY-MANAGED marker)
#   flaudit-standin/flower:1.41.0      flwr/superlink, flwr/superexec, flwr/supernode: user `app`
#                                      (uid 49999), flwr==1.41.0 in a venv at /python/venv on PATH,
#                                      WORKDIR /app owned by app
#   flaudit-standin/postgres:15        postgres: initialises $PGDATA from POSTGRES_USER,
#                                      POSTGRES_PASSWORD, POSTGRES_DB with UTF-8 on first start
# Existing images with these tags are reused (delete them to rebuild). Needs root, debootstrap and
# a Debian mirror; pip in the chroot uses the CA bundle $STANDIN_CA_BUNDLE (default: the host's).
#
# Usage: docker/standins.sh            # make the missing stand-ins, print "VAR=image" lines for
#                                      # compose (PYTHON_IMAGE, SUPERLINK_IMAGE, ...)
set -euo pipefail

PY_TAG=flaudit-standin/python:3.11-slim
FLOWER_TAG=flaudit-standin/flower:1.41.0
PG_TAG=flaudit-standin/postgres:15
MIRROR="${STANDIN_MIRROR:-http://deb.debian.org/debian}"
CA="${STANDIN_CA_BUNDLE:-${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}}"

have() { docker image inspect "$1" >/dev/null 2>&1; }

emit() {
  echo "PYTHON_IMAGE=$PY_TAG"
  echo "SUPERLINK_IMAGE=$FLOWER_TAG"
  echo "SUPEREXEC_IMAGE=$FLOWER_TAG"
  echo "SUPERNODE_IMAGE=$FLOWER_TAG"
  echo "POSTGRES_IMAGE=$PG_TAG"
}

if have "$PY_TAG" && have "$FLOWER_TAG" && have "$PG_TAG"; then
  echo "standins: reusing $PY_TAG, $FLOWER_TAG, $PG_TAG" >&2
  emit
  exit 0
fi

ROOTFS_TAG=flaudit-standin/rootfs:bookworm
# BuildKit needs the CLI's buildx plugin, which Debian's docker.io (bookworm) lacks, and a
# newer CLI refuses DOCKER_BUILDKIT=1 without it: these FROM/ENV/USER-only builds use the classic
# builder then (nothing to fetch either way).
if docker buildx version >/dev/null 2>&1; then BUILDKIT=1; else BUILDKIT=0; fi
meta() {  # TAG, then Dockerfile instructions on stdin (no build context: nothing is copied)
  local out
  out="$({ echo "FROM $ROOTFS_TAG"; cat; } | DOCKER_BUILDKIT=$BUILDKIT docker build -q -t "$1" - 2>&1)" \
    || { echo "standins: docker build of $1 failed: $out" >&2; return 1; }
}
start=$SECONDS
if ! have "$ROOTFS_TAG"; then
command -v debootstrap >/dev/null || { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null 2>&1; } \
  || { echo "standins: could not install debootstrap from Debian's packages" >&2; exit 1; }
work="$(mktemp -d /var/tmp/flaudit-standin.XXXXXX)"
trap 'umount "$work/rootfs/proc" 2>/dev/null || true; rm -rf "$work"' EXIT
root="$work/rootfs"
echo "standins: debootstrap bookworm into $root" >&2
debootstrap --variant=minbase \
  --include=python3,python3-venv,python3-pip,ca-certificates,postgresql-15,tzdata \
  bookworm "$root" "$MIRROR" >"$work/debootstrap.log" 2>&1 \
  || { tail -20 "$work/debootstrap.log" >&2; exit 1; }

mkdir -p "$root/usr/local/share/ca-certificates"
cp "$CA" "$root/tmp/host-ca.pem"
chroot_run() { chroot "$root" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  HOME=/root LANG=C.UTF-8 PIP_CERT=/tmp/host-ca.pem PIP_DISABLE_PIP_VERSION_CHECK=1 "$@"; }

# python:slim conventions: `python` and `pip` commands, pip installs system-wide.
rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
ln -sf /usr/bin/python3 "$root/usr/local/bin/python"
ln -sf /usr/bin/pip3 "$root/usr/local/bin/pip"

# Flower image conventions: user app (uid 49999), venv /python/venv with flwr, /app owned by app.
chroot_run groupadd --gid 49999 app
chroot_run useradd --uid 49999 --gid 49999 --create-home --home-dir /home/app --shell /bin/bash app
chroot_run python3 -m venv /python/venv
chroot_run /python/venv/bin/pip install --no-cache-dir -q "flwr==1.41.0" >&2
mkdir -p "$root/app"
chroot_run chown -R app:app /python /app

# postgres image conventions: docker-entrypoint.sh initialises an empty PGDATA from POSTGRES_*.
cat >"$root/usr/local/bin/docker-entrypoint.sh" <<'EOF'
#!/bin/bash
# Stand-in for the postgres image's entry point (first start: initdb from POSTGRES_*, UTF-8).
set -euo pipefail
export PGDATA="${PGDATA:-/var/lib/postgresql/data}"
user="${POSTGRES_USER:-postgres}" db="${POSTGRES_DB:-${POSTGRES_USER:-postgres}}"
mkdir -p "$PGDATA" /var/run/postgresql
chown -R postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
as_pg() { runuser -u postgres -- "$@"; }
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pw="$(mktemp)"; printf '%s' "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}" >"$pw"
  chown postgres "$pw"
  as_pg initdb -D "$PGDATA" --username="$user" --pwfile="$pw" -E UTF8 --locale=C.UTF-8 \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pw"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  as_pg pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
  if [ "$db" != "postgres" ]; then
    as_pg psql -v ON_ERROR_STOP=1 --username="$user" --dbname=postgres \
      -c "CREATE DATABASE \"$db\"" >/dev/null
  fi
  as_pg pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  echo "postgres stand-in: initialised $PGDATA (database $db, owner $user, UTF8)"
fi
exec runuser -u postgres -- postgres -D "$PGDATA" -c listen_addresses='*' "$@"
EOF
chmod 755 "$root/usr/local/bin/docker-entrypoint.sh"

rm -f "$root/tmp/host-ca.pem"
chroot_run apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/* "$root"/root/.cache
echo "standins: root file system ready in $((SECONDS - start)) s; importing" >&2
tar -C "$root" --numeric-owner -cf "$work/rootfs.tar" .

# One import (the slow part: it unpacks the whole tree), then three metadata-only images on it.
docker import "$work/rootfs.tar" "$ROOTFS_TAG" >/dev/null
fi
meta "$PY_TAG" <<'EOF2'
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
CMD ["python3"]
EOF2
meta "$FLOWER_TAG" <<'EOF2'
ENV PATH=/python/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
WORKDIR /app
USER app
EOF2
meta "$PG_TAG" <<'EOF2'
ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 PGDATA=/var/lib/postgresql/data
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["docker-entrypoint.sh"]
CMD []
EOF2
echo "standins: made $PY_TAG, $FLOWER_TAG, $PG_TAG in $((SECONDS - start)) s" >&2
emit
