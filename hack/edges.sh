#!/usr/bin/env bash
# Checks the edges of docs/architecture.md, which the layout shows:
# internal/controller is linked only by zfs-controller, internal/node only
# by zfs-node, internal/shared by both, internal/testbed by neither (tests
# and the demo). So the controller links no node code (ZFS, mounts,
# volumes on disk, replication streams, the agent server) and builds
# without cgo for any OS, and the node links none of the controller's
# decisions. Below that: the controller's logic sees no protobuf, which
# stops at its agent client, and no CSI, which stops at its CSI server.
set -euo pipefail
cd "$(dirname "$0")/.."
module=$(go list -m)

# links BINARY FOLDER: the packages under internal/FOLDER that BINARY links.
links() {
	go list -deps "./cmd/$1" | grep "^$module/internal/$2/" | sed "s|^$module/||" || true
}
fail=0
for edge in "zfs-controller node" "zfs-controller testbed" "zfs-node controller" "zfs-node testbed"; do
	set -- $edge
	linked=$(links "$1" "$2")
	if [ -n "$linked" ]; then
		echo "$1 links internal/$2:" $linked
		echo "(see docs/architecture.md, \"Layout\": each binary links its own folder and internal/shared only)"
		fail=1
	fi
done
# Every package under internal/shared is linked by both binaries, or it
# belongs to one of them.
for pkg in $(go list ./internal/shared/... | sed "s|^$module/||"); do
	for bin in zfs-controller zfs-node; do
		if ! go list -deps "./cmd/$bin" | grep -qx "$module/$pkg"; then
			echo "$pkg is in internal/shared but $bin does not link it: move it to that binary's folder"
			fail=1
		fi
	done
done
[ "$fail" = 0 ] || exit 1

# Protobuf stops at the agent client (internal/controller/agentclient):
# the controller's logic works on its plain types, never on agentpb's
# messages. (Their tests may serve fake agents, which are gRPC servers.)
plain='cluster migration scheduler operator provision csiserver'
leaks=$(go list -f '{{.ImportPath}} {{join .Imports " "}}' $(printf './internal/controller/%s ' $plain) |
	awk -v pb="$module/proto/agentpb" '{for (i = 2; i <= NF; i++) if ($i == pb) print $1}')
if [ -n "$leaks" ]; then
	echo "controller logic imports proto/agentpb:" $leaks
	echo "(see docs/architecture.md: protobuf stops at internal/controller/agentclient)"
	exit 1
fi
# On the node, protobuf stops at the agent package (internal/node/agent),
# the node's gRPC adapter, which assembly registers: the node's logic
# works on plain types, and the lease, replication, the volumes, the
# locks and the mounts link no gRPC at all, so their tests need none.
node_pb=$(go list -f '{{.ImportPath}} {{join .Imports " "}}' ./internal/node/... |
	awk -v pb="$module/proto/agentpb" '{for (i = 2; i <= NF; i++) if ($i == pb) print $1}' |
	grep -vE "/internal/node/(agent|assembly)\$" || true)
if [ -n "$node_pb" ]; then
	echo "node logic imports proto/agentpb:" $node_pb
	echo "(see docs/architecture.md: on the node, protobuf stops at internal/node/agent)"
	exit 1
fi
for pkg in lease replication volume copylock mount; do
	if go list -deps "./internal/node/$pkg" | grep -qx 'google.golang.org/grpc'; then
		echo "internal/node/$pkg links gRPC (see docs/architecture.md: on the node, gRPC stops at internal/node/agent)"
		exit 1
	fi
done
# CSI stops at the CSI server (internal/controller/csiserver): the logic
# below it works on plain Go types, and links no CSI at all.
csi_spec='github.com/container-storage-interface/spec'
for pkg in cluster migration scheduler operator provision; do
	if go list -deps "./internal/controller/$pkg" | grep -q "^$csi_spec"; then
		echo "controller logic links the CSI spec: internal/controller/$pkg"
		echo "(see docs/architecture.md: the CSI server translates, the logic decides)"
		exit 1
	fi
done
for os in linux darwin; do
	if ! CGO_ENABLED=0 GOOS=$os go build -o /dev/null ./cmd/zfs-controller; then
		echo "zfs-controller does not build for GOOS=$os without cgo"
		exit 1
	fi
done
