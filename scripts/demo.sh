#!/usr/bin/env bash
# Runs HAPTIC locally and shows traffic flowing: renders the example config against sample
# Services and EndpointSlices, starts a real HAProxy on the result in front of two sample
# backends, and sends real requests through it.
#
#   scripts/demo.sh           run, show the routing, keep serving until Ctrl-C
#   scripts/demo.sh --check   run, verify routing, tear down, exit 0 or 1
#
# Today this is the offline path (haptic render + haproxy). The controller, agent and dev API
# server join it as they land.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

check=false
[ "${1:-}" = "--check" ] && check=true

ensure_packages haproxy:haproxy curl:curl ss:iproute2 python3:python3
echo "==> building haptic"
cargo build --quiet --bin haptic
haptic="${CARGO_TARGET_DIR:-target}/debug/haptic"

work=$(mktemp -d /tmp/haptic-demo.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

# Two sample backends that say who they are and what they received.
backend() {
  python3 - "$1" "$2" <<'PY' &
import http.server, sys
name, port = sys.argv[1], int(sys.argv[2])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"{name} got {self.path} for host {self.headers.get('Host')}\n".encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
PY
  pids+=($!)
}
echo_port=$(free_port); backend echo "$echo_port"
hello_port=$(free_port); backend hello "$hello_port"
http_port=$(free_port)

# Sample cluster state: the example fixtures, pointed at the backends' real ports.
mkdir -p "$work/fixtures"
for f in examples/fixtures/*.yaml; do
  sed -e "s/18081/$echo_port/g" -e "s/18082/$hello_port/g" "$f" > "$work/fixtures/$(basename "$f")"
done

echo "==> rendering examples/haproxy-template-config.yaml"
"$haptic" render -f examples/haproxy-template-config.yaml --fixtures "$work/fixtures" \
  -o "$work/haproxy" --extra-context "http_port=$http_port" --extra-context bind_address=127.0.0.1 --validate

haproxy -db -f "$work/haproxy/haproxy.cfg" >"$work/haproxy.log" 2>&1 &
pids+=($!)
wait_for_port "$echo_port"; wait_for_port "$hello_port"; wait_for_port "$http_port"

echo "==> routing table, verified with real requests through HAProxy on 127.0.0.1:$http_port"
ok=true
route() {
  local host=$1 expect=$2 got
  got=$(curl -s -w " [%{http_code}]" -H "Host: $host" "http://127.0.0.1:$http_port/demo" | tr -d "\n" || true)
  printf '  %-14s -> %s\n' "$host" "$got"
  case "$got" in *"$expect"*) ;; *) echo "     expected: $expect" ; ok=false ;; esac
}
route echo.local "echo got /demo for host echo.local [200]"
route hello.local "hello got /demo for host hello.local [200]"
route other.local "no route for this host [404]"

if $check; then
  $ok && echo "==> demo check passed" || { echo "==> demo check FAILED"; cat "$work/haproxy.log" "$work/haproxy/haproxy.cfg"; exit 1; }
  exit 0
fi
$ok || { echo "routing is not as expected; HAProxy log:"; cat "$work/haproxy.log"; exit 1; }
cat <<MSG

Try it:
  curl -H 'Host: echo.local'  http://127.0.0.1:$http_port/
  curl -H 'Host: hello.local' http://127.0.0.1:$http_port/
  less $work/haproxy/haproxy.cfg $work/haproxy/maps/hosts.map

Press Ctrl-C to stop everything.
MSG
wait
