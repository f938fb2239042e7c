#!/usr/bin/env bash
# Prepares HAProxy 3.2, the release the chart's pods run, for the tests, and prints the path of
# its binary:
#
#   scripts/haproxy-3.2.sh            # e.g. target/haproxy-forky/3.2.26-1/haproxy
#
# Debian's stable (bookworm) ships 2.6, and the mirror serves no source of a newer one, so this
# takes Debian forky's binary package `haproxy` and the libraries it links (glibc, OpenSSL, PCRE2,
# Lua, jemalloc, …) from the same suite, through apt with a private state (the signed InRelease
# and the package hashes are checked as apt always does; the system's apt configuration is not
# touched). forky (Debian testing) is asked first, then sid and trixie-backports, for the
# first that offers a 3.2. The packages are unpacked under
# $CARGO_TARGET_DIR/haproxy-forky/<version>/root, and
# the binary gets that root's dynamic loader and libraries (patchelf), since this machine's are
# older. Nothing is installed system-wide. Once one is cached it is used as it is (remove
# $CARGO_TARGET_DIR/haproxy-forky/ to take the suite's newest 3.2 again), so runs after the first
# need no network.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

target_dir=${CARGO_TARGET_DIR:-target}
mkdir -p "$target_dir/haproxy-forky"
cache=$(cd "$target_dir/haproxy-forky" && pwd)

ensure_packages patchelf:patchelf dpkg-deb:dpkg flock:util-linux >&2

work=$(mktemp -d "${TMPDIR:-/tmp}/haptic-haproxy32.XXXXXX")
staging=""
trap 'rm -rf "$work" ${staging:+"$staging"}' EXIT

# One preparation at a time (two test runs on one machine share the cache).
exec 9>"$cache/.lock"
flock 9

# Whether the binary $1 runs and is a 3.2. Its whole output is read first: with pipefail, a
# pipe into `head`/`grep -q` that closes early fails on the binary's SIGPIPE, which made a
# working cached binary look broken, and another run's tests then lost it to a fresh download.
is_32() {
  local out
  out=$("$1" -v 2>/dev/null) || return 1
  case "$out" in
    *"version 3.2."*) return 0 ;;
    *) return 1 ;;
  esac
}

# A cached version that runs (only finished ones: `<version>/haproxy`).
newest_cached() {
  local bin
  for bin in $(find "$cache" -mindepth 2 -maxdepth 2 -path "$cache/[0-9]*/haproxy" -type f 2>/dev/null | sort -rV); do
    if is_32 "$bin"; then
      echo "$bin"
      return
    fi
  done
}

cached=$(newest_cached)
if [ -n "$cached" ]; then
  echo "$cached"
  exit 0
fi

# A private apt configuration: the first Debian archive among the machine's sources, with the
# first of these suites that has a 3.2 (forky is Debian testing, which moves on one day).
mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
  | grep -oE 'https?://[^ ]*/debian/?( |$)' | head -n1 | tr -d ' ' || true)
[ -n "$mirror" ] || { echo "haproxy-3.2: no Debian archive in the apt sources" >&2; exit 1; }
apt_priv() {
  apt-get -q -o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$work/apt/parts" \
    -o Dir::State::Lists="$work/apt/lists" -o Dir::Cache="$work/apt/cache" \
    -o Dir::State::status="$work/status" -o APT::Sandbox::User=root "$@"
}
apt_cache_priv() {
  apt-cache -o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$work/apt/parts" \
    -o Dir::State::Lists="$work/apt/lists" -o Dir::Cache="$work/apt/cache" \
    -o Dir::State::status="$work/status" "$@"
}
suite=""
for candidate in forky sid trixie-backports; do
  rm -rf "$work/apt"
  mkdir -p "$work/apt/parts" "$work/apt/lists/partial" "$work/apt/cache/archives/partial"
  printf 'deb [arch=amd64] %s %s main\n' "$mirror" "$candidate" >"$work/apt/parts/suite.list"
  # A backports suite holds only what it backports: its base suite has the libraries.
  case "$candidate" in
    *-backports) printf 'deb [arch=amd64] %s %s main\n' "$mirror" "${candidate%-backports}" >>"$work/apt/parts/suite.list" ;;
  esac
  : >"$work/status"
  apt_priv update -qq >"$work/update.log" 2>&1 || { cat "$work/update.log" >&2; continue; }
  case "$(apt_cache_priv show --no-all-versions haproxy 2>/dev/null | sed -n 's/^Version: //p' | head -n1)" in
    3.2.*) suite=$candidate; break ;;
  esac
done
[ -n "$suite" ] || { echo "haproxy-3.2: no Debian suite of $mirror offers haproxy 3.2 (tried forky, sid, trixie-backports)" >&2; exit 1; }
mkdir -p "$work/debs"

# haproxy and the closure of the libraries it depends on (lib* and their gcc base packages;
# maintainer-script tools such as adduser are not needed to run the binary).
# One `apt-cache show` per package: haproxy, then the packages its Depends name, breadth first.
packages="" todo="haproxy" seen=" "
while [ -n "$todo" ]; do
  set -- $todo
  name=$1
  shift
  todo="$*"
  case "$seen" in *" $name "*) continue ;; esac
  seen="$seen$name "
  case "$name" in haproxy | lib* | gcc-*-base | zlib1g | openssl-provider-legacy) ;; *) continue ;; esac
  fields=$(apt_cache_priv show --no-all-versions "$name" 2>/dev/null || true)
  v=$(printf '%s\n' "$fields" | sed -n 's/^Version: //p' | head -n1)
  [ -n "$v" ] || { echo "haproxy-3.2: $suite has no package $name, which haproxy needs" >&2; exit 1; }
  packages="$packages $name=$v"
  deps=$(printf '%s\n' "$fields" | sed -n 's/^\(Pre-\)\{0,1\}Depends: //p' | tr ',' '\n' \
    | sed -E 's/\|.*//; s/^ *//; s/[ (:].*//' | grep -v '^$' || true)
  todo="$todo $deps"
done
version=$(printf '%s\n' $packages | sed -n 's/^haproxy=//p')
[ -n "$version" ] || { echo "haproxy-3.2: no haproxy package in $suite" >&2; exit 1; }
case "$version" in 3.2.*) ;; *) echo "haproxy-3.2: $suite has haproxy $version, not 3.2" >&2; exit 1 ;; esac
echo "==> HAProxy $version from Debian $suite (for the tests with the chart's HAProxy release)" >&2
(cd "$work/debs" && apt_priv download -qq $packages >"$work/download.log" 2>&1) \
  || { cat "$work/download.log" >&2; exit 1; }
mkdir -p "$work/out/root"
for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$work/out/root"; done
# The final place, so that the paths written into the binary hold; then moved there at once
# (runs are serialised by the lock).
final="$cache/$version"
staging="$cache/.staging.$$"
rm -rf "$staging" "$final"
mv "$work/out" "$staging"
lib="$final/root/usr/lib/x86_64-linux-gnu"
cp "$staging/root/usr/sbin/haproxy" "$staging/haproxy"
patchelf --set-interpreter "$lib/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$lib" "$staging/haproxy"
mv -T "$staging" "$final"
staging=""
if ! is_32 "$final/haproxy"; then
  echo "haproxy-3.2: $final/haproxy does not run" >&2
  "$final/haproxy" -v >&2 || true
  rm -rf "$final"
  exit 1
fi
echo "$final/haproxy"
