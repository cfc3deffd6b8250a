#!/usr/bin/env bash
# The Docker stage of the ZFS guest: the release's Docker Engine
# (docker.io: dockerd, containerd, runc), installed into a throwaway
# overlay of the stage-1 chroot so the chroot's recipe and cache stay as
# they are, packed as a second archive that image.sh appends to the
# initramfs of guests that run containers (guest/run.sh -D). Built only
# when such a guest is first asked for: make test runs containers only
# in the Debian 12 guest.
# Output: OUT/docker.cpio.gz, OUT/docker-version.
#
# Usage: build-docker.sh CHROOT OUT
set -euo pipefail

chroot_dir=${1:?usage: build-docker.sh CHROOT OUT}
out=${2:?usage: build-docker.sh CHROOT OUT}
work=$(mktemp -d "${TMPDIR:-/var/tmp}/zfs-guest-docker.XXXXXX")
merged=$work/docker-chroot
cleanup() {
  for m in proc sys dev ""; do umount -l "$merged/$m" 2>/dev/null || true; done
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

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
(cd "$work/docker" && find . | cpio -o -H newc --quiet | gzip -1) >"$out/docker.cpio.gz"
log "done: $out ($(du -sh "$out" | cut -f1))"
