#!/usr/bin/env bash
# Apply latency of haptic-agent against a real HAProxy (master-worker) with a 1,000-backend
# configuration (10 server slots each, a 1,000-entry host map):
#   - runtime-class change: one endpoint moves to another address (no reload)
#   - reload-class change:  one backend's balance algorithm flips (reload, new worker), pushed
#                           as is (the agent checks it) and with X-Haptic-Checked-With naming
#                           the running release (the controller checked it; no second check)
# Latency is measured at the client (curl over mutual TLS, PUT /v1/bundle) and as reported by
# the agent (timings_ms: validate = haproxy -c, runtime, reload, total).
#
# usage: scripts/bench-agent.sh [ROUNDS]        (default 5 rounds of each)
# env:   BACKENDS (default 1000), SLOTS (default 10), HAPROXY (default /usr/sbin/haproxy),
#        CARGO_TARGET_DIR (where the release build goes)
set -euo pipefail

rounds=${1:-5}
backends=${BACKENDS:-1000}
slots=${SLOTS:-10}
haproxy=${HAPROXY:-/usr/sbin/haproxy}
repo=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}

command -v "$haproxy" >/dev/null || { echo "bench-agent: $haproxy not found (apt-get install haproxy)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "bench-agent: python3 is needed to generate the bundles" >&2; exit 1; }

echo "building haptic-agent (release)..." >&2
(cd "$repo" && cargo build --quiet --release -p haptic-agent --bin haptic-agent)
agent_bin=$target/release/haptic-agent

work=$(mktemp -d /tmp/haptic-bench-agent.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
fe_port=$(free_port); api_port=$(free_port); probe_port=$(free_port)

AGENT_SANS="DNS:haptic-agent,IP:127.0.0.1" "$repo/scripts/gen-certs.sh" "$work/certs" >/dev/null
mkdir -p "$work/cfg"

# gen.py VARIANT OUT: writes a bundle (JSON) for the variant.
#   base       : SRV_1 of every backend at 10.0.<i>.1:8080, the other slots placeholders
#   move-N     : like base, but backend 500's SRV_1 at 10.9.9.<N>:8080         (runtime)
#   balance-N  : like base, but backend 500 uses `balance leastconn` (N odd)   (reload)
cat > "$work/gen.py" <<'PY'
import json, sys
variant, out, cfg_dir, fe_port, backends, slots = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
kind, _, n = variant.partition("-")
n = int(n or 0)
lines = ["global", "    stats timeout 10s", "    hard-stop-after 30s",
         "defaults", "    mode http", "    timeout connect 1s", "    timeout client 5s", "    timeout server 5s",
         "frontend fe", f"    bind 127.0.0.1:{fe_port}",
         f"    use_backend %[req.hdr(host),lower,map({cfg_dir}/maps/host.map,be_0)]"]
for b in range(backends):
    lines.append(f"backend be_{b}")
    lines.append("    balance " + ("leastconn" if kind == "balance" and b == 500 and n % 2 == 1 else "roundrobin"))
    for s in range(1, slots + 1):
        if s == 1:
            addr = f"10.9.9.{n % 250 + 1}:8080" if kind == "move" and b == 500 else f"10.{b // 250}.{b % 250}.1:8080"
            lines.append(f"    server SRV_{s} {addr} enabled weight 10 # Pod: web-{b}")
        else:
            lines.append(f"    server SRV_{s} 127.0.0.1:1 disabled weight 10")
host_map = "".join(f"host{b}.example be_{b}\n" for b in range(backends))
bundle = {"haproxy_cfg": "\n".join(lines) + "\n", "files": [{"kind": "map", "path": "maps/host.map", "content": host_map}]}
with open(out, "w") as f:
    json.dump(bundle, f)
PY
gen() { python3 "$work/gen.py" "$1" "$work/$1.json" "$work/cfg" "$fe_port" "$backends" "$slots"; }

cat > "$work/cfg/haproxy.cfg" <<EOF
global
    stats timeout 10s
defaults
    mode http
    timeout client 5s
    timeout server 5s
    timeout connect 1s
frontend fe
    bind 127.0.0.1:$fe_port
    http-request return status 200 content-type text/plain string bootstrap
EOF

(cd "$work/cfg" && exec "$haproxy" -W -db -S "$work/master.sock" -f "$work/cfg/haproxy.cfg" >"$work/haproxy.log" 2>&1) &
pids+=($!)
"$agent_bin" serve --config-dir "$work/cfg" --master-socket "$work/master.sock" --haproxy-bin "$haproxy" \
  --listen "127.0.0.1:$api_port" --probe-listen "127.0.0.1:$probe_port" \
  --tls-cert "$work/certs/agent.crt" --tls-key "$work/certs/agent.key" --client-ca "$work/certs/ca.crt" \
  --log-level warn 2>"$work/agent.log" &
pids+=($!)

for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$probe_port/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -sf "http://127.0.0.1:$probe_port/healthz" >/dev/null || { echo "agent did not start:" >&2; cat "$work/agent.log" >&2; exit 1; }

# put FILE [HEADER] -> prints "client_ms result validate runtime reload total"
put() {
  local out
  out=$(curl -sS --cacert "$work/certs/ca.crt" --cert "$work/certs/controller.crt" --key "$work/certs/controller.key" \
    -X PUT --data-binary "@$1" -H 'Content-Type: application/json' -H 'Expect:' ${2:+-H "$2"} \
    -w '\n%{time_total}' "https://127.0.0.1:$api_port/v1/bundle")
  python3 - "$out" <<'PY'
import json, sys
body, _, t = sys.argv[1].rpartition("\n")
r = json.loads(body)
if "result" not in r:
    sys.exit(f"apply failed: {r}")
tm = r.get("timings_ms", {})
print(round(float(t) * 1000), r["result"], *(tm.get(k, 0) for k in ("validate", "runtime", "reload", "total")))
PY
}

gen base
size=$(wc -c < "$work/base.json")
lines=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["haproxy_cfg"].count("\n"))' "$work/base.json")
echo "config: $backends backends x $slots slots, $lines lines, bundle $((size / 1024)) KiB; HAProxy $("$haproxy" -v | head -1 | awk '{print $3}')"
read -r ms result _ <<<"$(put "$work/base.json")"
echo "initial apply (bootstrap -> bundle): ${ms} ms ($result)"

summary() { # label file-with-rows
  python3 - "$1" "$2" <<'PY'
import statistics, sys
label, path = sys.argv[1], sys.argv[2]
rows = [l.split() for l in open(path) if l.strip()]
results = sorted({r[1] for r in rows})
cols = {"client": 0, "validate": 2, "runtime": 3, "reload": 4, "agent_total": 5}
parts = []
for name, i in cols.items():
    vals = [int(r[i]) for r in rows]
    parts.append(f"{name} median {statistics.median(vals):.0f} ms (min {min(vals)}, max {max(vals)})")
print(f"{label} [{len(rows)} rounds, result={','.join(results)}]:\n  " + "\n  ".join(parts))
PY
}

: > "$work/runtime.rows"
for i in $(seq "$rounds"); do gen "move-$i"; put "$work/move-$i.json" >> "$work/runtime.rows"; done
# The two kinds of reload alternate, so that drift on a busy machine affects both alike.
release=$("$haproxy" -v | head -1 | awk '{print $3}')
: > "$work/reload.rows"
: > "$work/reload-checked.rows"
for i in $(seq "$rounds"); do
  gen "balance-$((2 * i - 1))"; put "$work/balance-$((2 * i - 1)).json" >> "$work/reload.rows"
  gen "balance-$((2 * i))"
  put "$work/balance-$((2 * i)).json" "X-Haptic-Checked-With: $release" >> "$work/reload-checked.rows"
done


summary "runtime-class change (endpoint move, 1 server)" "$work/runtime.rows"
summary "reload-class change (balance algorithm of 1 backend)" "$work/reload.rows"
summary "reload-class change checked by the controller (X-Haptic-Checked-With)" "$work/reload-checked.rows"
