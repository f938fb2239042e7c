#!/usr/bin/env bash
# Runs the whole system on this machine and shows traffic flowing:
#   - haptic-dev-apiserver (the Kubernetes API stand-in) with our CRDs,
#   - two "HAProxy pods": a real HAProxy in master-worker mode plus haptic-agent each, on their
#     own loopback address (127.A.B.20 and .21, A.B from the script's pid, so two demos never
#     share a listener; HAProxy binds "${POD_IP}"), registered as
#     Pod objects whose status this script fills in (there is no kubelet),
#   - two controller replicas (haptic run) electing a leader through a Lease,
#   - sample backends registered as Services and EndpointSlices, Ingresses applied with kubectl.
#
#   scripts/demo.sh           run, print the verified routing table, keep running until Ctrl-C
#   scripts/demo.sh --check   run, verify routing, scale a backend, verify again, tear down
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

check=false
[ "${1:-}" = "--check" ] && check=true

# kubectl: Debian's kubernetes-client (1.20) when none is installed; it and newer ones work
# with the dev API server (its kubectl tests run with both).
ensure_packages haproxy:haproxy curl:curl ss:iproute2 python3:python3 openssl:openssl socat:socat \
  kubectl:kubernetes-client
echo "==> building haptic, haptic-agent, haptic-dev-apiserver"
cargo build --quiet -p haptic -p haptic-agent -p haptic-dev-apiserver --bins
bin="${CARGO_TARGET_DIR:-target}/debug"
repo=$PWD

