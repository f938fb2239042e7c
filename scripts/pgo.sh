#!/usr/bin/env bash
# Profile-guided optimisation of haptic, and its measured gain.
#
#   scripts/pgo.sh [OUTDIR]
#
# PGO_REUSE_PROFILE=1 skips steps 1 and 2 when target/pgo.profdata exists.
#
# 1. An instrumented build of the render benchmark (benches/render.rs: the six libraries at
#    1,000 and 10,000 Ingresses; full renders, replays, splices of an EndpointSlice change, a new
#    Ingress), run as the training workload. The benchmark drives the same library code as the
#    controller's reconciler and `haptic render`.
# 2. The raw profiles merged with the toolchain's own llvm-profdata (rustup component
#    llvm-tools; Debian's LLVM is older than rustc's and cannot read its profiles).
# 3. The optimised builds: the static musl `haptic` (copied to OUTDIR when given) and the
#    benchmark, both with -Cprofile-use.
# 4. The gain, measured in the same run: the render benchmark built normally and with the
#    profile, and `haptic render` on 10,000 generated Ingresses (median of 3), normal and PGO.
#
# Build directories are target/pgo-*; nothing outside target/ and OUTDIR is written.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_packages haproxy:haproxy python3:python3

target_dir=${CARGO_TARGET_DIR:-target}
musl=x86_64-unknown-linux-musl
sysroot=$(rustc --print sysroot)
host=$(rustc -vV | sed -n 's/^host: //p')
profdata="$sysroot/lib/rustlib/$host/bin/llvm-profdata"
if [ ! -x "$profdata" ]; then
  echo "==> rustup component add llvm-tools (llvm-profdata matching rustc's LLVM)"
  rustup component add llvm-tools
fi
[ -x "$profdata" ] || { echo "pgo: no llvm-profdata at $profdata" >&2; exit 1; }

work=$(mktemp -d /tmp/haptic-pgo.XXXXXX)
trap 'rm -rf "$work"' EXIT
profiles="$work/profiles"
merged="$target_dir/pgo.profdata"
mkdir -p "$profiles"

bench() { # bench TARGET_DIR RUSTFLAGS ARGS…: the render benchmark's result lines
  local dir=$1 flags=$2; shift 2
  RUSTFLAGS="$flags" cargo bench --quiet --locked --bench render --target-dir "$dir" -- "$@" 2>/dev/null |
    grep '^render-libraries'
}

if [ -n "${PGO_REUSE_PROFILE:-}" ] && [ -s "$merged" ]; then
  echo "==> 1-2. reusing $merged"
else
  echo "==> 1. instrumented build and training run"
  bench "$target_dir/pgo-instrumented" "-Cprofile-generate=$profiles" 1000 10000 >/dev/null
  echo "==> 2. merging $(find "$profiles" -name '*.profraw' | wc -l) raw profiles"
  "$profdata" merge -o "$merged" "$profiles"
fi

use="-Cprofile-use=$PWD/$merged"
echo "==> 3. optimised builds"
RUSTFLAGS="$use" cargo build --quiet --release --locked --target "$musl" -p haptic --bin haptic \
  --target-dir "$target_dir/pgo-use"
pgo_bin="$target_dir/pgo-use/$musl/release/haptic"
if [ $# -ge 1 ]; then
  mkdir -p "$1"
  cp "$pgo_bin" "$1/haptic"
fi
scripts/build-static.sh >/dev/null
plain_bin="$target_dir/$musl/release/haptic"

echo "==> 4. the gain, same run"
echo "-- render benchmark, normal build"
bench "$target_dir" "" 1000 10000 | sed 's/^/normal /'
echo "-- render benchmark, PGO build"
bench "$target_dir/pgo-use-bench" "$use" 1000 10000 | sed 's/^/pgo    /'

python3 scripts/bench-objects.py 10000 >"$work/objects.yaml"
libs=()
for l in base ssl ingress gateway haproxytech haproxy-ingress; do libs+=(-f "chart/libraries/$l.yaml"); done
cli() { # cli BINARY: median wall time of three `haptic render` runs, in ms
  local runs=() i start end
  for i in 1 2 3; do
    start=$(date +%s%N)
    "$1" render "${libs[@]}" --fixtures "$work/objects.yaml" -o "$work/out" >/dev/null
    end=$(date +%s%N)
    runs+=($(((end - start) / 1000000)))
  done
  printf '%s\n' "${runs[@]}" | sort -n | sed -n 2p
}
plain_ms=$(cli "$plain_bin")
pgo_ms=$(cli "$pgo_bin")
echo "pgo-cli haptic_render_10k normal_ms=$plain_ms pgo_ms=$pgo_ms gain_pct=$(( (plain_ms - pgo_ms) * 100 / plain_ms )) normal_bytes=$(stat -c %s "$plain_bin") pgo_bytes=$(stat -c %s "$pgo_bin")"
