#!/usr/bin/env bash
# Boots the ZFS guest with three disks and runs the demo inside it.
# `make demo` builds the binaries first; this script builds the demo itself.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
share=$(mktemp -d "${TMPDIR:-/var/tmp}/zfs-demo.XXXXXX")
trap 'rm -rf "$share"' EXIT
mkdir -p "$share/bin"
cp "$repo/bin/zfs-node" "$repo/bin/zfs-controller" "$share/bin/"
(cd "$repo" && go build -o "$share/demo" ./demo)
cat >"$share/run.sh" <<'SCRIPT'
#!/bin/sh
exec /share/demo -bin /share/bin
SCRIPT
chmod +x "$share/run.sh"
echo "Booting the ZFS guest (real OpenZFS under QEMU; about 10 s)..."
"$repo/guest/run.sh" -t 1200 -d 1G -d 1G -d 1G "$share" | grep -v 'reboot: Power down'
