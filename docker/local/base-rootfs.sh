#!/usr/bin/env bash
# The local stand-in for debian:RELEASE-slim (bookworm or trixie), for hosts
# that reach Debian's mirrors but no container registry (hack/images.sh): a
# minbase debootstrap of RELEASE with the official image's apt sources (deb822, main only: the
# Dockerfiles add contrib themselves), its no-docs dpkg filter and no
# services started by package scripts. Output: OUT, a tar of the root
# filesystem for `buildah add`.
#
# Usage: base-rootfs.sh RELEASE OUT.tar
set -euo pipefail

release=${1:?usage: base-rootfs.sh RELEASE OUT.tar}
out=${2:?usage: base-rootfs.sh RELEASE OUT.tar}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}

root=$(mktemp -d "${TMPDIR:-/var/tmp}/zfs-nomad-base.XXXXXX")
trap 'rm -rf --one-file-system "$root"' EXIT

debootstrap --variant=minbase "$release" "$root" "$mirror" >"$root.log" 2>&1 ||
  { tail -30 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"

rm -f "$root/etc/apt/sources.list"
cat >"$root/etc/apt/sources.list.d/debian.sources" <<SRC
Types: deb
URIs: $mirror
Suites: $release $release-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: $release-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
# As in the slim image: no documentation but the copyright files.
cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/info/*
path-exclude /usr/share/man/*
path-exclude /usr/share/locale/*
CFG
cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'CFG'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
CFG
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 0755 "$root/usr/sbin/policy-rc.d"
# The container engine provides these at run time.
: >"$root/etc/resolv.conf"
: >"$root/etc/hostname"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*.log \
  "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/*
find "$root/usr/share/doc" -mindepth 2 ! -type d ! -name copyright -delete
mkdir -p "$root/var/lib/apt/lists/partial"

tar -C "$root" --numeric-owner -cf "$out.tmp" .
mv "$out.tmp" "$out"
