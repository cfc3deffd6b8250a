#!/usr/bin/env bash
# Stage 2 of the ZFS guest: picks the kernel, the modules the guest loads,
# zfsutils, libzfs and a few tools out of the stage-1 chroot and packs them
# into an initramfs (no init: image.sh appends guest/init as its own cpio).
# A second archive holds the release's Docker Engine (docker.io: dockerd,
# containerd, runc), installed into a throwaway overlay of the chroot so the
# chroot's recipe and cache stay as they are; image.sh appends it only to
# the initramfs of guests that run containers (guest/run.sh -D).
# Output: OUT/vmlinuz, OUT/base.cpio.gz, OUT/docker.cpio.gz, OUT/kernel-version.
#
# Usage: build-image.sh CHROOT OUT
set -euo pipefail

chroot_dir=${1:?usage: build-image.sh CHROOT OUT}
out=${2:?usage: build-image.sh CHROOT OUT}
work=$(mktemp -d "${TMPDIR:-/var/tmp}/zfs-guest-image.XXXXXX")
root=$work/initramfs
merged=$work/docker-chroot
cleanup() {
  for m in proc sys dev ""; do umount -l "$merged/$m" 2>/dev/null || true; done
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT

log() { printf 'guest-build: %s\n' "$*" >&2; }
# in_root ROOT COMMAND... runs COMMAND chrooted in ROOT with a clean
# environment; in_chroot runs it in the stage-1 chroot.
in_root() { local r=$1; shift; chroot "$r" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
in_chroot() { in_root "$chroot_dir" "$@"; }
kver=$(basename "$(ls -d "$chroot_dir"/lib/modules/*-amd64 | sort -V | tail -1)")

log "assembling the initramfs"
mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,tmp,run,mnt,share,lib/modules,usr/bin,usr/sbin,var/tmp,root}
ln -s lib "$root/lib64"

# copy_with_libs FROM TO FILE... copies binaries and the shared libraries
# they load from the chroot FROM to the tree TO.
copy_with_libs() {
  local from=$1 to=$2 f lib
  shift 2
  for f in "$@"; do
    [ -e "$from$f" ] || { log "missing $f"; exit 1; }
    mkdir -p "$to$(dirname "$f")"
    cp -aL "$from$f" "$to$f"
    for lib in $(in_root "$from" ldd "$f" 2>/dev/null | grep -o '/[^ ]*' || true); do
      [ -e "$to$lib" ] && continue
      mkdir -p "$to$(dirname "$lib")"
      cp -aL "$from$lib" "$to$lib"
    done
  done
}
copy_with_libs "$chroot_dir" "$root" /bin/busybox /bin/dash /bin/bash /sbin/zfs /sbin/zpool /sbin/zdb /sbin/mount.zfs \
  /bin/ip /usr/bin/socat /sbin/sfdisk /bin/kmod /usr/bin/unshare /usr/bin/nsenter \
  /usr/bin/sha256sum /bin/mount /bin/umount /usr/bin/timeout /usr/bin/setsid /usr/bin/pkill
# libzfs and friends for zfs-node, built against this release's libzfs
# (hack/gobuild.sh). Each soname, whatever its number in this release.
for lib in "$chroot_dir"/lib/x86_64-linux-gnu/{libzfs,libzfs_core,libnvpair,libuutil}.so.[0-9]; do
  cp -aL "$lib" "$root/lib/x86_64-linux-gnu/"
done
# libgcc_s is dlopen()ed by glibc for thread cancellation: ldd does not list it.
cp -aL "$chroot_dir"/lib/x86_64-linux-gnu/libgcc_s.so.1 "$root/lib/x86_64-linux-gnu/"
ln -sf dash "$root/bin/sh"
for tool in modprobe insmod lsmod depmod; do ln -sf ../bin/kmod "$root/sbin/$tool"; done
# Busybox fills every gap, but never shadows a real binary.
for applet in $("$chroot_dir/bin/busybox" --list-full); do
  name=$(basename "$applet")
  for d in bin sbin usr/bin usr/sbin; do [ -e "$root/$d/$name" ] && continue 2; done
  ln -s /bin/busybox "$root/$applet"
done

# Kernel modules: the closure of what the guest loads.
modules=(zfs virtio_pci virtio_blk virtio_net 9p 9pnet_virtio veth bridge loop overlay)
for m in "${modules[@]}"; do
  in_chroot modprobe --show-depends -S "$kver" "$m" | awk '$1=="insmod"{print $2}'
done | sort -u | while read -r ko; do
  mkdir -p "$root$(dirname "$ko")"
  cp -a "$chroot_dir$ko" "$root$ko"
done
cp "$chroot_dir/lib/modules/$kver"/modules.{order,builtin,builtin.modinfo} "$root/lib/modules/$kver/"
depmod -b "$root" "$kver"

printf 'root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
printf 'hosts: files\n' >"$root/etc/nsswitch.conf"
printf '127.0.0.1 localhost\n' >"$root/etc/hosts"

log "installing docker.io in an overlay of the chroot"
mkdir -p "$work/upper" "$work/overlay-work" "$merged"
mount -t overlay overlay -o "lowerdir=$chroot_dir,upperdir=$work/upper,workdir=$work/overlay-work" "$merged"
for m in proc sys dev; do mount --bind "/$m" "$merged/$m"; done
cp /etc/resolv.conf "$merged/etc/resolv.conf"
in_root "$merged" DEBIAN_FRONTEND=noninteractive sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends docker.io' >"$work/docker-apt.log" 2>&1 ||
  { tail -30 "$work/docker-apt.log" >&2; exit 1; }
# No docker client: the tests speak to dockerd's API on its socket. GNU cp
# copies a data root with its extended attributes (busybox's drops them).
copy_with_libs "$merged" "$work/docker" /usr/sbin/dockerd /usr/bin/containerd \
  /usr/bin/containerd-shim-runc-v2 /usr/sbin/runc /usr/bin/docker-init /bin/cp

mkdir -p "$out"
in_root "$merged" dpkg-query -W -f='${Version}\n' docker.io >"$out/docker-version"
cp "$chroot_dir/boot/vmlinuz-$kver" "$out/vmlinuz"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$out/base.cpio.gz"
(cd "$work/docker" && find . | cpio -o -H newc --quiet | gzip -1) >"$out/docker.cpio.gz"
echo "$kver" >"$out/kernel-version"
log "done: $out ($(du -sh "$out" | cut -f1))"
