#!/usr/bin/env bash
# Benchmarks for the numbers that matter (never timing assertions in tests).
#
#   scripts/bench.sh            every benchmark
#   scripts/bench.sh render     render through the six libraries at 1,000 and 10,000 Ingresses
#                               (+ Services + EndpointSlices): full, unchanged, one EndpointSlice
#                               change, one new Ingress, peak memory, haproxy -c on the same output,
#                               and the growth from 1,000 to 10,000 in pairs of neighbouring renders
#   scripts/bench.sh counts     the same full renders counted by cachegrind: instructions and misses
#                               of a simulated 32 MiB last-level cache per render, at 1,000 and
#                               10,000 (figures that do not move with the machine's other load)
#   scripts/bench.sh watch      list and watch ingest into stores, and store memory, for 10,000
#                               Ingresses + Services + EndpointSlices from the dev API server
#   scripts/bench.sh latency [N…]  event-to-traffic latency (EndpointSlice change, new route)
#                               with N Ingresses (default 1,000; `all` runs 1,000 and 10,000),
#                               through two HAProxy pods, with a warm standby controller and
#                               without it; and a burst of 1,000 EndpointSlice updates
#   scripts/bench.sh soak       load through two HAProxy pods while endpoints roll, routes come
#                               and go, the leader is killed and SIGTERMed, an agent restarts,
#                               the API server fails, HAProxy restarts and a pod is drained:
#                               failed requests and convergence per phase
#   scripts/bench.sh idle       the controller at rest as it ships: RSS of the static musl binary
#                               (scripts/build-static.sh), leader and standby, one Ingress loaded
#   scripts/bench.sh agent      agent apply latency, runtime- and reload-class changes, on a
#                               1,000-backend config (scripts/bench-agent.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_packages /usr/bin/time:time python3:python3

which=${1:-all}

# Builds the binary the images carry (scripts/build-static.sh) and prints its path.
static_haptic() {
  scripts/build-static.sh >/dev/null
  realpath "${CARGO_TARGET_DIR:-target}/x86_64-unknown-linux-musl/release/haptic"
}

bench_render() {
  # Through the six shipped libraries (the config the chart installs): N Ingresses, each with
  # a Service and an EndpointSlice of three endpoints. Full render, a re-render with nothing
  # changed, one EndpointSlice change, one new Ingress, and the floor in the same run:
  # haproxy -c on the same output and the raw JSON size of the objects.
  ensure_packages haproxy:haproxy
  cargo bench --quiet --bench render -- 1000 10000 2>/dev/null | grep -E '^render-(libraries|reconcile-reload|growth)'
  # `haptic render` on the same 10,000 with the binary the images carry (the static musl
  # build, whose allocator is not glibc's): its render time and peak memory.
  local bin; bin=$(static_haptic)
  local work; work=$(mktemp -d /tmp/haptic-bench.XXXXXX)
  python3 scripts/bench-objects.py 10000 > "$work/objects.yaml"
  local libs=()
  for l in base ssl ingress gateway haproxytech haproxy-ingress; do libs+=(-f "chart/libraries/$l.yaml"); done
  local out
  out=$( { /usr/bin/time -f "peak_rss_kb=%M wall_s=%e" "$bin" render "${libs[@]}" \
    --fixtures "$work/objects.yaml" -o "$work/out" --timings >/dev/null; } 2>&1 )
  echo "render-cli n=10000 binary=static-musl $(echo "$out" | grep -o 'objects=.*') $(echo "$out" | grep -o 'peak_rss_kb=.*') raw_json_bytes=$(wc -c < "$work/objects.yaml")"
  rm -rf "$work"
}

