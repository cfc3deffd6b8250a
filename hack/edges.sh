#!/usr/bin/env bash
# Checks the edges of docs/architecture.md: the controller links no node
# code (ZFS, mounts, volumes on disk, replication streams, the agent
# server), so it builds without cgo for any OS; and its logic sees no
# protobuf, which stops at the agent client, and no CSI, which stops at
# the CSI adapter.
set -euo pipefail
cd "$(dirname "$0")/.."
module=$(go list -m)
node_only='internal/(volume|mount|zfs|zfs/libzfs|zfs/zfscmd|zfs/zfsfake|replication|agent|lease|csi/node)$'
linked=$(go list -deps ./cmd/zfs-controller | grep "^$module/" | sed "s|^$module/||" | grep -E "^$node_only" || true)
if [ -n "$linked" ]; then
	echo "zfs-controller links node code:" $linked
	echo "(see docs/architecture.md: the controller reaches nodes only through packages cluster and agentclient)"
	exit 1
fi
# Protobuf stops at the agent client (internal/agentclient): the
# controller's logic works on its plain types, never on agentpb's messages.
# (Their tests may serve fake agents, which are gRPC servers.)
plain='cluster migration scheduler operator provision csi/controller'
leaks=$(go list -f '{{.ImportPath}} {{join .Imports " "}}' $(printf './internal/%s ' $plain) |
	awk -v pb="$module/proto/agentpb" '{for (i = 2; i <= NF; i++) if ($i == pb) print $1}')
if [ -n "$leaks" ]; then
	echo "controller logic imports proto/agentpb:" $leaks
	echo "(see docs/architecture.md: protobuf stops at internal/agentclient)"
	exit 1
fi
# CSI stops at the CSI adapter (internal/csi/controller): the logic below
# it works on plain Go types, and links no CSI at all.
csi_spec='github.com/container-storage-interface/spec'
for pkg in cluster migration scheduler operator provision; do
	if go list -deps "./internal/$pkg" | grep -q "^$csi_spec"; then
		echo "controller logic links the CSI spec: internal/$pkg"
		echo "(see docs/architecture.md: the CSI adapter translates, the logic decides)"
		exit 1
	fi
done
for os in linux darwin; do
	if ! CGO_ENABLED=0 GOOS=$os go build -o /dev/null ./cmd/zfs-controller; then
		echo "zfs-controller does not build for GOOS=$os without cgo"
		exit 1
	fi
done
