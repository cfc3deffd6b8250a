#!/usr/bin/env bash
# Stage 1 of the ZFS guest: a Debian chroot of RELEASE with the kernel,
# that release's OpenZFS built by dkms for that kernel, zfsutils, the tools
# the guest needs, and the C toolchain and libzfs headers to build zfs-node
# against that release's libzfs (hack/gobuild.sh builds in here when the
# host's release differs). Output: OUT/ (the chroot). build-image.sh picks
# the guest's files out of it.
#
#   bookworm  Debian 12, OpenZFS 2.1.11 (the default guest)
#   trixie    Debian 13, OpenZFS 2.3.x
#
# Usage: build-rootfs.sh RELEASE OUT
#
# Slow (about 15 min, mostly dkms). guest/image.sh calls it only when the
# cache keyed by this recipe's hash is empty. See docs/testing.md.
set -euo pipefail

release=${1:?usage: build-rootfs.sh RELEASE OUT}
out=${2:?usage: build-rootfs.sh RELEASE OUT}
case "$release" in
  bookworm | trixie) ;;
  *) echo "build-rootfs.sh: unknown release $release (bookworm or trixie)" >&2; exit 2 ;;
esac
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

work=$(mktemp -d "${TMPDIR:-/var/tmp}/zfs-guest-rootfs.XXXXXX")
chroot_dir=$out
cleanup() {
  for m in proc sys dev; do umount -l "$chroot_dir/$m" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

log() { printf 'guest-build: %s\n' "$*" >&2; }

log "debootstrap $release into $chroot_dir"
debootstrap --variant=minbase --components=main,contrib "$release" "$chroot_dir" "$mirror" >"$work/debootstrap.log" 2>&1 ||
  { tail -30 "$work/debootstrap.log" >&2; exit 1; }

cat >"$chroot_dir/etc/apt/sources.list" <<EOF
deb $mirror $release main contrib
deb $mirror $release-updates main contrib
EOF
# No services start inside the chroot.
printf '#!/bin/sh\nexit 101\n' >"$chroot_dir/usr/sbin/policy-rc.d"
chmod +x "$chroot_dir/usr/sbin/policy-rc.d"
for m in proc sys dev; do mount --bind "/$m" "$chroot_dir/$m"; done

in_chroot() { chroot "$chroot_dir" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive "$@"; }

# The chroot's own initramfs is never used: the guest's is build-image.sh's,
# from the chroot's files. The kernel's and OpenZFS's packages would build
# it twice, about a minute of CPU each, so update-initramfs is diverted to
# a no-op before they are installed.
in_chroot dpkg-divert --quiet --local --rename --divert /usr/sbin/update-initramfs.distrib --add /usr/sbin/update-initramfs
ln -s /bin/true "$chroot_dir/usr/sbin/update-initramfs"

log "installing kernel and tools"
in_chroot apt-get update -qq
in_chroot apt-get install -y -qq --no-install-recommends \
  linux-image-amd64 linux-headers-amd64 busybox-static dash bash kmod \
  iproute2 socat fdisk coreutils util-linux procps psmisc e2fsprogs >"$work/apt.log" 2>&1 ||
  { tail -30 "$work/apt.log" >&2; exit 1; }

kver=$(basename "$(ls -d "$chroot_dir"/lib/modules/*-amd64 | sort -V | tail -1)")
log "kernel $kver; building zfs with dkms (the slow part)"
# OpenZFS's modules are built without debug information (KCFLAGS=-g0) and
# without BTF: kbuild generates a module's BTF (pahole, from the debug
# information) only while the headers carry vmlinux, which Debian 13's do,
# so it is set aside for the build. dkms strips the debug information
# from the modules it installs anyway, and nothing in the guest reads a
# module's BTF; the build takes about a fifth less CPU (docs/testing.md).
vmlinux=$chroot_dir/usr/src/linux-headers-$kver/vmlinux
[ ! -f "$vmlinux" ] || mv "$vmlinux" "$vmlinux.aside"
in_chroot KCFLAGS=-g0 apt-get install -y -qq --no-install-recommends zfs-dkms zfsutils-linux >>"$work/apt.log" 2>&1 ||
  { tail -30 "$work/apt.log" >&2; exit 1; }
# The postinst builds for the running kernel, which is the host's: build for the guest's.
if ! ls "$chroot_dir/lib/modules/$kver/updates/dkms/zfs.ko"* >/dev/null 2>&1; then
  zfsver=$(in_chroot dpkg-query -W -f='${Version}' zfs-dkms | sed 's/-.*//')
  in_chroot KCFLAGS=-g0 dkms install "zfs/$zfsver" -k "$kver" >"$work/dkms.log" 2>&1 ||
    { tail -30 "$work/dkms.log" >&2; exit 1; }
fi
[ ! -f "$vmlinux.aside" ] || mv "$vmlinux.aside" "$vmlinux"

log "installing the toolchain and libzfs headers for building zfs-node"
in_chroot apt-get install -y -qq --no-install-recommends gcc libc6-dev pkg-config libzfslinux-dev >>"$work/apt.log" 2>&1 ||
  { tail -30 "$work/apt.log" >&2; exit 1; }

rm -rf "$chroot_dir"/var/cache/apt/archives/*.deb "$chroot_dir"/usr/src/zfs-*/
log "done: $out"
