#!/usr/bin/env bash
# Builds the shipped binaries, haptic (controller and CLI) and haptic-agent, as static
# x86_64-unknown-linux-musl executables with the release profile (LTO, stripped, panic=abort).
#
#   scripts/build-static.sh [OUTDIR]
#
# Honours CARGO_TARGET_DIR (default: target/). The binaries end up in
# $CARGO_TARGET_DIR/x86_64-unknown-linux-musl/release/; with OUTDIR they are also copied there.
# The Dockerfile runs the same cargo command in its builder stage.
set -euo pipefail
cd "$(dirname "$0")/.."

target=x86_64-unknown-linux-musl
target_dir=${CARGO_TARGET_DIR:-target}

if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx "$target"; then
  echo "==> rustup target add $target"
  rustup target add "$target"
fi

# ring compiles C and assembly for the target: the cc crate needs musl-gcc (Debian: musl-tools).
if ! command -v musl-gcc >/dev/null 2>&1 && ! command -v x86_64-linux-musl-gcc >/dev/null 2>&1; then
  echo "==> installing musl-tools"
  as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
  as_root apt-get update -qq
  as_root apt-get install -y -qq musl-tools >/dev/null
fi

cargo build --release --locked --target "$target" -p haptic -p haptic-agent --bins

out="$target_dir/$target/release"
for bin in haptic haptic-agent; do
  [ -x "$out/$bin" ] || { echo "build-static: $out/$bin missing" >&2; exit 1; }
  printf '%s\t%s bytes\n' "$out/$bin" "$(stat -c %s "$out/$bin")"
done
if [ $# -ge 1 ]; then
  mkdir -p "$1"
  cp "$out/haptic" "$out/haptic-agent" "$1/"
fi
