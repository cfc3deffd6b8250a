#!/usr/bin/env bash
# Builds the container images from docker/Dockerfile.controller and
# docker/Dockerfile.node with buildah, then runs each image's entrypoint with
# --version and fails unless it prints the binary's name and VERSION.
#
# No container registry is needed: the Dockerfiles' base images are build
# arguments, and this script passes local stand-ins built from Debian's
# mirrors and the host's Go toolchain (docker/local/):
#   localhost/zfs-nomad-base:RELEASE-KEY   debootstrap RELEASE (for
#       debian:RELEASE-slim)
#   scratch for the controller's distroless image: the controller is one
#       static binary that reads nothing of the image's but itself
#   localhost/zfs-nomad-go:goX-RELEASE-KEY base + gcc + the host's Go
#       (for golang:1.26-RELEASE)
# Each is keyed by a hash of its recipe and built only when missing; the base
# root filesystem is cached as ~/.cache/zfs-nomad/base-KEY/rootfs.tar. Go
# modules come from the host's module cache (go mod download first), Go's
# build cache for the images is ~/.cache/zfs-nomad/images-go-build.
#
# Output: localhost/zfs-nomad/zfs-controller:TAG and
# localhost/zfs-nomad/zfs-node:TAG (TAG defaults to dev) in buildah's storage
# (/var/lib/containers/storage as root); a summary on stdout. With
# ARCHIVE_DIR set, also ARCHIVE_DIR/zfs-controller.tar and zfs-node.tar:
# docker-archive files that `docker load -i` takes, each image keeping its
# name (the guest's Nomad test loads them; make release ships them).
#
# Environment: VERSION (default: git describe, as the Makefile), TAG,
# DEBIAN_RELEASE (bookworm, the default: OpenZFS 2.1; or trixie: 2.3; the
# node image's OpenZFS, which must be the series of the hosts' kernel
# module), IMAGES (default "zfs-controller zfs-node": which to build),
# BUILDAH_ISOLATION (default chroot: no OCI runtime or systemd needed),
# STORAGE_DRIVER (buildah's default is overlay; vfs where overlay is not
# supported, e.g. inside another container; the storage must be new or
# already of that driver), DEBIAN_MIRROR.
# Runs as root (buildah, debootstrap). Idempotent; holds a lock so that two
# runs do not build at once.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/zfs-nomad
version=${VERSION:-$(git -C "$repo" describe --tags --always --dirty 2>/dev/null || echo dev)}
tag=${TAG:-dev}
release=${DEBIAN_RELEASE:-bookworm}
images=${IMAGES:-zfs-controller zfs-node}
export BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}

log() { printf 'images: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
# Runs a command with its output in a log, shown (the end of it) on failure.
quiet() {
  local out
  out=$(mktemp)
  if ! "$@" >"$out" 2>&1; then
    tail -40 "$out" >&2
    rm -f "$out"
    die "failed: $*"
  fi
  rm -f "$out"
}
key() { cat "$@" | sha256sum | cut -c1-16; }
# bah: buildah with STORAGE_DRIVER as its option (buildah 1.28 reads no such
# variable itself).
buildah_opts=()
[ -z "${STORAGE_DRIVER:-}" ] || buildah_opts=(--storage-driver "$STORAGE_DRIVER")
bah() { buildah "${buildah_opts[@]}" "$@"; }
have_image() { bah inspect --type image "$1" >/dev/null 2>&1; }

[ "$(id -u)" -eq 0 ] || die "run as root (buildah and debootstrap need it)"
command -v go >/dev/null || die "go not found on PATH"
"$repo/hack/install-host-deps.sh" buildah

mkdir -p "$cache"
exec 9>"$cache/images.lock"
flock 9

case "$release" in bookworm | trixie) ;; *) die "DEBIAN_RELEASE must be bookworm or trixie, not '$release'" ;; esac
wants() { [[ " $images " == *" $1 "* ]]; }

# The Debian base.
base_key=$(echo "$release" | key - "$repo/docker/local/base-rootfs.sh")
base=localhost/zfs-nomad-base:$release-$base_key
if ! have_image "$base"; then
  tarball=$cache/base-$base_key/rootfs.tar
  if [ ! -s "$tarball" ]; then
    log "no cached Debian base for this recipe: debootstrap $release (about 1-2 min, once)"
    mkdir -p "$(dirname "$tarball")"
    "$repo/docker/local/base-rootfs.sh" "$release" "$tarball"
  fi
  log "importing $base"
  ctr=$(bah from --pull=never scratch)
  quiet bah add "$ctr" "$tarball" /
  quiet bah config --cmd /bin/bash "$ctr"
  quiet bah commit --rm "$ctr" "$base"
fi

