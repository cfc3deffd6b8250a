#!/usr/bin/env bash
# Prints the directory holding the ZFS guest image (vmlinuz, initrd.gz) of
# ZFS_NOMAD_GUEST (bookworm, the default, or trixie: see build-rootfs.sh),
# building what the cache lacks for the current recipe first. With -D the
# directory also holds initrd-docker.gz, the initramfs with the release's
# Docker Engine (guest/run.sh -D). With -c it prints the stage-1 chroot
# instead (hack/gobuild.sh builds in it). The cache lives outside the repo
# and each stage is keyed by a hash of its recipe files:
#   chroot-KEY   debootstrap + kernel + dkms (slow, ~15 min)  build-rootfs.sh
#   image-KEY    kernel + initramfs without init (~6 s)       + build-image.sh, lib.sh
#   docker-KEY   Docker Engine as a second archive (~90 s),   build-rootfs.sh + build-docker.sh, lib.sh
#                built only when -D asks for it
#   guest-KEY    initrd.gz: the initramfs with guest/init     all of the above + init
#                appended (instant); initrd-docker.gz with -D
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${ZFS_GUEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/zfs-nomad}

release=${ZFS_NOMAD_GUEST:-bookworm}
want=image
docker=""
case "${1:-}" in
  -c) want=chroot ;;
  -D) docker=1 ;;
  "") ;;
  *) echo "usage: image.sh [-c | -D]" >&2; exit 2 ;;
esac
key() { { echo "$release"; cat "$@"; } | sha256sum | cut -c1-16; }
rootfs=$cache/chroot-$(key "$here/build-rootfs.sh")
image=$cache/image-$(key "$here/build-rootfs.sh" "$here/build-image.sh" "$here/lib.sh")
dockerimage=$cache/docker-$(key "$here/build-rootfs.sh" "$here/build-docker.sh" "$here/lib.sh")
guest=$cache/guest-$(key "$here/build-rootfs.sh" "$here/build-image.sh" "$here/build-docker.sh" "$here/lib.sh" "$here/init")

complete() { [ -s "$guest/initrd.gz" ] && { [ -z "$docker" ] || [ -s "$guest/initrd-docker.gz" ]; }; }
if [ "$want" = image ] && complete; then echo "$guest"; exit 0; fi
if [ "$want" = chroot ] && [ -e "$rootfs/.complete" ]; then echo "$rootfs"; exit 0; fi

# A build step's progress lines (stderr) carry the seconds since this
# build began, so that a cold run's log shows where its time went
# (hack/prepare.sh prints them).
began=$(date +%s)
stamped() {
  "$@" 2> >(while IFS= read -r line; do printf '[%5d s] %s\n' $(($(date +%s) - began)) "$line"; done >&2)
}

mkdir -p "$cache"
# One build per release at a time; the two releases build side by side
# (hack/prepare.sh): their chroots, images and temporary trees are apart.
exec 9>"$cache/build-$release.lock"
flock 9
ensure_rootfs() {
  [ -e "$rootfs/.complete" ] && return
  echo "guest: no cached $release chroot for this recipe: building it (about 15 min, once)" >&2
  "$here/../hack/install-host-deps.sh"
  # A killed earlier build may have left its bind mounts behind: never delete through them.
  for m in proc sys dev; do umount -l "$rootfs/$m" 2>/dev/null || true; done
  rm -rf --one-file-system "$rootfs"
  stamped "$here/build-rootfs.sh" "$release" "$rootfs"
  touch "$rootfs/.complete"
}
if [ "$want" = chroot ]; then
  ensure_rootfs
  echo "$rootfs"
  exit 0
fi
# build_stage DIR FILE SCRIPT builds DIR with SCRIPT from the chroot
# unless DIR already holds FILE.
build_stage() {
  [ -s "$1/$2" ] && return
  ensure_rootfs
  rm -rf "$1.tmp"
  stamped "$3" "$rootfs" "$1.tmp"
  rm -rf "$1" && mv "$1.tmp" "$1"
}
build_stage "$image" base.cpio.gz "$here/build-image.sh"
[ -z "$docker" ] || build_stage "$dockerimage" docker.cpio.gz "$here/build-docker.sh"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
install -m 0755 "$here/init" "$tmp/init"
(cd "$tmp" && echo init | cpio -o -H newc --quiet | gzip -1) >"$tmp/init.cpio.gz"
if [ ! -s "$guest/initrd.gz" ]; then
  rm -rf "$guest.tmp" && mkdir -p "$guest.tmp"
  cp "$image/vmlinuz" "$image/kernel-version" "$guest.tmp/"
  # The kernel unpacks concatenated archives in order, later files over earlier.
  cat "$image/base.cpio.gz" "$tmp/init.cpio.gz" >"$guest.tmp/initrd.gz"
  rm -rf "$guest" && mv "$guest.tmp" "$guest"
fi
if [ -n "$docker" ] && [ ! -s "$guest/initrd-docker.gz" ]; then
  cp "$dockerimage/docker-version" "$guest/"
  cat "$image/base.cpio.gz" "$dockerimage/docker.cpio.gz" "$tmp/init.cpio.gz" >"$guest/initrd-docker.gz.tmp"
  mv "$guest/initrd-docker.gz.tmp" "$guest/initrd-docker.gz"
fi
echo "$guest"
