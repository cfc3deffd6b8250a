#!/usr/bin/env bash
# Prints the directory holding the ZFS guest image (vmlinuz, initrd.gz) of
# ZFS_NOMAD_GUEST (bookworm, the default, or trixie: see build-rootfs.sh),
# building what the cache lacks for the current recipe first. With -c it
# prints the stage-1 chroot instead (hack/gobuild.sh builds in it). The cache lives
# outside the repo and each stage is keyed by a hash of its recipe files:
#   chroot-KEY1  debootstrap + kernel + dkms (slow, ~15 min)   build-rootfs.sh
#   image-KEY2   kernel + initramfs without init, and Docker   + build-image.sh
#                Engine as a second archive (~3 min)
#   guest-KEY3   initramfs with guest/init appended (instant)  + init
#                initrd.gz; initrd-docker.gz has Docker too (guest/run.sh -D)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${ZFS_GUEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/zfs-nomad}

release=${ZFS_NOMAD_GUEST:-bookworm}
want=image
[ "${1:-}" = -c ] && want=chroot
key() { { echo "$release"; cat "$@"; } | sha256sum | cut -c1-16; }
rootfs=$cache/chroot-$(key "$here/build-rootfs.sh")
image=$cache/image-$(key "$here/build-rootfs.sh" "$here/build-image.sh")
guest=$cache/guest-$(key "$here/build-rootfs.sh" "$here/build-image.sh" "$here/init")

if [ "$want" = image ] && [ -s "$guest/initrd-docker.gz" ]; then echo "$guest"; exit 0; fi
if [ "$want" = chroot ] && [ -e "$rootfs/.complete" ]; then echo "$rootfs"; exit 0; fi

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
  "$here/build-rootfs.sh" "$release" "$rootfs"
  touch "$rootfs/.complete"
}
if [ "$want" = chroot ]; then
  ensure_rootfs
  echo "$rootfs"
  exit 0
fi
if [ ! -s "$image/docker.cpio.gz" ]; then
  ensure_rootfs
  rm -rf "$image.tmp"
  "$here/build-image.sh" "$rootfs" "$image.tmp"
  rm -rf "$image" && mv "$image.tmp" "$image"
fi
if [ ! -s "$guest/initrd-docker.gz" ]; then
  tmp=$(mktemp -d)
  install -m 0755 "$here/init" "$tmp/init"
  (cd "$tmp" && echo init | cpio -o -H newc --quiet | gzip -1) >"$tmp/init.cpio.gz"
  rm -rf "$guest.tmp" && mkdir -p "$guest.tmp"
  cp "$image/vmlinuz" "$image/kernel-version" "$image/docker-version" "$guest.tmp/"
  # The kernel unpacks concatenated archives in order, later files over earlier.
  cat "$image/base.cpio.gz" "$tmp/init.cpio.gz" >"$guest.tmp/initrd.gz"
  cat "$image/base.cpio.gz" "$image/docker.cpio.gz" "$tmp/init.cpio.gz" >"$guest.tmp/initrd-docker.gz"
  rm -rf "$tmp" "$guest" && mv "$guest.tmp" "$guest"
fi
echo "$guest"
