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
