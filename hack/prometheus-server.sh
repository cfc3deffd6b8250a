#!/usr/bin/env bash
# Prints the path of a Prometheus server for test/nomad, building it first
# if the cache lacks it. Debian's prometheus package (hack/prometheus.sh,
# whose promtool make alerts uses) is built without Nomad's service
# discovery, which the test must run as docs/monitoring.md configures it,
# so the server is built from the Go module proxy alone: the module
# github.com/prometheus/prometheus at the version below (v0.316.0 is
# Prometheus 3.16), its cmd/prometheus without the web UI's assets (the
# HTTP API, which the test asks, needs none) and with no service discovery
# but Nomad's (Prometheus's own build tags remove_all_sd and
# enable_nomad_sd: Kubernetes', the clouds' and the others' code is
# neither downloaded nor compiled). go build fetches only the modules the
# binary needs. Cold build: see docs/testing.md's figures; the binary is
# cached outside the repo, keyed by version and by the recipe revision
# below.
set -euo pipefail
version=${PROMETHEUS_MODULE_VERSION:-v0.316.0}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/zfs-nomad
# Bump recipe when the way Prometheus is built changes: the cache key follows.
recipe=2
out=$cache/prometheus-server-$version-r$recipe
if [ -x "$out/prometheus" ]; then echo "$out/prometheus"; exit 0; fi

mkdir -p "$cache"
exec 9>"$cache/prometheus-server.lock"
flock 9
if [ -x "$out/prometheus" ]; then echo "$out/prometheus"; exit 0; fi
echo "prometheus-server.sh: building Prometheus $version (about 3 min on 2 cores, once)" >&2
src=$(mktemp -d)
trap 'chmod -R u+w "$src"; rm -rf "$src"' EXIT
dir=$(go mod download -json "github.com/prometheus/prometheus@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[ -n "$dir" ] || { echo "prometheus-server.sh: go mod download of prometheus $version failed" >&2; exit 1; }
cp -r "$dir/." "$src"
chmod -R u+w "$src"
cd "$src"
# The module's go.work names directories its zip lacks.
export GOWORK=off GOFLAGS=-mod=mod
mkdir -p "$out.tmp"
CGO_ENABLED=0 go build -trimpath -tags remove_all_sd,enable_nomad_sd -o "$out.tmp/prometheus" ./cmd/prometheus
rm -rf "$out" && mv "$out.tmp" "$out"
echo "$out/prometheus"
