package volume

import (
	"context"
	"fmt"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// DeleteReplica destroys the node's replica of volume id with its
// snapshots and any partial receive, or makes it a tombstone when it
// holds CSI snapshots (copyrecord.Replicas.RemoveReplica); it reports
// whether there was a replica. A primary is never touched.
func (m *Manager) DeleteReplica(ctx context.Context, id string) (bool, error) {
	return m.removeReplica(ctx, id, nil)
}

// DeleteSurplus removes the node's replica of volume id only as a
// surplus copy whose newest snapshot is still newest, holding no
// snapshot but replication snapshots and the CSI snapshots in elsewhere
// (copyrecord.Surplus); anything else is FailedPrecondition, and nothing
// changes. It reports whether there was a replica.
func (m *Manager) DeleteSurplus(ctx context.Context, id, newest string, elsewhere []string) (bool, error) {
	return m.removeReplica(ctx, id, &copyrecord.Surplus{Newest: newest, Elsewhere: elsewhere})
}

// removeReplica removes the replica of volume id under its lock, and
// before the unlock brings the indexes up to date: the volumes version
// moves (the schedule, which keeps what a node holds while that version
// stays, must learn it) and a tombstone's CSI snapshots are indexed
// under its new name, so no reader after the unlock finds them under
// the old one.
func (m *Manager) removeReplica(ctx context.Context, id string, surplus *copyrecord.Surplus) (bool, error) {
	if m.replicas == nil || !contract.IsVolumeID(id) {
		return false, nil // no replication, or no volume: no replica of one
	}
	what := "the replica"
	if surplus != nil {
		what = "a surplus replica"
	}
	unlock, err := m.lock(ctx, id, "deleting "+what)
	if err != nil {
		return false, err
	}
	defer unlock()
	removal, err := m.replicas.RemoveReplica(ctx, id, surplus)
	if err != nil {
		return false, fmt.Errorf("deleting %s of volume %s on node %s: %w", what, id, m.cfg.NodeID, err)
	}
	if removal.Dataset == "" {
		return false, nil
	}
	m.index.NoteChanged(id)
	if removal.Tombstone != "" {
		// A tombstone is staged nowhere: a key a crash left loaded on
		// the replica goes.
		m.dropKey(ctx, id, removal.Tombstone, "removed replica kept as a tombstone")
		m.index.reindexSnapshotsOf(ctx, removal.Tombstone)
		m.log.Info("deleted "+what+"; its CSI snapshots stay on a tombstone until they are deleted", "volume_id", id, "tombstone", removal.Tombstone)
		return true, nil
	}
	m.log.Info("deleted "+what, "volume_id", id, "dataset", removal.Dataset)
	return true, nil
}
