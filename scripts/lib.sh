# Shared shell helpers for the scripts (sourced, not run).

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# ensure_packages CMD:PACKAGE … installs the Debian package of every missing command.
ensure_packages() {
  local missing=() pair
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "==> installing ${missing[*]}" >&2
    as_root apt-get update -qq
    as_root apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# free_port prints a TCP port on 127.0.0.1 that nothing listens on. HAProxy binds with
# SO_REUSEPORT, so a port is also checked against every listener `ss` reports.
free_port() {
  local port
  while :; do
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
    if ! ss -ltnH 2>/dev/null | awk '{print $4}' | grep -qE "[:.]${port}\$"; then
      echo "$port"
      return
    fi
  done
}

# wait_for_port PORT [SECONDS]: waits until something accepts connections on 127.0.0.1:PORT.
wait_for_port() {
  local port=$1 deadline=$((SECONDS + ${2:-10}))
  until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || { echo "nothing listens on 127.0.0.1:$port" >&2; return 1; }
    sleep 0.05
  done
}

# The tests' Python packages, in .venv/ (created or completed on first use; a lock keeps two
# runs at once from installing into it together): the Helm SDK and kubernetes-validate for the
# chart tests, grpcio for the GRPCRoute traffic test.
ensure_venv() {
  # Debian splits venv's pip bootstrap into python3-venv.
  python3 -c 'import ensurepip' 2>/dev/null || { as_root apt-get update -qq; as_root apt-get install -y -qq python3-venv >/dev/null; }
  (
    flock 9
    if ! .venv/bin/python -c 'import helm_python, kubernetes_validate, yaml, jsonschema, grpc' 2>/dev/null; then
      echo "==> preparing .venv (helm-python-sdk, kubernetes-validate, pyyaml, grpcio)"
      [ -x .venv/bin/python ] || python3 -m venv .venv
      .venv/bin/pip install -q helm-python-sdk kubernetes-validate pyyaml grpcio
    fi
  ) 9>.venv.lock
}
