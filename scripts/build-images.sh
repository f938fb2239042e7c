#!/usr/bin/env bash
# Builds the HAPTIC images on this machine, offline, with buildah, and writes them as OCI archives:
#
#   scripts/build-images.sh OUTDIR
#
#   OUTDIR/haptic-controller.oci.tar   haptic + haproxy (for haproxy -c), FROM scratch, user 65532
#   OUTDIR/haptic-agent.oci.tar        haptic-agent + haproxy (for haproxy -c), FROM scratch, user 65532
#   OUTDIR/haptic-haproxy.oci.tar      haproxy alone, for the HAProxy container of the pods
#
# The images come from the Dockerfile's own final stages (`--build-arg DIST=dist-local`), fed with
# binaries built here: scripts/build-static.sh (static musl haptic and haptic-agent) and
# scripts/build-haproxy.sh (static HAProxy from Debian's source package). Nothing is pulled.
# The archives are tagged with the chart's default image names and its appVersion, so
#   skopeo copy oci-archive:OUTDIR/haptic-controller.oci.tar docker://registry.example.com/haproxy-haptic/haptic-controller:0.1.0
# (or `podman load`) puts them where the chart finds them with global.imageRegistry.
#
# HAProxy in these images is the version Debian ships (2.6 on bookworm). The controller refuses to
# deploy to HAProxy of another major.minor, so run the pods with the haptic-haproxy image built
# here (haproxy.image.repository=haproxy-haptic/haptic-haproxy, haproxy.image.tag=<appVersion>),
# or build the release images with the Dockerfile's default stages (HAProxy 3.x, docs/install.md).
#
# buildah keeps its storage in a temporary directory removed on exit: runs do not share state and
# leave nothing behind. Needs root (buildah with the vfs driver, no user namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

out=${1:?usage: scripts/build-images.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
[ "$(id -u)" = 0 ] || { echo "build-images: run as root (buildah with the vfs storage driver)" >&2; exit 1; }
ensure_packages buildah:buildah

version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' chart/Chart.yaml)
[ -n "$version" ] || { echo "build-images: no appVersion in chart/Chart.yaml" >&2; exit 1; }
registry=ghcr.io/haproxy-haptic

work=$(mktemp -d "${TMPDIR:-/tmp}/haptic-images.XXXXXX")
cleanup() {
  buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs rm --all >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# The build context: dist/ with the three binaries and skel/tmp, nothing else (see the Dockerfile).
mkdir -p "$work/context/dist/skel/tmp"
chmod 1777 "$work/context/dist/skel/tmp"  # haproxy -c and the agent write there
scripts/build-static.sh "$work/context/dist" >/dev/null
scripts/build-haproxy.sh "$work/context/dist/haproxy"
static_check() { file -b "$1" | grep -qE "static(-pie)? linked|statically linked" || { echo "build-images: $1 is not static" >&2; exit 1; }; }
for bin in haptic haptic-agent haproxy; do static_check "$work/context/dist/$bin"; done

bah() { buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs "$@"; }
for target in controller agent haproxy; do
  name="haptic-$target"
  ref="$registry/$name:$version"
  echo "==> $ref"
  bah build --quiet --layers=false --pull=never --build-arg DIST=dist-local --build-arg VERSION="$version" \
    --target "$target" -f "$PWD/Dockerfile" -t "$ref" "$work/context" >/dev/null
  rm -f "$out/$name.oci.tar"
  bah push --quiet "$ref" "oci-archive:$out/$name.oci.tar:$ref" >/dev/null
  printf '%s\t%s bytes\n' "$out/$name.oci.tar" "$(stat -c %s "$out/$name.oci.tar")"
done
