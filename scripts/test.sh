#!/usr/bin/env bash
# The one test command: installs what the tests need when it is missing, then checks formatting,
# lints, and runs every test: unit, integration, end to end (dev API server, controllers,
# agents, real HAProxy), the Helm chart and static-binary tests, and the demo's self-check.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_packages haproxy:haproxy socat:socat openssl:openssl curl:curl ss:iproute2 file:file zstd:zstd \
  prometheus:prometheus promtool:prometheus python3:python3 kubectl:kubernetes-client

echo "==> cargo fmt --check"
cargo fmt --all -- --check
(cd fuzz && cargo fmt -- --check)
echo "==> cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
# Python packages some tests use (grpcio for the GRPCRoute traffic test), in .venv/.
ensure_venv
echo "==> cargo test --workspace"
cargo test --workspace
echo "==> chart and static binaries"
scripts/test-chart.sh
echo "==> scripts/demo.sh --check"
scripts/demo.sh --check
echo "==> fuzz smoke (scripts/fuzz.sh, 5 s per target)"
fuzz_out=$(mktemp -d /tmp/haptic-fuzz-smoke.XXXXXX)
trap 'rm -rf "$fuzz_out"' EXIT
for target in $(scripts/fuzz.sh --list); do
  FUZZ_OUT=$fuzz_out scripts/fuzz.sh "$target" 5
done
echo "==> all tests passed"
