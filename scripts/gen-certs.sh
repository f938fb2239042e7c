#!/usr/bin/env bash
# Generates the certificates of the agent API's mutual TLS, for tests and the demo:
#   ca.crt / ca.key                  a private CA
#   agent.crt / agent.key            the agent's server certificate (DNS name haptic-agent)
#   controller.crt / controller.key  the controller's client certificate
#   controller-expired.crt           (with --expired-client) the same key, validity in 2020
#
# usage: scripts/gen-certs.sh OUTDIR [--expired-client]
# env:   AGENT_SANS   subjectAltName of the agent certificate (default DNS:haptic-agent);
#                     tests add IP:127.0.0.1 to connect without name overrides.
#        DAYS         validity of the issued certificates (default 825)
set -euo pipefail

out=${1:?usage: scripts/gen-certs.sh OUTDIR [--expired-client]}
expired=${2:-}
sans=${AGENT_SANS:-DNS:haptic-agent}
days=${DAYS:-825}
mkdir -p "$out"
cd "$out"

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; chmod 600 "$1"; }

key ca.key
openssl req -x509 -new -key ca.key -subj "/CN=haptic-ca" -days 3650 -out ca.crt \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

# issue NAME CN EXTENSIONS
issue() {
  key "$1.key"
  openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr" 2>/dev/null
  printf '%b\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days "$days" \
    -extfile "$1.ext" -out "$1.crt" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

issue agent haptic-agent "subjectAltName=$sans\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature"
issue controller haptic-controller "subjectAltName=DNS:haptic-controller\nextendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature"

if [ "$expired" = "--expired-client" ]; then
  # `openssl x509` cannot back-date; `openssl ca` can, with a throw-away database.
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  touch "$work/index.txt"
  echo 1000 > "$work/serial"
  cat > "$work/ca.cnf" <<CNF
[ ca ]
default_ca = tmp_ca
[ tmp_ca ]
database = $work/index.txt
new_certs_dir = $work
serial = $work/serial
default_md = sha256
policy = any
x509_extensions = client
[ any ]
commonName = supplied
[ client ]
basicConstraints = CA:FALSE
extendedKeyUsage = clientAuth
keyUsage = critical,digitalSignature
CNF
  openssl req -new -key controller.key -subj "/CN=haptic-controller" -out "$work/c.csr" 2>/dev/null
  openssl ca -batch -config "$work/ca.cnf" -cert ca.crt -keyfile ca.key -in "$work/c.csr" \
    -startdate 20200101000000Z -enddate 20200102000000Z -out controller-expired.crt -notext 2>/dev/null
fi
rm -f ca.srl
echo "certificates written to $out"
