#!/usr/bin/env bash
# Coverage-guided fuzzing with AFL++ through cargo-afl (stable toolchain).
#
#   scripts/fuzz.sh TARGET SECONDS        fuzz one target (or `all`, one after another)
#   scripts/fuzz.sh --list                the targets
#   FUZZ_UPDATE_CORPUS=1 scripts/fuzz.sh TARGET SECONDS
#                                         also minimise the queue into fuzz/corpus/TARGET
#   scripts/fuzz.sh --minimize TARGET DIR minimise the inputs in DIR into fuzz/corpus/TARGET
#
# Targets live in fuzz/src/bin/ and call haptic::fuzzing / haptic_agent::fuzzing, which check
# invariants as well as "no panic". The run starts from the committed corpus fuzz/corpus/TARGET;
# its queue and any crash are kept in target/fuzz-out/TARGET (FUZZ_OUT overrides). Prints
#   fuzz target=T seconds=S execs=N execs_per_sec=R corpus=C crashes=K hangs=H
# and exits 1 when the run found a crash, naming the files that reproduce it
# (`target/fuzz/release/T < FILE`).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/scripts/lib.sh"
ensure_packages /usr/bin/time:time
TARGETS=(config duration haproxy_cfg watch_stream store_paths http_request bundle)

if [ "${1:-}" = --list ]; then printf '%s\n' "${TARGETS[@]}"; exit 0; fi
minimize_only=false
if [ "${1:-}" = --minimize ]; then minimize_only=true; shift; fi
[ $# -eq 2 ] || { echo "usage: scripts/fuzz.sh TARGET|all SECONDS, or --minimize TARGET QUEUE_DIR" >&2; exit 2; }
target=$1 seconds=$2

export CARGO_TARGET_DIR="$ROOT/target/fuzz"

# cargo-afl and its AFL++ runtime (built once per toolchain under ~/.local/share/afl.rs).
if ! cargo afl --version >/dev/null 2>&1; then
  echo "==> installing cargo-afl" >&2
  cargo install cargo-afl --version 0.18.2 --locked --quiet
fi
if ! out=$(cargo afl config --build 2>&1) && ! grep -q "already built" <<<"$out"; then
  echo "$out" >&2
  echo "cargo afl config --build failed" >&2
  exit 1
fi

# cpu_sampler BINARY FILE: keeps writing to FILE the largest CPU time (seconds, with reaped
# children) of any process running BINARY, until killed.
cpu_sampler() {
  local bin=$1 file=$2 best=0 pid now
  local hz; hz=$(getconf CLK_TCK)
  while :; do
    for pid in $(pgrep -f "^$bin\$" 2>/dev/null); do
      now=$(awk -v hz="$hz" '{sub(/^.*\) /, ""); print ($12 + $13 + $14 + $15) / hz}' "/proc/$pid/stat" 2>/dev/null || echo 0)
      if awk -v a="$now" -v b="$best" 'BEGIN {exit !(a > b)}'; then best=$now; echo "$best" >"$file"; fi
    done
    sleep 2
  done
}

# minimize TARGET QUEUE WORKDIR: the smallest set of QUEUE's inputs with the same coverage
# (afl-cmin) becomes fuzz/corpus/TARGET.
minimize() {
  local t=$1 queue=$2 work=$3 min=$3/cmin
  local bin_dir
  bin_dir=$(dirname "$(find "${XDG_DATA_HOME:-$HOME/.local/share}/afl.rs" -name afl-cmin.bash -path '*/afl/bin/*' | head -1)")
  rm -rf "$min"
  # The shell version: the Python afl-cmin of this AFL++ records no coverage for these targets.
  AFL_NO_AFFINITY=1 AFL_PATH=$bin_dir PATH="$bin_dir:$PATH" "$bin_dir/afl-cmin.bash" \
    -i "$queue" -o "$min" -t 2000 -- "$CARGO_TARGET_DIR/release/$t" >"$work/cmin.log" 2>&1 || true
  if ! compgen -G "$min/*" >/dev/null; then
    echo "  afl-cmin kept nothing (log: $work/cmin.log); the corpus is unchanged" >&2
    return 1
  fi
  rm -rf "$ROOT/fuzz/corpus/$t"
  mkdir -p "$ROOT/fuzz/corpus/$t"
  local i=0 f
  for f in "$min"/*; do
    [ -f "$f" ] || continue
    cp "$f" "$ROOT/fuzz/corpus/$t/$(printf 'c%04d' $i)"
    i=$((i + 1))
  done
  echo "  corpus: $i inputs in fuzz/corpus/$t"
}

run_one() {
  local t=$1 found=0
  [ -f "$ROOT/fuzz/src/bin/$t.rs" ] || { echo "unknown fuzz target $t (scripts/fuzz.sh --list)" >&2; return 2; }
  (cd "$ROOT/fuzz" && cargo afl build --release --quiet --bin "$t")
  local out=${FUZZ_OUT:-$ROOT/target/fuzz-out}/$t
  rm -rf "$out"
  mkdir -p "$out"
  local dict=()
  [ -f "$ROOT/fuzz/dict/$t.dict" ] && dict=(-x "$ROOT/fuzz/dict/$t.dict")
  # No CPU binding (two runs may share this machine), no UI, a crash may go unreported to the
  # kernel's core handler; -t bounds one input (config validation compiles templates).
  # CPU time: afl-fuzz's own (from /usr/bin/time) plus the target's, sampled every 2 s from
  # the fork server (its children, the persistent loops, are reaped into its cutime/cstime).
  cpu_sampler "$CARGO_TARGET_DIR/release/$t" "$out/target-cpu" &
  local sampler=$!
  AFL_NO_AFFINITY=1 AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 \
    AFL_QUIET=1 AFL_SUPPRESS_AFL_OUTPUT=1 \
    /usr/bin/time -o "$out/cpu" -f "%U %S" \
    cargo afl fuzz -i "$ROOT/fuzz/corpus/$t" -o "$out" -V "$seconds" -t 2000 "${dict[@]}" \
    -- "$CARGO_TARGET_DIR/release/$t" >"$out/afl.log" 2>&1 || {
      kill "$sampler" 2>/dev/null
      tail -20 "$out/afl.log" >&2
      echo "afl-fuzz failed for $t (log: $out/afl.log)" >&2
      return 1
    }
  kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null || true
  local stats=$out/default/fuzzer_stats
  stat() { awk -F' *: *' -v k="$1" '$1 == k {print $2}' "$stats"; }
  local crashes hangs
  crashes=$(stat saved_crashes) hangs=$(stat saved_hangs)
  local cpu
  cpu=$(awk -v t="$(cat "$out/target-cpu" 2>/dev/null || echo 0)" '{printf "%.0f", $1 + $2 + t}' "$out/cpu" 2>/dev/null || echo "?")
  echo "fuzz target=$t seconds=$seconds cpu_s=$cpu execs=$(stat execs_done) execs_per_sec=$(stat execs_per_sec)" \
    "corpus=$(stat corpus_count) crashes=$crashes hangs=$hangs"
  if [ "${crashes:-0}" != 0 ]; then
    found=1
    for f in "$out"/default/crashes/id:*; do
      echo "  crash: $f (reproduce: $CARGO_TARGET_DIR/release/$t < '$f')" >&2
    done
  fi
  if [ "${FUZZ_UPDATE_CORPUS:-0}" = 1 ]; then
    minimize "$t" "$out/default/queue" "$out"
  fi
  return $found
}

if $minimize_only; then
  (cd "$ROOT/fuzz" && cargo afl build --release --quiet --bin "$1")
  work=$(mktemp -d /tmp/haptic-cmin.XXXXXX)
  if minimize "$1" "$2" "$work"; then rc=0; else rc=1; fi
  rm -rf "$work"
  exit $rc
fi

status=0
if [ "$target" = all ]; then
  for t in "${TARGETS[@]}"; do run_one "$t" || status=1; done
else
  run_one "$target" || status=1
fi
exit $status