work=$(mktemp -d /tmp/haptic-demo.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if $check || [ "${KEEP:-}" = "" ]; then rm -rf "$work"; fi
}
trap cleanup EXIT INT TERM
k() { kubectl --kubeconfig "$work/kubeconfig" "$@"; }
fail() { echo "==> demo FAILED: $*"; for f in "$work"/*.log; do echo "--- $f"; tail -n 15 "$f"; done; exit 1; }

# --- API server -------------------------------------------------------------------------------
api_port=$(free_port)
"$bin/haptic-dev-apiserver" --listen "127.0.0.1:$api_port" --kubeconfig-out "$work/kubeconfig" \
  --log-level warn >"$work/ready" 2>"$work/apiserver.log" &
pids+=($!)
for _ in $(seq 100); do grep -q '^ready' "$work/ready" 2>/dev/null && break; sleep 0.1; done
grep -q '^ready' "$work/ready" || fail "the dev API server did not start"
k apply --validate=false -f crds/ >/dev/null

# --- the config: the chart's libraries plus local settings ----------------------------------
http_port=$(free_port); status_port=$(free_port); agent_port=$(free_port)
cat >"$work/local.yaml" <<YAML
apiVersion: haproxy-haptic.org/v1alpha1
kind: HAProxyTemplateConfig
metadata: {name: haptic-demo, namespace: default}
spec:
  podSelector: {matchLabels: {app.kubernetes.io/component: haproxy}}
  controller:
    leaderElection: {leaseDuration: 6s, renewDeadline: 4s, retryPeriod: 1s}
  dataplane: {port: $agent_port, driftPreventionInterval: 10s}
  templatingSettings:
    extraContext: {http_port: $http_port, status_port: $status_port, bind_address: '"\${POD_IP}"', server_slots: 4, server_checks: false}
  validationTests: null
YAML
"$bin/haptic" config merge -f chart/libraries/base.yaml -f chart/libraries/ingress.yaml \
  -f chart/libraries/haproxytech.yaml -f "$work/local.yaml" >"$work/config.yaml"
k apply --validate=false -f "$work/config.yaml" >/dev/null

# --- certificates for the agents' mutual TLS --------------------------------------------------
scripts/gen-certs.sh "$work/certs" >/dev/null
mkdir -p "$work/certs/controller"
cp "$work/certs/controller.crt" "$work/certs/controller/tls.crt"
cp "$work/certs/controller.key" "$work/certs/controller/tls.key"
cp "$work/certs/ca.crt" "$work/certs/controller/ca.crt"

# --- two HAProxy pods ---------------------------------------------------------------------------
# HAProxy binds with SO_REUSEPORT: addresses of this run's own keep two runs from sharing ports.
net=127.$((64 + $$ % 64)).$(( ($$ / 64) % 254 + 1 ))
pod_ips=("$net.20" "$net.21")
for n in 0 1; do
  ip=${pod_ips[$n]}; dir="$work/haproxy-$n"; mkdir -p "$dir/etc"
  printf 'global\n  default-path config\ndefaults\n  mode http\n  timeout client 5s\n  timeout server 5s\n  timeout connect 5s\nfrontend bootstrap\n  bind "${POD_IP}":%s\n  http-request return status 503\n' "$status_port" >"$dir/bootstrap.cfg"
  "$bin/haptic-agent" init --bootstrap "$dir/bootstrap.cfg" --config-dir "$dir/etc" 2>>"$work/agent-$n.log"
  # In the pod's own directory, as the chart's workingDir: relative UNIX sockets land there.
  (cd "$dir" && POD_IP=$ip exec haproxy -W -db -S "$dir/master.sock" -f "$dir/etc/haproxy.cfg") >"$work/haproxy-$n.log" 2>&1 &
  pids+=($!)
  POD_IP=$ip "$bin/haptic-agent" serve --config-dir "$dir/etc" --master-socket "$dir/master.sock" --haproxy-bin haproxy \
    --listen "$ip:$agent_port" --probe-listen "$ip:0" --tls-cert "$work/certs/agent.crt" --tls-key "$work/certs/agent.key" \
    --client-ca "$work/certs/ca.crt" --client-name haptic-controller --log-level warn 2>>"$work/agent-$n.log" &
  pids+=($!)
  k apply --validate=false -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: haproxy-$n, namespace: default, labels: {app.kubernetes.io/component: haproxy}}
spec: {containers: [{name: haproxy, image: haproxy}, {name: haptic-agent, image: haptic-agent}]}
YAML
  # The kubelet's part: mark the pod Running with its IP (PUT to the status subresource;
  # `kubectl patch --subresource` needs kubectl 1.24, Debian ships 1.20).
  k get pod "haproxy-$n" -o json | python3 -c '
import json, sys
pod = json.load(sys.stdin)
pod["status"] = {"phase": "Running", "podIP": sys.argv[1], "containerStatuses": [
    {"name": c, "ready": True, "restartCount": 0, "image": c, "imageID": ""}
    for c in ("haproxy", "haptic-agent")]}
print(json.dumps(pod))' "$ip" | k replace --validate=false --raw "/api/v1/namespaces/default/pods/haproxy-$n/status" -f - >/dev/null
done

# --- two controller replicas -------------------------------------------------------------------
for name in ctrl-a ctrl-b; do
  hp=$(free_port); mp=$(free_port)
  echo "$hp $mp" >"$work/$name.ports"
  LOG_LEVEL=info "$bin/haptic" run --kubeconfig "$work/kubeconfig" --namespace default --pod-name "$name" \
    --config-name haptic-demo --health-port "127.0.0.1:$hp" --metrics-port "127.0.0.1:$mp" --webhook-port 0 \
    --agent-client-cert-dir "$work/certs/controller" --haproxy-bin haproxy 2>"$work/$name.log" &
  pids+=($!)
done

# --- sample backends, Services, EndpointSlices, Ingresses ------------------------------------
backend() {
  python3 - "$1" "$2" <<'PY' &
import http.server, sys
name, port = sys.argv[1], int(sys.argv[2])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"{name} got {self.path}\n".encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
PY
  pids+=($!)
}
declare -A port_of
for b in echo-1 echo-2 hello-1; do port_of[$b]=$(free_port); backend "$b" "${port_of[$b]}"; done

slices() { # slices SERVICE BACKEND...
  local svc=$1; shift
  k delete endpointslices -l "kubernetes.io/service-name=$svc" --ignore-not-found >/dev/null
  local i=0
  for b in "$@"; do
    k apply --validate=false -f - >/dev/null <<YAML
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: $svc-$i, namespace: default, labels: {kubernetes.io/service-name: $svc}}
addressType: IPv4
ports: [{name: http, port: ${port_of[$b]}, protocol: TCP}]
endpoints: [{addresses: ["127.0.0.1"], conditions: {ready: true}}]
YAML
    i=$((i + 1))
  done
}
for svc in echo hello; do
  k apply --validate=false -f - >/dev/null <<YAML
apiVersion: v1
kind: Service
metadata: {name: $svc, namespace: default}
spec: {ports: [{name: http, port: 80, targetPort: 8080}]}
YAML
done
slices echo echo-1
slices hello hello-1
k apply --validate=false -f - >/dev/null <<'YAML'
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: demo, namespace: default}
spec:
  ingressClassName: haproxy
  rules:
  - host: echo.local
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: echo, port: {number: 80}}}}]}
  - host: hello.local
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: hello, port: {number: 80}}}}]}
YAML

# --- verify with real requests -----------------------------------------------------------------
get() { curl -s -m 2 -w ' [%{http_code}]' -H "Host: $2" "http://$1:$http_port$3" 2>/dev/null | tr -d '\n' || true; }
wait_for() { # wait_for IP HOST PATH EXPECTED
  for _ in $(seq 300); do case "$(get "$1" "$2" "$3")" in *"$4"*) return 0 ;; esac; sleep 0.1; done
  return 1
}
verify() { # verify HOST EXPECTED...: every pod answers with one of the expected bodies
  local host=$1; shift
  for ip in "${pod_ips[@]}"; do
    for want in "$@"; do
      wait_for "$ip" "$host" / "$want" || fail "$ip: $host did not answer with $want (got: $(get "$ip" "$host" /))"
    done
    printf '  %-11s via %-15s -> %s\n' "$host" "$ip" "$(get "$ip" "$host" /)"
  done
}
echo "==> routing table, verified with real requests through both HAProxy pods (port $http_port)"
verify echo.local "echo-1 got / [200]"
verify hello.local "hello-1 got / [200]"
verify nowhere.local "[404]"
leader=$(k get lease haptic-leader -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true)
echo "==> leader: ${leader:-none yet}"

workers() { for n in 0 1; do echo "show proc" | socat stdio "UNIX-CONNECT:$work/haproxy-$n/master.sock" | awk '$2 == "worker" {print $1}'; done | tr '\n' ' '; }
before=$(workers)
echo "==> scaling echo to two backends (a runtime change: no HAProxy reload)"
slices echo echo-1 echo-2
verify echo.local "echo-1 got / [200]" "echo-2 got / [200]"
after=$(workers)
[ "$before" = "$after" ] || fail "HAProxy reloaded on an endpoint change (worker pids $before -> $after)"
echo "  HAProxy worker pids unchanged: $after"

if $check; then
  echo "==> demo check passed"
  exit 0
fi
read -r hp _ <"$work/ctrl-a.ports"
cat <<MSG

Everything runs under $work (logs: *.log). Try:
  curl -H 'Host: echo.local' http://${pod_ips[0]}:$http_port/
  kubectl --kubeconfig $work/kubeconfig get ingress,endpointslices,pods,lease,haproxytemplateconfig
  kubectl --kubeconfig $work/kubeconfig edit ingress demo          # routing changes within a second
  kubectl --kubeconfig $work/kubeconfig get haproxycfg -o yaml     # the published configuration
  curl http://127.0.0.1:$hp/debug/pods                               # what the controller deployed where
  kill \$(pgrep -f 'pod-name $leader')                                # kill the leader; the standby takes over

Press Ctrl-C to stop everything.
MSG
KEEP=1
wait
