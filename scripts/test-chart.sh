#!/usr/bin/env bash
# Packaging tests: the Helm chart (rendered and linted with the real Helm v4 SDK, validated with
# kubernetes-validate --strict for Kubernetes 1.29 and 1.33, applied with kubectl to the dev API
# server, and its controller and HAProxy pods run as local processes as the chart specifies them
# against the dev API server enforcing the chart's RBAC, until traffic flows; its alert rules unit-tested and its dashboard's queries parsed by promtool), the CRDs,
# the Dockerfile, docs/install.md's values reference, the static musl
# binaries (statically linked, run in an empty chroot, sizes), and the images
# scripts/build-images.sh builds with buildah (unpacked and run as their user, as root only).
#
# Python packages live in .venv/ (created on first run). Honours CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib.sh
venv=.venv
ensure_venv
ensure_packages promtool:prometheus

target_dir=${CARGO_TARGET_DIR:-target}
echo "==> scripts/build-static.sh"
scripts/build-static.sh
echo "==> cargo build -p haptic-dev-apiserver"
cargo build -q -p haptic-dev-apiserver

static_dir="$target_dir/x86_64-unknown-linux-musl/release"
export HAPTIC_STATIC_DIR="$static_dir"
export HAPTIC_BIN="$static_dir/haptic"
export HAPTIC_DEV_APISERVER="$target_dir/debug/haptic-dev-apiserver"
if [ -z "${HAPTIC_KUBECTL:-}" ] && [ -x /usr/bin/kubectl ]; then
  export HAPTIC_KUBECTL=/usr/bin/kubectl
fi

echo "==> chart, CRD, Dockerfile and static-binary tests"
"$venv/bin/python" -m unittest -v tests/chart/test_static.py tests/chart/test_chart.py

if [ "$(id -u)" = 0 ]; then
  images=$(mktemp -d "${TMPDIR:-/tmp}/haptic-test-images.XXXXXX")
  trap 'rm -rf "$images"' EXIT
  echo "==> scripts/build-images.sh"
  scripts/build-images.sh "$images"
  echo "==> image tests"
  HAPTIC_IMAGES_DIR="$images" "$venv/bin/python" -m unittest -v tests/chart/test_images.py
else
  echo "==> image tests skipped: scripts/build-images.sh needs root (buildah)"
fi
