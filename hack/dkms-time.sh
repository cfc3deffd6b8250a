#!/usr/bin/env bash
# Times OpenZFS's dkms build in an overlay of a cached guest chroot
# (~/.cache/zfs-nomad/chroot-*), which it leaves untouched: zfs-dkms is
# reinstalled, and its postinst builds the modules for the chroot's
# kernel. VARIANT is as-built (KCFLAGS=-g0 and the kernel headers'
# vmlinux set aside, as guest/build-rootfs.sh builds them) or debug
# (debug information, and BTF where the headers carry vmlinux). Prints
# the wall and CPU time; the build's log stays in /var/tmp. Needs root
# and the network (the package is downloaded first, outside the timing).
#
# Usage: hack/dkms-time.sh CHROOT as-built|debug
set -euo pipefail
lower=${1:?usage: hack/dkms-time.sh CHROOT as-built|debug}
variant=${2:?usage: hack/dkms-time.sh CHROOT as-built|debug}
case "$variant" in
  as-built) env=(KCFLAGS=-g0) ;;
  debug) env=() ;;
  *) echo "dkms-time: no variant $variant (as-built or debug)" >&2; exit 2 ;;
esac
w=$(mktemp -d /var/tmp/dkms-time.XXXXXX)
mkdir -p "$w/upper" "$w/work" "$w/root"
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$w/upper,workdir=$w/work" "$w/root"
for m in proc sys dev; do mount --bind "/$m" "$w/root/$m"; done
cleanup() {
  for m in proc sys dev; do umount -l "$w/root/$m" 2>/dev/null || true; done
  umount -l "$w/root" || true
  rm -rf "$w"
}
trap cleanup EXIT
if [ "$variant" = as-built ]; then
  for v in "$w"/root/usr/src/linux-headers-*-amd64/vmlinux; do [ ! -f "$v" ] || mv "$v" "$v.aside"; done
fi
in_chroot() { chroot "$w/root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive "$@"; }
in_chroot apt-get update -qq
in_chroot apt-get install -y -qq --download-only --reinstall zfs-dkms >/dev/null
log=/var/tmp/dkms-time-$variant.log
/usr/bin/time -f "$variant: wall %e s, user %U s, sys %S s" \
  chroot "$w/root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive "${env[@]}" \
  apt-get install -y -qq --reinstall zfs-dkms >"$log" 2>&1 || { tail -30 "$log" >&2; exit 1; }
tail -1 "$log"
