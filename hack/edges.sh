#!/usr/bin/env bash
# Checks the edge between the two binaries (docs/architecture.md): the
# controller links no node code (ZFS, mounts, volumes on disk, replication
# streams, the agent server), so it builds without cgo for any OS.
set -euo pipefail
cd "$(dirname "$0")/.."
module=$(go list -m)
node_only='internal/(volume|mount|zfs|zfs/libzfs|zfs/zfscmd|zfs/zfsfake|replication|agent|lease|csi/node)$'
linked=$(go list -deps ./cmd/zfs-controller | grep "^$module/" | sed "s|^$module/||" | grep -E "^$node_only" || true)
if [ -n "$linked" ]; then
	echo "zfs-controller links node code:" $linked
	echo "(see docs/architecture.md: the controller reaches nodes only through package cluster)"
	exit 1
fi
for os in linux darwin; do
	if ! CGO_ENABLED=0 GOOS=$os go build -o /dev/null ./cmd/zfs-controller; then
		echo "zfs-controller does not build for GOOS=$os without cgo"
		exit 1
	fi
done
