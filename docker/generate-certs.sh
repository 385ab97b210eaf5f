#!/usr/bin/env bash
# Generate a self-signed CA and a SuperLink server certificate for TLS between the SuperLink,
# the SuperNodes and the audit service (docker/compose.tls.yaml). For tests and private
# networks; in production use certificates from your own CA.
#
# Usage: docker/generate-certs.sh [OUT_DIR] [EXTRA_SAN ...]
#   OUT_DIR    where to write ca.pem, ca.key, superlink.pem, superlink.key (default: docker/certs)
#   EXTRA_SAN  further names or IPs the SuperLink is reached by, e.g. superlink.example.org
#              or 10.0.0.5 (always included: superlink, localhost, 127.0.0.1, ::1)
# Environment: CERT_DAYS (default 365).
set -euo pipefail
OUT="${1:-$(cd "$(dirname "$0")" && pwd)/certs}"
shift || true
DAYS="${CERT_DAYS:-365}"
command -v openssl >/dev/null 2>&1 || { echo "generate-certs: openssl not found" >&2; exit 1; }
mkdir -p "$OUT"
umask 077

SANS="DNS:superlink,DNS:localhost,IP:127.0.0.1,IP:::1"
for name in "$@"; do
  if [[ "$name" =~ ^[0-9.]+$ || "$name" == *:* ]]; then SANS="$SANS,IP:$name"; else SANS="$SANS,DNS:$name"; fi
done

openssl req -x509 -newkey rsa:3072 -sha256 -nodes -days "$DAYS" \
  -keyout "$OUT/ca.key" -out "$OUT/ca.pem" -subj "/CN=flaudit test CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  2>/dev/null
openssl req -newkey rsa:3072 -sha256 -nodes \
  -keyout "$OUT/superlink.key" -out "$OUT/superlink.csr" -subj "/CN=superlink" 2>/dev/null
EXT="$(mktemp)"
trap 'rm -f "$EXT"' EXIT
printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' \
  "$SANS" > "$EXT"
openssl x509 -req -in "$OUT/superlink.csr" -CA "$OUT/ca.pem" -CAkey "$OUT/ca.key" \
  -CAcreateserial -days "$DAYS" -sha256 -extfile "$EXT" -out "$OUT/superlink.pem" 2>/dev/null
rm -f "$OUT/superlink.csr" "$OUT/ca.srl"
# Containers run as non-root users: certificates and the server key must be readable by them.
chmod 644 "$OUT/ca.pem" "$OUT/superlink.pem" "$OUT/superlink.key"
chmod 600 "$OUT/ca.key"
echo "generate-certs: wrote $OUT/{ca.pem,ca.key,superlink.pem,superlink.key} (SANs: $SANS)"
