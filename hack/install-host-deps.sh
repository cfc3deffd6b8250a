#!/usr/bin/env bash
# Installs what building and testing the driver needs on a Debian 12 host:
# the contrib component (ZFS lives there), libzfs headers for cgo, QEMU and
# debootstrap for the ZFS guest, protoc, and any packages named as arguments
# (hack/images.sh adds buildah). Idempotent: it does nothing when all is
# present. With ZFS_NOMAD_NO_INSTALL set it installs nothing and fails
# naming what is missing.
set -euo pipefail

packages=(
  libzfslinux-dev          # cgo headers for go-libzfs; same ZFS version (2.1.11) as the guest
  qemu-system-x86          # runs the ZFS guest under TCG
  qemu-utils
  debootstrap cpio gzip    # builds the guest's root filesystem
  protobuf-compiler        # make proto
  iproute2 socat kmod     # kmod: depmod for the guest initramfs
  build-essential pkg-config
  "$@"
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

# A release (hack/release.sh) installs nothing unasked: it says what is
# missing and stops.
if [ -n "${ZFS_NOMAD_NO_INSTALL:-}" ]; then
  echo "missing Debian packages: ${missing[*]}; install them (apt-get install ${missing[*]}, contrib enabled for libzfslinux-dev) and run again" >&2
  exit 1
fi

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

# ZFS is in contrib, which Debian's default sources leave out.
if ! grep -rqs 'contrib' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  $sudo tee /etc/apt/sources.list.d/zfs-nomad-contrib.sources >/dev/null <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: contrib
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi

echo "install-host-deps: installing ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
