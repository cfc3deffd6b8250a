#!/usr/bin/env bash
# Stage 2 of the ZFS guest: picks the kernel, the modules the guest loads,
# zfsutils, libzfs and a few tools out of the stage-1 chroot and packs them
# into an initramfs (no init: image.sh appends guest/init as its own cpio).
# The release's Docker Engine is a stage of its own (build-docker.sh),
# built only for guests that run containers.
# Output: OUT/vmlinuz, OUT/base.cpio.gz, OUT/kernel-version.
#
# Usage: build-image.sh CHROOT OUT
set -euo pipefail

chroot_dir=${1:?usage: build-image.sh CHROOT OUT}
out=${2:?usage: build-image.sh CHROOT OUT}
work=$(mktemp -d "${TMPDIR:-/var/tmp}/zfs-guest-image.XXXXXX")
root=$work/initramfs
cleanup() { rm -rf --one-file-system "$work"; }
trap cleanup EXIT

here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
in_chroot() { in_root "$chroot_dir" "$@"; }
kver=$(basename "$(ls -d "$chroot_dir"/lib/modules/*-amd64 | sort -V | tail -1)")

log "assembling the initramfs"
mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,tmp,run,mnt,share,lib/modules,usr/bin,usr/sbin,var/tmp,root}
ln -s lib "$root/lib64"

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

mkdir -p "$out"
cp "$chroot_dir/boot/vmlinuz-$kver" "$out/vmlinuz"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$out/base.cpio.gz"
echo "$kver" >"$out/kernel-version"
log "done: $out ($(du -sh "$out" | cut -f1))"
