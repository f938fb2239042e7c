#!/usr/bin/env bash
# Benchmarks for the numbers that matter (never timing assertions in tests).
#
#   scripts/bench.sh            every benchmark
#   scripts/bench.sh render     render time and peak memory of the example config with 1,000
#                               and 10,000 generated routed Services (+ EndpointSlices)
#   scripts/bench.sh watch      list and watch ingest into stores, and store memory, for 10,000
#                               Ingresses + Services + EndpointSlices from the dev API server
#   scripts/bench.sh latency    event-to-traffic latency (EndpointSlice change, new route) with
#                               1,000 Ingresses, through two HAProxy pods and two controllers
#   scripts/bench.sh agent      agent apply latency, runtime- and reload-class changes, on a
#                               1,000-backend config (scripts/bench-agent.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_packages /usr/bin/time:time python3:python3

which=${1:-all}

bench_render() {
  cargo build --quiet --release --bin haptic
  local work; work=$(mktemp -d /tmp/haptic-bench.XXXXXX)
  for n in 1000 10000; do
    python3 - "$n" > "$work/objects-$n.yaml" <<'PY'
import sys
n = int(sys.argv[1])
for i in range(n):
    ns = f"ns{i % 50}"
    print(f"""---
apiVersion: v1
kind: Service
metadata:
  name: svc{i}
  namespace: {ns}
  annotations: {{example.haproxy-haptic.org/host: host{i}.example.com}}
spec: {{ports: [{{port: 80, targetPort: 8080}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc{i}-abc
  namespace: {ns}
  labels: {{kubernetes.io/service-name: svc{i}}}
ports: [{{port: 8080}}]
endpoints:
  - addresses: ["10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"]
    conditions: {{ready: true}}
  - addresses: ["10.{(i + 1) // 65536 % 256}.{(i + 1) // 256 % 256}.{(i + 1) % 256}"]""")
PY
    local out
    out=$( { /usr/bin/time -f "peak_rss_kb=%M wall_s=%e" "${CARGO_TARGET_DIR:-target}/release/haptic" render -f examples/haproxy-template-config.yaml \
      --fixtures "$work/objects-$n.yaml" -o "$work/out-$n" --timings >/dev/null; } 2>&1 )
    echo "render n=$n $(echo "$out" | grep -o 'objects=.*') $(echo "$out" | grep -o 'peak_rss_kb=.*')"
  done
  rm -rf "$work"
}

bench_watch() {
  cargo build --quiet --release -p haptic-dev-apiserver
  cargo bench --quiet --bench watch_ingest 2>/dev/null | grep '^watch-ingest'
}

bench_latency() {
  ensure_packages haproxy:haproxy openssl:openssl ss:iproute2
  cargo bench --quiet --bench event_latency 2>/dev/null | grep '^latency'
}

case "$which" in
  render) bench_render ;;
  watch) bench_watch ;;
  latency) bench_latency ;;
  agent) scripts/bench-agent.sh ;;
  all) bench_render; bench_watch; bench_latency; scripts/bench-agent.sh ;;
  *) echo "unknown benchmark $which (render, watch, latency, agent, all)" >&2; exit 2 ;;
esac
