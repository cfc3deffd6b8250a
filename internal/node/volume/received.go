package volume

import (
	"context"
	"errors"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// What the node does after a replication receive into a copy: the index
// learns the change and the snapshots the stream brought, and what the
// stream should not have left (a deleted snapshot's copy, a duplicate, a
// loaded key) goes.

// Received is told of every receive into volume id's copy on the node
// (the replication receiver's Index), while the receive holds the copy's
// lock: the volumes version moves, and the copies see to what the stream
// brought (Manager.received), which indexes its CSI snapshots.
func (x *Index) Received(id string) {
	x.NoteChanged(id)
	x.copies.received(id)
}

// received sees to what a receive brought into volume id's copy, under
// the receive's hold of the copy's lock: the CSI snapshots it brought
// (docs/replication.md, "CSI snapshots") enter the snapshot index. Only
// the snapshots the index lacks at this copy are read: most receives
// bring none, and then this costs one listing of the copy's snapshot
// names. A snapshot deleted while the push that brought it ran is
// dropped (dropDeleted), and so is a duplicate a tombstone kept
// (keepIndexed) and a key left loaded.
func (m *Manager) received(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), receivedReadTimeout)
	defer cancel()
	fs := m.cfg.RootDataset + "/" + id
	names, err := m.zfs.SnapshotNames(ctx, fs)
	if errors.Is(err, zfs.ErrNotFound) {
		return // a receive that made nothing
	}
	if err != nil {
		m.log.Warn("reading the snapshots a receive brought failed; the snapshot index lists again", "volume_id", id, "error", err)
		m.index.snapshotIndex.invalidate()
		return
	}
	for _, name := range names {
		if snapID := shortName(name); contract.IsSnapshotID(snapID) && !m.index.snapshotIndex.knows(snapID, name) {
			if m.keepIndexed(ctx, id, snapID, name) {
				continue
			}
			m.index.reindexSnapshot(ctx, snapID, name)
		}
	}
	m.dropDeleted(ctx, id, names)
	// A replica is staged nowhere: a key loaded on it (by a crash, or
	// an operator) goes with the receive that updates it.
	m.dropKey(ctx, id, fs, "received into")
}

// keepIndexed decides what a receive into volume id's live copy that
// brought CSI snapshot snapID (at name) does to the copy of that
// snapshot the index holds, and tells whether the index keeps it.
//
// A copy that a tombstone or a set-aside copy of the volume keeps, with
// the received snapshot's GUID, is the same snapshot (ZFS keeps a
// snapshot's GUID across send and receive): it is dropped and the live
// copy indexed, so the node holds one copy per snapshot and a
// DeleteSnapshot leaves none (a seed of the simulation, 26863, found the
// second copy listed again after a delete).
//
// A stream may bring any snapshot name, though: a copy of another GUID
// is another snapshot that only carries the name (a peer's stream may
// plant it, docs/safety.md "What a peer's header may decide"). The name
// decides nothing then: the copy the index holds, which was on the node
// first, stays indexed, so it is the one listed and restored, and
// neither copy is destroyed (either may be the only one of its data).
// The received copy is remembered beside it, so a delete of the snapshot
// takes both (deleteDuplicates). The same holds for the index's copy on
// another volume's datasets. The caller holds the copy's lock, which
// guards the volume's tombstones too.
func (m *Manager) keepIndexed(ctx context.Context, id, snapID, name string) bool {
	old, ok := m.index.snapshotIndex.entry(snapID)
	if !ok || old == name {
		return false
	}
	indexed, err1 := m.zfs.Get(ctx, old)
	received, err2 := m.zfs.Get(ctx, name)
	switch {
	case errors.Is(err1, zfs.ErrNotFound):
		return false // the index's copy is gone: the received one takes its place
	case err1 != nil || err2 != nil:
		m.log.Warn("reading two copies of a snapshot after a receive failed; the snapshot index lists again", "volume_id", id, "snapshot_id", snapID, "error", errors.Join(err1, err2))
		m.index.snapshotIndex.invalidate()
		return true
	case indexed.GUID != received.GUID:
		m.index.duplicates.add(snapID, name)
		m.log.Warn("a receive brought a snapshot under the name of another one on this node: the one here first stays listed, and the received one is kept aside until the snapshot is deleted",
			"volume_id", id, "snapshot_id", snapID, "indexed", old, "received", name, "indexed_guid", indexed.GUID, "received_guid", received.GUID)
		return true
	case copyIDOf(old) != id:
		return true // the same snapshot on another volume's copy: not this lock's to drop
	}
	m.dropDuplicate(ctx, id, snapID, old)
	return false
}

// dropDuplicate destroys old, the copy of CSI snapshot snapID that a
// tombstone or a set-aside copy of volume id keeps on the node, now that
// a receive brought the same snapshot (same GUID, keepIndexed) to the
// volume's live copy. The index holds one dataset per snapshot ID, so
// the node's DeleteSnapshot would destroy one copy and leave the other,
// to be listed again after the next listing.
func (m *Manager) dropDuplicate(ctx context.Context, id, snapID, old string) {
	if err := m.zfs.DestroyDeferred(ctx, old); err != nil && !errors.Is(err, zfs.ErrNotFound) {
		m.log.Warn("dropping a kept copy of a snapshot a receive brought again failed; deleting the snapshot may leave it", "volume_id", id, "snapshot_id", snapID, "dataset", old, "error", err)
		return
	}
	m.log.Info("dropped a kept copy of a snapshot the volume's copy received again", "volume_id", id, "snapshot_id", snapID, "dataset", old)
	m.collectTombstoneLocked(ctx, zfs.Parent(old))
}

// receivedReadTimeout bounds Received's reads.
const receivedReadTimeout = 30 * time.Second
