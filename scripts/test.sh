#!/usr/bin/env bash
# The one test command: installs what the tests need when it is missing, then checks formatting,
# lints, and runs every test of the workspace (unit, integration, end-to-end).
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
command -v socat >/dev/null 2>&1 || missing+=(socat)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v curl >/dev/null 2>&1 || missing+=(curl)
if [ ${#missing[@]} -gt 0 ]; then
  echo "==> installing ${missing[*]}"
  as_root apt-get update -qq
  as_root apt-get install -y -qq "${missing[@]}" >/dev/null
fi

echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "==> cargo test --workspace"
cargo test --workspace
scripts/test-chart.sh
echo "==> scripts/demo.sh --check"
scripts/demo.sh --check
echo "==> all tests passed"
