package contract

import (
	"strconv"
	"strings"
)

// Roles a copy of a volume plays on a node, recorded in its
// zfs-nomad:role property (docs/volumes.md, docs/migration.md).
const (
	// RolePrimary marks the copy a job mounts and writes: one per volume
	// and generation (docs/safety.md).
	RolePrimary = "primary"
	// RoleDeleted marks a tombstone: a volume the CO deleted while it still
	// had snapshots. It is invisible as a volume and destroyed with its last
	// snapshot. See docs/volumes.md.
	RoleDeleted = "deleted"
	// RoleReplica marks a copy received from another node's primary:
	// read-only, never staged, promoted by migration or failover.
	RoleReplica = "replica"
	// RoleSetAside marks a copy kept for an operator, a stale primary that
	// came back after a failover or a replaced replica that held snapshots:
	// renamed to <id>-aside-<nanos>, never mounted, never destroyed by the
	// driver.
	RoleSetAside = "set-aside"
	// RoleBackup marks a volume's backups on a backup target: never
	// mounted, never promoted (docs/backups.md).
	RoleBackup = "backup"
)

// ReplicationSnapshotPrefix starts the short name of the snapshots that
// replication takes (docs/replication.md): internal, never CSI snapshots.
const ReplicationSnapshotPrefix = "zn-"

// ReplicationSnapshotName is the short name of the replication snapshot
// taken at (unix nanos): zn-<at>.
func ReplicationSnapshotName(at int64) string {
	return ReplicationSnapshotPrefix + strconv.FormatInt(at, 10)
}

// ReplicationSnapshotTime reads the time out of a zn-<unix nanos> name.
func ReplicationSnapshotTime(name string) (int64, bool) {
	_, short, ok := strings.Cut(name, "@")
	if !ok || !strings.HasPrefix(short, ReplicationSnapshotPrefix) {
		return 0, false
	}
	at, err := strconv.ParseInt(strings.TrimPrefix(short, ReplicationSnapshotPrefix), 10, 64)
	return at, err == nil
}
