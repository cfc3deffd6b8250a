#!/usr/bin/env bash
# Prints the directory holding Debian's prometheus and promtool, unpacked
# from this release's prometheus package (apt-get download, dpkg-deb -x)
# into the cache: nothing is installed and no service starts. Cached by
# the package's version; make alerts uses promtool.
set -euo pipefail
cache=${XDG_CACHE_HOME:-$HOME/.cache}/zfs-nomad
mkdir -p "$cache"
exec 9>"$cache/prometheus.lock"
flock 9

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
candidate() { apt-cache policy prometheus 2>/dev/null | sed -n 's/^ *Candidate: //p'; }
version=$(candidate)
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
  $sudo apt-get update -qq
  version=$(candidate)
fi
[ -n "$version" ] && [ "$version" != "(none)" ] || { echo "prometheus.sh: apt offers no prometheus package" >&2; exit 1; }

dir=$cache/prometheus-$version
if [ ! -x "$dir/usr/bin/promtool" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  chmod 755 "$tmp" # apt's _apt user writes the download there
  if ! (cd "$tmp" && apt-get download -q "prometheus=$version" >/dev/null 2>&1); then
    $sudo apt-get update -qq # a stale list names a version the mirror no longer has
    (cd "$tmp" && apt-get download -q "prometheus=$version" >/dev/null)
  fi
  rm -rf "$dir.tmp"
  dpkg-deb -x "$tmp"/prometheus_*.deb "$dir.tmp"
  mv "$dir.tmp" "$dir"
fi
echo "$dir/usr/bin"
