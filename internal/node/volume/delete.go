package volume

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// Delete deletes a volume. Deleting a volume that does not exist succeeds.
// A volume with snapshots becomes a tombstone (see the package comment).
func (m *Manager) Delete(ctx context.Context, id string) error {
	if !contract.IsVolumeID(id) {
		return nil // names no volume, so none to delete
	}
	log := m.log.With("volume_id", id)
	unlock, err := m.lock(ctx, id, "delete")
	if err != nil {
		return err
	}
	defer unlock()
	// Whether it is a primary may change: the index reads it again.
	defer m.index.reindex(ctx, id)

	v, err := m.get(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	// A mounted volume is refused before anything is touched: its
	// replication snapshots are the bases of its replicas' increments.
	// Mounted anywhere: in another mount namespace too, where ZFS would
	// answer EBUSY only at the destroy, after the snapshots were gone.
	if err := m.refuseMounted(v); err != nil {
		return err
	}
	// A push snapshots and sends this copy: it stops first, and the next
	// one waits for this lock and then finds no volume.
	if err := m.locks.StopTransfer(ctx, id); err != nil {
		return err
	}
	if v.KeyLoaded {
		// A tombstone is staged nowhere: its key goes.
		m.dropKey(ctx, id, v.Dataset, "deleted")
	}
	if err := m.dropReplicationSnapshots(ctx, v.Dataset); err != nil {
		return err
	}
	// A clone's origin snapshot, destroyed deferred, goes with it, and
	// may leave its tombstone free to go.
	var origin string
	if ds, err := m.zfs.Get(ctx, v.Dataset); err == nil {
		origin = ds.Origin
	}
	err = m.zfs.Destroy(ctx, v.Dataset)
	switch {
	case err == nil:
		log.Info("volume destroyed", "dataset", v.Dataset)
	case errors.Is(err, zfs.ErrNotFound):
		log.Info("volume already destroyed meanwhile", "dataset", v.Dataset)
	case errors.Is(err, zfs.ErrHasDependents):
		if err := m.tombstone(ctx, v); err != nil {
			return err
		}
		log.Info("volume deleted; its dataset stays as a tombstone until its snapshots and clones are gone", "dataset", v.Dataset)
	case errors.Is(err, zfs.ErrBusy):
		return m.busyError(v, err)
	default:
		return zfsError(err, "deleting volume "+id)
	}
	switch parent := zfs.Parent(origin); {
	case origin == "":
	case copyIDOfDataset(parent) == id: // restored from its own name's tombstone: this lock guards it
		m.collectTombstoneLocked(ctx, parent)
	default:
		m.collectTombstone(ctx, parent)
	}
	return nil
}

// refuseMounted answers FailedPrecondition for a volume mounted on this
// node: in the node's own mount table, or in any other mount namespace
// (a task's that outlived its unmount), naming the processes there.
func (m *Manager) refuseMounted(v Volume) error {
	mounted, err := m.mounted(v.Dataset)
	if err != nil {
		return err
	}
	if mounted {
		return fmt.Errorf("%w: volume %s is mounted on node %s; unpublish it first", errdefs.ErrFailedPrecondition, v.ID, m.cfg.NodeID)
	}
	if m.host.MountHolders == nil {
		return nil
	}
	if holders := m.host.MountHolders(v.Dataset); len(holders) > 0 {
		m.log.Warn("volume not deleted: mounted in other mount namespaces", "volume_id", v.ID, "dataset", v.Dataset, "holders", holders)
		return fmt.Errorf("%w: volume %s is mounted in other mount namespaces on node %s (%s); "+
			"unpublish it, or end those processes, then delete it again", errdefs.ErrFailedPrecondition, v.ID, m.cfg.NodeID, strings.Join(holders, "; "))
	}
	return nil
}

// busyError is Delete's answer when ZFS refuses to destroy v's dataset as
// busy although the node has it unmounted: mounted in another mount
// namespace (a task's that outlived its unmount), or open there.
func (m *Manager) busyError(v Volume, err error) error {
	where := "still mounted?"
	if m.host.MountHolders != nil {
		if holders := m.host.MountHolders(v.Dataset); len(holders) > 0 {
			where = "mounted in other mount namespaces: " + strings.Join(holders, "; ")
		}
	}
	m.log.Warn("volume not deleted: its dataset is busy", "volume_id", v.ID, "dataset", v.Dataset, "where", where, "error", err)
	return fmt.Errorf("%w: volume %s is in use (%s); unpublish it first: %v", errdefs.ErrFailedPrecondition, v.ID, where, err)
}

// dropReplicationSnapshots destroys a deleted volume's replication
// snapshots, releasing the holds that protected them as incremental bases:
// with the volume gone there is nothing left to send. Only CSI snapshots
// and clone origins may keep a deleted volume as a tombstone.
//
// A replication snapshot may vanish or gain a hold between the listing and
// its destruction (a push's tidy prunes and holds on its own schedule):
// one that is gone counts as destroyed, one held meanwhile is released
// again.
func (m *Manager) dropReplicationSnapshots(ctx context.Context, dataset string) error {
	all, err := m.zfs.List(ctx, dataset)
	if errors.Is(err, zfs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return zfsError(err, "listing snapshots of "+dataset)
	}
	for _, ds := range all {
		if ds.Type != zfs.Snapshot || !strings.HasPrefix(shortName(ds.Name), contract.ReplicationSnapshotPrefix) {
			continue
		}
		if err := m.releaseAndDestroy(ctx, ds.Name); err != nil {
			return err
		}
	}
	return nil
}

// releaseAndDestroy releases every hold on a snapshot and destroys it. A
// snapshot already gone is destroyed; one that a clone keeps stays for its
// tombstone; one held again meanwhile is released again, a few times.
func (m *Manager) releaseAndDestroy(ctx context.Context, snap string) error {
	const attempts = 3
	var err error
	for range attempts {
		err = m.zfs.ReleaseAll(ctx, snap)
		if errors.Is(err, zfs.ErrNotFound) {
			return nil
		}
		if err != nil {
			return zfsError(err, "releasing the holds on "+snap)
		}
		err = m.zfs.Destroy(ctx, snap)
		if err == nil || errors.Is(err, zfs.ErrNotFound) || errors.Is(err, zfs.ErrHasDependents) {
			return nil
		}
		if !errors.Is(err, zfs.ErrBusy) {
			break
		}
	}
	return zfsError(err, "destroying "+snap)
}

// tombstone hides a deleted volume that still has snapshots or clones: it is
// renamed out of the volume namespace (so the name can be reused) and
// labelled deleted.
func (m *Manager) tombstone(ctx context.Context, v Volume) error {
	now := m.now()
	err := m.zfs.SetProperties(ctx, v.Dataset, copyrecord.TombstoneLabels(now))
	if err != nil {
		return zfsError(err, "marking volume "+v.ID+" deleted")
	}
	target := copyrecord.TombstoneName(v.Dataset, now)
	if err := m.zfs.Rename(ctx, v.Dataset, target); err != nil {
		return zfsError(err, "renaming deleted volume "+v.ID)
	}
	m.index.reindexSnapshotsOf(ctx, target) // its CSI snapshots moved with it
	return nil
}

// A tombstone goes when its last CSI snapshot and clone are gone: the
// deletes that can free one (of a snapshot on it, of a clone of one of
// its snapshots) collect that one tombstone (collectTombstone), and every
// listing of the node's primaries (at the node's start, and then at most
// every indexMaxAge, index.go) collects the ones it finds, which is what
// a crash between the two left behind. Tombstones are no copies: no copy
// lock guards them (docs/safety.md, "One owner of a copy").

// tombstonesAmong returns the tombstones among the children of the
// node's root.
func tombstonesAmong(children []zfs.Dataset) []string {
	var out []string
	for _, ds := range children {
		if ds.Type == zfs.Filesystem && ds.User[copyrecord.PropRole] == contract.RoleDeleted {
			out = append(out, ds.Name)
		}
	}
	return out
}

// sweepListed collects the tombstones a listing of the node's copies
// found and unloads the keys it found loaded on copies that are not
// staged (sweepKeys), apart from the listing and with its own deadline,
// unless the last sweep still runs (the next listing finds what it
// leaves). Best effort.
func (m *Manager) sweepListed(tombstones, keys []string) {
	if len(tombstones) == 0 && (len(keys) == 0 || m.host.Encryption == nil || m.host.Mounted == nil) {
		return
	}
	m.sweepMu.Lock()
	defer m.sweepMu.Unlock()
	if m.sweeping {
		return
	}
	m.sweeping = true
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), fillTimeout)
		defer cancel()
		for _, fs := range tombstones {
			m.collectTombstone(ctx, fs)
		}
		if m.host.Encryption != nil && m.host.Mounted != nil {
			m.sweepKeys(ctx, keys)
		}
		m.sweepMu.Lock()
		m.sweeping = false
		m.sweepMu.Unlock()
	}()
}