# The Go builder: base + gcc + the host's Go toolchain.
goroot=$(go env GOROOT)
gover=$(go env GOVERSION)
go_key=$(printf '%s %s\n' "$base_key" "$gover" | cat - "$repo/docker/local/Dockerfile.golang" | sha256sum | cut -c1-16)
goimage=localhost/zfs-nomad-go:$gover-$release-$go_key
if ! have_image "$goimage"; then
  log "building $goimage from the host's $gover (about 1 min, once)"
  quiet bah build --pull=never --layers -f "$repo/docker/local/Dockerfile.golang" \
    --build-arg "BASE_IMAGE=$base" --build-context "goroot=$goroot" -t "$goimage" "$repo/docker/local"
fi

# The module cache the builds read (GOPROXY=off inside).
modcache=$(go env GOMODCACHE)
(cd "$repo" && quiet go mod download)
gocache=$cache/images-go-build
mkdir -p "$gocache"

build() { # NAME DOCKERFILE BUILD-ARGS...
  local name=$1 file=$2
  shift 2
  # --force-rm: a failed step leaves no container behind to block the prune below.
  quiet bah build --pull=never --layers --force-rm -f "$file" \
    --build-arg "GO_IMAGE=$goimage" --build-arg "VERSION=$version" "$@" \
    -v "$modcache:/go/pkg/mod" -v "$gocache:/root/.cache/go-build" \
    -t "localhost/zfs-nomad/$name:$tag" "$repo"
}
! wants zfs-controller || build zfs-controller "$repo/docker/Dockerfile.controller" --build-arg "RUNTIME_IMAGE=scratch"
! wants zfs-node || build zfs-node "$repo/docker/Dockerfile.node" --build-arg "BASE_IMAGE=$base"

# Each image's entrypoint with --version, as `docker run IMAGE --version`
# would; in the node image also the zfs command zfs-node runs, and the
# OpenZFS version the image's libzfs comes from.
check() { # NAME [COMMAND...]: prints the --version line, then COMMAND's output
  local name=$1 image=localhost/zfs-nomad/$1:$tag entry ctr out
  shift
  entry=$(bah inspect --type image --format '{{range .OCIv1.Config.Entrypoint}}{{.}} {{end}}' "$image")
  [ -n "$entry" ] || die "$image has no entrypoint"
  ctr=$(bah from --pull=never "$image")
  # shellcheck disable=SC2086 # the entrypoint's words
  out=$(bah run "$ctr" -- $entry --version 2>&1) || { bah rm "$ctr" >/dev/null; die "$image: ${entry}--version failed: $out"; }
  case "$out" in
    "$name $version" | "$name $version ("*) ;; # the node adds the OpenZFS it was built for
    *) bah rm "$ctr" >/dev/null; die "$image: ${entry}--version printed '$out', want '$name $version'" ;;
  esac
  printf '%s' "$out"
  if [ $# -gt 0 ]; then
    out=$(bah run "$ctr" -- "$@" 2>&1) || { bah rm "$ctr" >/dev/null; die "$image: $* failed: $out"; }
    printf ', %s' "$out"
  fi
  bah rm "$ctr" >/dev/null
}
summary=()
if wants zfs-controller; then
  summary+=("localhost/zfs-nomad/zfs-controller:$tag  --version: $(check zfs-controller)")
fi
if wants zfs-node; then
  # shellcheck disable=SC2016 # for dpkg-query, not the shell
  node=$(check zfs-node sh -ec 'test -x "$(command -v zfs)"; dpkg-query -W -f="zfsutils-linux \${Version}" zfsutils-linux')
  # The node's libzfs build and the image's zfs command must be one OpenZFS
  # series: zfs-node refuses to start otherwise.
  built=$(sed -n 's/.*built for OpenZFS \([0-9]*\.[0-9]*\).*/\1/p' <<<"$node")
  have=$(sed -n 's/.*zfsutils-linux \([0-9]*\.[0-9]*\).*/\1/p' <<<"$node")
  [ -n "$built" ] && [ "$built" = "$have" ] || die "zfs-node image: zfs-node was built for OpenZFS '$built' but the image's zfsutils is '$have': $node"
  summary+=("localhost/zfs-nomad/zfs-node:$tag ($release)  --version: $node")
fi

# Intermediate images of earlier builds that no tag refers to any more.
quiet bah rmi --prune

if [ -n "${ARCHIVE_DIR:-}" ]; then
  mkdir -p "$ARCHIVE_DIR"
  for name in $images; do
    rm -f "$ARCHIVE_DIR/$name.tar.tmp"
    quiet bah push --quiet "localhost/zfs-nomad/$name:$tag" \
      "docker-archive:$ARCHIVE_DIR/$name.tar.tmp:localhost/zfs-nomad/$name:$tag"
    mv "$ARCHIVE_DIR/$name.tar.tmp" "$ARCHIVE_DIR/$name.tar"
  done
fi

printf '%s\n' "${summary[@]}"
