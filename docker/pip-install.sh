#!/bin/sh
# pip inside the image builds (docker/Dockerfile.*), the same in every image:
#   pip-install.sh torch VERSION   torch alone (--no-deps) from $TORCH_INDEX_URL, then its
#                                  dependencies from the normal index ($PIP_INDEX_URL or PyPI)
#   pip-install.sh ARGS...         python -m pip install --no-cache-dir ARGS...
# CA certificates in /tmp/flaudit-build-ca/*.pem|*.crt (docker/build-ca/) are trusted on top of
# pip's own bundle; an http:// torch index is trusted explicitly (a local wheel server).
set -eu
ca_dir=/tmp/flaudit-build-ca
extra=$(find "$ca_dir" -maxdepth 1 \( -name '*.pem' -o -name '*.crt' \) 2>/dev/null | sort)
if [ -n "$extra" ]; then
  bundle=$(mktemp)
  # shellcheck disable=SC2086
  cat "$(python -c 'import pip._vendor.certifi as c; print(c.where())')" $extra >"$bundle"
  export PIP_CERT="$bundle"
fi
if [ "${1:-}" = torch ]; then
  version="$2"
  index="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
  set -- --index-url "$index"
  case "$index" in
    http://*) set -- "$@" --trusted-host "$(python -c 'import sys, urllib.parse as u; print(u.urlsplit(sys.argv[1]).hostname)' "$index")" ;;
  esac
  python -m pip install --no-cache-dir --no-deps "$@" "torch==$version"
  python -m pip install --no-cache-dir "torch==$version"
else
  python -m pip install --no-cache-dir "$@"
fi
