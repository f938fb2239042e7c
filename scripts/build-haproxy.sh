#!/usr/bin/env bash
# Builds a static HAProxy from Debian's source package, offline except for the Debian mirror the
# machine already uses, for the images scripts/build-images.sh assembles.
#
#   scripts/build-haproxy.sh [--suite SUITE] OUTFILE
#
# The source is the newest `haproxy` source package the machine's apt sources offer (their deb
# lines, read as deb-src lines, with a private apt state: the system's apt configuration is not
# touched). With --suite, the source comes from that Debian suite of the same mirror instead
# (`--suite forky`: HAProxy 3.2, the release the chart's pods run), built against this machine's
# libraries all the same. Debian's patches are applied. The binary is linked statically against glibc, OpenSSL,
# PCRE2 and Lua 5.4 (Debian's static libraries), with the Prometheus exporter and Lua (the Gateway
# library's RequestMirror filter loads a Lua action; the controller's `haproxy -c` must know
# `lua-load`), without dlopen or systemd. Builds are cached under
# $CARGO_TARGET_DIR/haproxy-static/ by source version (`-lua`: builds from before Lua are not reused).
#
# Static glibc and names: the binary resolves host names in a configuration with glibc's built-in
# files and dns lookups (/etc/hosts, /etc/resolv.conf, which Kubernetes mounts into pods; checked:
# a name in /etc/hosts resolves in an empty root). HAPTIC's libraries name servers by address.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

suite=""
if [ "${1:-}" = "--suite" ]; then
  suite=${2:?usage: scripts/build-haproxy.sh [--suite SUITE] OUTFILE}
  shift 2
fi
out=${1:?usage: scripts/build-haproxy.sh [--suite SUITE] OUTFILE}
target_dir=${CARGO_TARGET_DIR:-target}
cache="$target_dir/haproxy-static"
mkdir -p "$cache"

ensure_packages dpkg-source:dpkg-dev make:make cc:gcc
# Static libraries (no command to look for).
for lib in libssl.a:libssl-dev libpcre2-8.a:libpcre2-dev libc.a:libc6-dev liblua5.4.a:liblua5.4-dev; do
  if ! ls /usr/lib/*/"${lib%%:*}" >/dev/null 2>&1; then
    echo "==> installing ${lib#*:}" >&2
    as_root apt-get update -qq
    as_root apt-get install -y -qq "${lib#*:}" >/dev/null
  fi
done

# Debian's static Lua (its headers in /usr/include/lua5.4).
lua_lib=$(dirname "$(ls /usr/lib/*/liblua5.4.a | head -n1)")

work=$(mktemp -d "${TMPDIR:-/tmp}/haptic-haproxy.XXXXXX")
trap 'rm -rf "$work"' EXIT

# A private apt configuration listing the machine's sources as source-package sources.
mkdir -p "$work/apt/parts" "$work/apt/lists/partial" "$work/apt/cache/archives/partial"
for f in /etc/apt/sources.list.d/*.sources; do
  [ -e "$f" ] || continue
  sed -E 's/^Types:.*\bdeb\b.*/Types: deb-src/' "$f" >"$work/apt/parts/$(basename "$f")"
done
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
  [ -e "$f" ] || continue
  sed -nE 's/^deb (.*)/deb-src \1/p' "$f" >"$work/apt/parts/$(basename "$f").list"
done
if [ -n "$suite" ]; then
  # The first Debian archive among the machine's sources, with SUITE alone.
  mirror=$(cat "$work"/apt/parts/* 2>/dev/null | grep -oE 'https?://[^ ]*/debian/?( |$)' | head -n1 | tr -d ' ')
  [ -n "$mirror" ] || { echo "build-haproxy: no Debian archive in the apt sources" >&2; exit 1; }
  rm -f "$work"/apt/parts/*
  printf 'deb-src %s %s main\n' "$mirror" "$suite" >"$work/apt/parts/suite.list"
fi
apt_src() {
  apt-get -q -o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$work/apt/parts" \
    -o Dir::State::Lists="$work/apt/lists" -o Dir::Cache="$work/apt/cache" \
    -o APT::Sandbox::User=root "$@"
}
apt_src update -qq >/dev/null 2>&1 || apt_src update -qq
versions=$(apt-cache -o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$work/apt/parts" \
  -o Dir::State::Lists="$work/apt/lists" -o Dir::Cache="$work/apt/cache" showsrc haproxy |
  sed -n 's/^Version: //p' | sort -rV | uniq)
[ -n "$versions" ] || { echo "build-haproxy: no haproxy source package in the apt sources" >&2; exit 1; }

# The newest version that is cached or can be downloaded (a mirror may serve the index of a suite
# but not its files, as the security archive does behind some package proxies).
version=""
for v in $versions; do
  if [ -x "$cache/haproxy-$v" ]; then
    version=$v
    break
  fi
  if (cd "$work" && apt_src source -qq "haproxy=$v" >"$work/source.log" 2>&1); then
    version=$v
    break
  fi
  echo "build-haproxy: haproxy $v: source not downloadable, trying an older one" >&2
done
[ -n "$version" ] || { cat "$work/source.log" >&2; echo "build-haproxy: no haproxy source could be downloaded" >&2; exit 1; }

if [ ! -x "$cache/haproxy-$version-lua" ]; then
  src=$(find "$work" -maxdepth 1 -type d -name 'haproxy-*' | head -n1)
  echo "==> building static haproxy $version (Debian source package)"
  upstream=${version%%-*}
  jobs=$(nproc 2>/dev/null || echo 2)
  make -C "$src" -j"$jobs" TARGET=linux-glibc \
    USE_OPENSSL=1 USE_PCRE2=1 USE_PCRE2_JIT=1 USE_PROMEX=1 USE_SLZ=1 \
    USE_LUA=1 LUA_INC=/usr/include/lua5.4 LUA_LIB="$lua_lib" LUA_LIB_NAME=lua5.4 \
    USE_DL= USE_SYSTEMD= USE_LIBCRYPT= USE_GETADDRINFO= \
    VERSION="$upstream" SUBVERS="-${version#*-}" \
    LDFLAGS="-static -s" >"$work/build.log" 2>&1 || { tail -40 "$work/build.log" >&2; exit 1; }
  file -b "$src/haproxy" | grep -q "statically linked" || { echo "build-haproxy: not static" >&2; exit 1; }
  "$src/haproxy" -vv | grep -q "Built with Lua version" || { echo "build-haproxy: no Lua" >&2; exit 1; }
  # Atomic: a concurrent build of the same version writes the same file.
  cp "$src/haproxy" "$cache/.haproxy-$version-lua.$$"
  mv -f "$cache/.haproxy-$version-lua.$$" "$cache/haproxy-$version-lua"
fi

mkdir -p "$(dirname "$out")"
cp "$cache/haproxy-$version-lua" "$out"
printf '%s\thaproxy %s, %s bytes\n' "$out" "$version" "$(stat -c %s "$out")"
