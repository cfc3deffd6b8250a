#!/usr/bin/env bash
# Writes a release into dist/VERSION/: zfs-controller (no cgo: runs on any
# Linux amd64), one zfs-node per supported OpenZFS series, each built
# against the libzfs of the Debian release that ships it (hack/gobuild.sh,
# in that release's guest chroot when it is not the host's), the images
# as docker-archive files for `docker load -i` (hack/images.sh), and
# SHA256SUMS over all of them.
#
#   zfs-node-openzfs-2.1-debian12    Debian 12's OpenZFS 2.1.11
#   zfs-node-openzfs-2.3-debian13    Debian 13's OpenZFS 2.3.x
#   zfs-controller-image.tar         localhost/zfs-nomad/zfs-controller:VERSION
#   zfs-node-image-debian12.tar      localhost/zfs-nomad/zfs-node:VERSION-debian12
#   zfs-node-image-debian13.tar      localhost/zfs-nomad/zfs-node:VERSION-debian13
#
# The images need root (buildah). It installs nothing: a missing Debian
# package (libzfslinux-dev, buildah, debootstrap for the chroots) is named
# and the release stops (ZFS_NOMAD_NO_INSTALL).
#
# Usage: release.sh VERSION
set -euo pipefail
export ZFS_NOMAD_NO_INSTALL=1
repo=$(cd "$(dirname "$0")/.." && pwd)
version=${1:?usage: release.sh VERSION}
out=$repo/dist/$version
ldflags="-X github.com/zfs-nomad/zfs-nomad/internal/shared/version.Version=$version"
rm -rf "$out"
mkdir -p "$out"
cd "$repo"
CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/zfs-controller" ./cmd/zfs-controller
for target in "bookworm debian12" "trixie debian13"; do
  set -- $target
  ./hack/gobuild.sh -r "$1" -l "$ldflags" -o "$out/zfs-node.tmp" ./cmd/zfs-node
  # The libzfs it was built against: the release's, as its chroot has it.
  libzfs=$(chroot "$(ZFS_NOMAD_GUEST=$1 ./guest/image.sh -c)" pkg-config --modversion libzfs)
  mv "$out/zfs-node.tmp" "$out/zfs-node-openzfs-$(echo "$libzfs" | cut -d. -f1-2)-$2"
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
VERSION=$version TAG=$version IMAGES=zfs-controller ARCHIVE_DIR=$tmp ./hack/images.sh
mv "$tmp/zfs-controller.tar" "$out/zfs-controller-image.tar"
for target in "bookworm debian12" "trixie debian13"; do
  set -- $target
  VERSION=$version TAG=$version-$2 IMAGES=zfs-node DEBIAN_RELEASE=$1 ARCHIVE_DIR=$tmp ./hack/images.sh
  mv "$tmp/zfs-node.tar" "$out/zfs-node-image-$2.tar"
done
(cd "$out" && sha256sum -- * >SHA256SUMS)
ls -l "$out"