bench_counts() {
  # The render benchmark's full render, counted instead of timed: cachegrind's instructions and
  # misses (first-level data, and a simulated 32 MiB last level: this machine's L3) do not
  # move with the load of the machine's other tenants, which wall-clock time at 10,000 does
  # by 15-25 %. Each figure is the difference of two runs of N and 2N full renders (N = 10 at
  # 1,000, 1 at 10,000), so loading the objects cancels out; a render's figure includes
  # freeing its result, which the timed benchmark leaves out.
  ensure_packages valgrind:valgrind
  local bin
  bin=$(cargo bench --quiet --bench render --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "render":
        print(m["executable"])')
  local work; work=$(mktemp -d /tmp/haptic-bench-counts.XXXXXX)
  count() { # N RENDERS: the summary of one run
    HAPTIC_BENCH_PROFILE_FULL=$2 valgrind --tool=cachegrind --cache-sim=yes --LL=33554432,16,64 \
      --cachegrind-out-file=/dev/null "$bin" --bench "$1" >/dev/null 2>"$work/$1-$2"
  }
  count 1000 10 & count 1000 20 & wait
  count 10000 1 & count 10000 2 & wait
  python3 - "$work" <<'PY'
import re, sys
def summary(n, runs):
    text = open(f"{sys.argv[1]}/{n}-{runs}").read()
    get = lambda name: int(re.search(name + r":\s+([\d,]+)", text).group(1).replace(",", ""))
    return get(r"I\s+refs"), get(r"D1\s+misses"), get(r"LL\s+misses")
for n, a, b in ((1000, 10, 20), (10000, 1, 2)):
    lo, hi = summary(n, a), summary(n, b)
    i, d1, ll = ((y - x) // (b - a) for x, y in zip(lo, hi))
    print(f"render-counts n={n} instructions={i} d1_misses={d1} ll_misses={ll}")
PY
  rm -rf "$work"
}

bench_watch() {
  cargo build --quiet --release -p haptic-dev-apiserver
  cargo bench --quiet --bench watch_ingest 2>/dev/null | grep '^watch-ingest'
}

bench_idle() {
  # The idle goal is about the binary the images carry: the static musl build (its allocator
  # keeps less memory resident than glibc's). The latency benchmark runs it as both
  # controllers (HAPTIC_BENCH_BIN) with one Ingress loaded; its setup line has their RSS.
  ensure_packages haproxy:haproxy openssl:openssl ss:iproute2
  local bin; bin=$(static_haptic)
  HAPTIC_BENCH_BIN=$bin BENCH_INGRESSES=1 BENCH_CHANGES=4 cargo bench --quiet --bench event_latency 2>/dev/null \
    | grep '^latency setup' | sed 's/^latency setup/idle binary=static-musl/'
}

bench_soak() {
  ensure_packages haproxy:haproxy openssl:openssl ss:iproute2
  local log; log=$(mktemp /tmp/haptic-soak.XXXXXX)
  if ! cargo bench --quiet --bench soak 2>"$log" | grep '^soak'; then
    tail -40 "$log" >&2
    echo "the soak benchmark failed (its log: $log)" >&2
    return 1
  fi
  rm -f "$log"
}

bench_latency() {
  ensure_packages haproxy:haproxy openssl:openssl ss:iproute2
  local n
  for n in "${@:-1000}"; do
    BENCH_INGRESSES=$n cargo bench --quiet --bench event_latency 2>/dev/null | grep '^latency'
  done
}

# Every figure is printed as it is measured, then once more in a table next to its goal and
# its floor from the same run (scripts/bench-report.py).
report=$(mktemp /tmp/haptic-bench-report.XXXXXX)
trap 'rm -f "$report"' EXIT
{
  case "$which" in
    render) bench_render ;;
    counts) bench_counts ;;
    watch) bench_watch ;;
    latency) shift; bench_latency "$@" ;;
    soak) bench_soak ;;
    idle) bench_idle ;;
    agent) scripts/bench-agent.sh ;;
    all) bench_render; bench_counts; bench_watch; bench_latency 1000 10000; bench_idle; bench_soak; scripts/bench-agent.sh ;;
    *) echo "unknown benchmark $which (render, counts, watch, latency, idle, soak, agent, all)" >&2; exit 2 ;;
  esac
} | tee "$report"
python3 scripts/bench-report.py < "$report"
