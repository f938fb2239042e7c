#!/usr/bin/env bash
# The one test command: installs what the tests need when it is missing, then checks formatting,
# lints, and runs every test: unit, integration, end to end (dev API server, controllers,
# agents, real HAProxy: Debian's 2.6, and 3.2 for the tests that run it), the Helm chart and
# static-binary tests, and the demo's self-check.
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
# The chart's pods run HAProxy 3.2 and the images check with it; Debian's is 2.6. The tests that
# run HAProxy (the agent's reloads and runtime API, the libraries' output through haproxy -c and
# traffic, the end-to-end cluster, the command line) run once more with 3.2.
echo "==> with HAProxy 3.2: agent, libraries, end-to-end and command-line tests"
haproxy32=$(scripts/haproxy-3.2.sh)
haproxy32_path=$(mktemp -d "${TMPDIR:-/tmp}/haptic-haproxy32-path.XXXXXX")
trap 'rm -rf "$haproxy32_path"' EXIT
ln -s "$haproxy32" "$haproxy32_path/haproxy"
# --workspace: the same dependency builds as the run above (`-p` resolves features per package
# and rebuilt ring under the same file name, which a second run of this script at the same
# time could be linking its doc tests against).
PATH="$haproxy32_path:$PATH" HAPTIC_TEST_HAPROXY="$haproxy32" \
  cargo test --workspace --test fencing_and_recovery --test runtime_and_reload --test security \
    --test libraries --test e2e --test cli
rm -rf "$haproxy32_path"
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
