#!/usr/bin/env bash
# Builds a package of this repository for the libzfs of a Debian release:
# natively when the host runs that release and has its libzfs headers,
# otherwise inside that release's guest chroot (guest/image.sh -c), with
# the host's Go and module cache bind-mounted in a private mount namespace.
# Either way the libzfs version it is built against picks the build (tag
# openzfs_2_2 from OpenZFS 2.2 on: docs/architecture.md, "OpenZFS
# versions") and is stamped into the binary (openzfs.BuiltFor), so
# zfs-node can refuse a host whose ZFS differs.
#
# Usage: gobuild.sh [-r RELEASE] [-t] [-l LDFLAGS] -o OUT PKG
#   -r  bookworm or trixie (default: ZFS_NOMAD_GUEST, else the host's release)
#   -t  build PKG's test binary (go test -c) instead of a program
#   -l  extra linker flags (-X ...)
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
host_release=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
release=${ZFS_NOMAD_GUEST:-$host_release}
mode=build
ldflags=""
out=""
while getopts "r:tl:o:" opt; do
  case "$opt" in
    r) release=$OPTARG ;;
    t) mode=test ;;
    l) ldflags=$OPTARG ;;
    o) out=$OPTARG ;;
    *) echo "usage: gobuild.sh [-r RELEASE] [-t] [-l LDFLAGS] -o OUT PKG" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
pkg=${1:?usage: gobuild.sh [-r RELEASE] [-t] [-l LDFLAGS] -o OUT PKG}
[ -n "$out" ] || { echo "gobuild.sh: -o OUT is required" >&2; exit 2; }
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")

# build runs in the repo, with the libzfs that pkg-config finds where it runs.
build() {
  local version tags="" args
  version=$(pkg-config --modversion libzfs 2>/dev/null || true)
  case "$version" in
    "" | 0.* | 2.0.* | 2.1.*) ;;
    *) tags=openzfs_2_2 ;;
  esac
  args=(-trimpath -tags "$tags" -ldflags "$ldflags -X github.com/zfs-nomad/zfs-nomad/internal/node/zfs/openzfs.BuiltFor=$version" -o "$out")
  cd "$repo"
  if [ "$mode" = test ]; then
    go test -c "${args[@]}" "$pkg"
  else
    go build "${args[@]}" "$pkg"
  fi
}

# Inside the chroot, its os-release names the release: this branch again.
if [ "$release" = "$host_release" ]; then
  build
  exit
fi

# Another release: build in its chroot. The modules are fetched on the host
# first: the chroot has no network configuration of its own.
(cd "$repo" && go mod download)
rootfs=$(ZFS_NOMAD_GUEST=$release "$repo/guest/image.sh" -c)
goroot=$(go env GOROOT)
modcache=$(go env GOMODCACHE)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/zfs-nomad/go-build-$release
mkdir -p "$cache"
export release mode ldflags out pkg repo rootfs goroot modcache cache
unshare -m --propagation private bash -euo pipefail -c '
  for dir in "$goroot" "$modcache" "$cache" "$repo" "$(dirname "$out")"; do
    mkdir -p "$rootfs$dir"
    mount --bind "$dir" "$rootfs$dir"
  done
  for m in proc dev; do mount --bind "/$m" "$rootfs/$m"; done
  chroot "$rootfs" /usr/bin/env -i PATH="$goroot/bin:/usr/sbin:/usr/bin:/sbin:/bin" HOME=/root \
    GOCACHE="$cache" GOMODCACHE="$modcache" GOPROXY=off GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=1 \
    bash "$repo/hack/gobuild.sh" -r "$release" $([ "$mode" = test ] && echo -t) -l "$ldflags" -o "$out" "$pkg"
'