// collectTombstone destroys fs if it is a tombstone that no snapshot or
// clone needs any more, under its copy's lock: a tombstone whose rename
// was cut short by a crash still has the volume's own name, which a
// receive may be filling. Best effort: what cannot go now goes later.
func (m *Manager) collectTombstone(ctx context.Context, fs string) {
	unlock, err := m.lock(ctx, copyIDOfDataset(fs), "collecting a tombstone")
	if err != nil {
		return
	}
	defer unlock()
	m.collectTombstoneLocked(ctx, fs)
}

// collectTombstoneLocked is collectTombstone for a caller that holds the
// copy's lock.
func (m *Manager) collectTombstoneLocked(ctx context.Context, fs string) {
	ds, err := m.zfs.Get(ctx, fs)
	if err != nil || ds.Type != zfs.Filesystem || ds.User[copyrecord.PropRole] != contract.RoleDeleted {
		return
	}
	id := ds.User[copyrecord.PropVolumeID]
	if err := m.dropReplicationSnapshots(ctx, fs); err != nil {
		m.log.Warn("dropping a tombstone's replication snapshots failed", "volume_id", id, "error", err)
	}
	err = m.zfs.Destroy(ctx, fs)
	switch {
	case err == nil:
		m.log.Info("tombstone destroyed", "volume_id", id, "dataset", fs)
	case !errors.Is(err, zfs.ErrHasDependents) && !errors.Is(err, zfs.ErrNotFound):
		m.log.Warn("destroying tombstone failed", "volume_id", id, "dataset", fs, "error", err)
	}
}

// Forget drops the promise of a volume being deleted, so that a volume
// created later under the same name starts afresh.
func (m *Manager) Forget(ctx context.Context, id string) error {
	if !contract.IsVolumeID(id) {
		return nil
	}
	unlock, err := m.lock(ctx, id, "forgetting the promise")
	if err != nil {
		return err
	}
	defer unlock()
	return m.records.forget(ctx, id)
}
