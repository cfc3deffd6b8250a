#!/usr/bin/env bash
# Prints the path of a Nomad binary for the end-to-end test, building it
# first if the cache lacks it. Nomad is built from the Go module proxy alone
# (no git, no release download): the module zip lacks api/, which nomad's
# go.mod replaces with ./api, so the replace is pointed at the api module
# version published for that release. go build fetches only the modules
# the binary needs. Cold build: see docs/testing.md's figures; the binary
# (about 140 MB) is cached outside the repo, keyed by version and by the
# recipe revision below.
set -euo pipefail
version=${NOMAD_VERSION:-v1.11.1}
# The api module pseudo-version that compiles with each Nomad release.
# The proxy serves api modules of commits on Nomad's main branch only,
# and patch releases were tagged on release branches: v1.10.2 (the
# oldest release the driver supports, docs/install.md) is built with the
# api module of v1.10.5, and v1.9.4 (which places movable volumes but
# sends no secrets with a snapshot delete) with v1.9.3's. Nothing of
# the release itself changes (docs/testing.md, "Nomad versions").
case "$version" in
  v1.11.1) api=v0.0.0-20251216171439-1dee0671280e ;;
  v1.10.5) api=v0.0.0-20250909143645-a3b86c697f38 ;;
  v1.10.2) api=v0.0.0-20250909143645-a3b86c697f38 ;;
  v1.9.4) api=v0.0.0-20241111163541-d92bf1014886 ;;
  *) echo "nomad.sh: no known api version for Nomad $version" >&2; exit 2 ;;
esac
cache=${XDG_CACHE_HOME:-$HOME/.cache}/zfs-nomad
# Bump recipe when the way Nomad is built changes: the cache key follows.
recipe=1
out=$cache/nomad-$version-r$recipe
if [ -x "$out/nomad" ]; then echo "$out/nomad"; exit 0; fi

mkdir -p "$cache"
exec 9>"$cache/nomad.lock"
flock 9
if [ -x "$out/nomad" ]; then echo "$out/nomad"; exit 0; fi
echo "nomad.sh: building Nomad $version (about 6 min on 2 cores, once)" >&2
src=$(mktemp -d)
trap 'chmod -R u+w "$src"; rm -rf "$src"' EXIT
dir=$(go mod download -json "github.com/hashicorp/nomad@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[ -n "$dir" ] || { echo "nomad.sh: go mod download of nomad $version failed" >&2; exit 1; }
cp -r "$dir/." "$src"
chmod -R u+w "$src"
cd "$src"
go mod edit -dropreplace github.com/hashicorp/nomad/api \
  -replace "github.com/hashicorp/nomad/api=github.com/hashicorp/nomad/api@$api"
mkdir -p "$out.tmp"
GOFLAGS=-mod=mod CGO_ENABLED=1 go build -trimpath -o "$out.tmp/nomad" .
rm -rf "$out" && mv "$out.tmp" "$out"
echo "$out/nomad"
