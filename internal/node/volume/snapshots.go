package volume

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// CreateSnapshot snapshots a volume, or returns the snapshot an earlier
// identical request created. The same name for another volume fails with
// ErrAlreadyExists.
func (m *Manager) CreateSnapshot(ctx context.Context, volumeID, name string) (Snapshot, error) {
	return m.CreateSnapshotAfter(ctx, volumeID, name, 0)
}

// CreateSnapshotAfter is CreateSnapshot in a second after
// createdAfterUnix by the node's clock, which stamps the snapshot: a
// record of an earlier snapshot of that name, deleted while a node was
// away, covers copies up to its creation second and must not cover this
// one (deleted.go). It waits for that second to pass, a few seconds at
// most; a clock further behind is Unavailable.
func (m *Manager) CreateSnapshotAfter(ctx context.Context, volumeID, name string, createdAfterUnix int64) (Snapshot, error) {
	if err := contract.ValidateName("snapshot", name); err != nil {
		return Snapshot{}, err
	}
	id := contract.SnapshotIDForName(name)
	log := m.log.With("volume_id", volumeID, "snapshot_id", id)
	unlock, err := m.lock(ctx, volumeID, "snapshot")
	if err != nil {
		return Snapshot{}, err
	}
	defer unlock()

	existing, err := m.findSnapshot(ctx, id)
	switch {
	case err == nil && existing.SourceVolumeID == volumeID:
		return existing, nil
	case err == nil:
		return Snapshot{}, fmt.Errorf("%w: snapshot %q exists for volume %s, not %s", errdefs.ErrAlreadyExists, name, existing.SourceVolumeID, volumeID)
	case !errors.Is(err, errdefs.ErrNotFound):
		return Snapshot{}, err
	}
	v, err := m.get(ctx, volumeID)
	if err != nil {
		return Snapshot{}, err
	}
	if v.MovingTo != "" {
		return Snapshot{}, fmt.Errorf("%w: volume %s is moving to node %s; retry when the move is done", errdefs.ErrUnavailable, volumeID, v.MovingTo)
	}
	if err := m.waitPast(ctx, createdAfterUnix); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot %s of volume %s: %w", id, volumeID, err)
	}
	dataset := v.Dataset + "@" + id
	props := map[string]string{copyrecord.PropSnapshotName: name, copyrecord.PropSourceVolume: volumeID}
	if err := m.zfs.Snapshot(ctx, dataset, props); err != nil {
		return Snapshot{}, zfsError(err, "creating snapshot "+id)
	}
	log.Info("snapshot created", "name", name, "dataset", dataset)
	m.index.reindexSnapshot(ctx, id, dataset)
	return m.readSnapshot(ctx, dataset)
}

// waitPast waits until the node's clock is past second unix (a few
// seconds at most).
func (m *Manager) waitPast(ctx context.Context, unix int64) error {
	const longest = 3 * time.Second
	for waited := time.Duration(0); m.now().Unix() <= unix; waited += 100 * time.Millisecond {
		if waited >= longest {
			return fmt.Errorf("%w: this node's clock (%s) is behind the creation of an earlier snapshot of that name (%s), deleted while a node was away; check the node's clock, and retry",
				errdefs.ErrUnavailable, m.now().UTC().Format(time.RFC3339), time.Unix(unix, 0).UTC().Format(time.RFC3339))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// DeleteSnapshot deletes a snapshot; one that does not exist is deleted
// already. A snapshot with clones is destroyed once its last clone is. It
// is a change of its volume's copy, made under the copy's lock.
func (m *Manager) DeleteSnapshot(ctx context.Context, id string) error {
	return m.DeleteSnapshotUpTo(ctx, id, 0)
}

// DeleteSnapshotUpTo is DeleteSnapshot of a copy created at or before
// createdUpToUnix (any, when 0): a record of an earlier deletion
// (deleted.go) never deletes a snapshot taken again under the same name.
func (m *Manager) DeleteSnapshotUpTo(ctx context.Context, id string, createdUpToUnix int64) error {
	if !contract.IsSnapshotID(id) {
		return nil
	}
	snap, err := m.findSnapshot(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	unlock, err := m.lock(ctx, copyIDOf(snap.Dataset), "deleting snapshot "+id)
	if err != nil {
		return err
	}
	defer unlock()
	// Found again under the lock: a delete of its volume may have moved
	// it to a tombstone meanwhile.
	if snap, err = m.findSnapshot(ctx, id); errors.Is(err, errdefs.ErrNotFound) {
		return nil
	} else if err != nil {
		return err
	}
	if createdUpToUnix > 0 && snap.Created.Unix() > createdUpToUnix {
		m.log.Info("snapshot kept: taken again under the name of a deleted one, after it", "volume_id", snap.SourceVolumeID, "snapshot_id", id, "dataset", snap.Dataset)
		return nil
	}
	// The other copies go first: a retry after a failure finds the
	// indexed one still there, and with it the way to them.
	if err := m.deleteDuplicates(ctx, id, copyIDOf(snap.Dataset), createdUpToUnix); err != nil {
		return err
	}
	err = m.zfs.DestroyDeferred(ctx, snap.Dataset)
	if err != nil && !errors.Is(err, zfs.ErrNotFound) { // gone meanwhile: deleted
		return zfsError(err, "deleting snapshot "+id)
	}
	m.index.reindexSnapshot(ctx, id, snap.Dataset)
	m.log.Info("snapshot deleted", "volume_id", snap.SourceVolumeID, "snapshot_id", id, "dataset", snap.Dataset)
	m.collectTombstoneLocked(ctx, zfs.Parent(snap.Dataset))
	return nil
}

// deleteDuplicates destroys the other copies of snapshot id that the
// volume whose lock the caller holds keeps on the node, as the last
// listing found them (snapshotDuplicates), under the same rule as the
// indexed copy.
func (m *Manager) deleteDuplicates(ctx context.Context, id, volumeID string, createdUpToUnix int64) error {
	for _, name := range m.index.duplicates.of(id) {
		if copyIDOf(name) != volumeID {
			continue
		}
		s, err := m.readSnapshot(ctx, name)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue // dropped meanwhile (a receive, a tombstone collected)
		}
		if err != nil {
			return err
		}
		if createdUpToUnix > 0 && s.Created.Unix() > createdUpToUnix {
			continue
		}
		if err := m.zfs.DestroyDeferred(ctx, name); err != nil && !errors.Is(err, zfs.ErrNotFound) {
			return zfsError(err, "deleting the second copy of snapshot "+id)
		}
		m.log.Info("snapshot deleted: a second copy the volume kept", "volume_id", volumeID, "snapshot_id", id, "dataset", name)
		m.collectTombstoneLocked(ctx, zfs.Parent(name))
	}
	return nil
}

// copyIDOf is the volume ID of the copy a snapshot name belongs to:
// <root>/<id>@..., or a tombstone's or set-aside copy's <root>/<id>-...@...
func copyIDOf(snapshot string) string {
	return copyIDOfDataset(zfs.Parent(snapshot))
}

// copyIDOfDataset is the volume ID of a copy's dataset: <root>/<id>, or a
// tombstone's or set-aside copy's <root>/<id>-...; the lock of that ID
// guards it.
func copyIDOfDataset(fs string) string {
	short := shortName(fs)
	const idLen = len("vol-") + 20
	if len(short) >= idLen && contract.IsVolumeID(short[:idLen]) {
		return short[:idLen]
	}
	return short
}

// ListSnapshots returns the node's CSI snapshots sorted by ID, including
// those of deleted volumes, from one listing of the whole node: it fills
// the snapshot index; callers page through SnapshotPage.
func (m *Manager) ListSnapshots(ctx context.Context) ([]Snapshot, error) {
	all, err := m.zfs.List(ctx, m.cfg.RootDataset)
	if err != nil {
		return nil, zfsError(err, "listing snapshots")
	}
	var out []Snapshot
	for _, ds := range all {
		if isCSISnapshot(ds) {
			out = append(out, snapshotOf(ds))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// GetSnapshot returns one snapshot by ID, with its volume's owner: the
// owner digest of the copy it is on (a volume, a replica, a tombstone or
// a set-aside copy: each keeps its volume's parameters).
func (m *Manager) GetSnapshot(ctx context.Context, id string) (Snapshot, error) {
	s, err := m.findSnapshot(ctx, id)
	if err != nil {
		return Snapshot{}, err
	}
	copyOf, err := m.zfs.Get(ctx, zfs.Parent(s.Dataset))
	if err != nil {
		return Snapshot{}, zfsError(err, "the copy of snapshot "+id)
	}
	s.OwnerDigest = copyrecord.DecodeParameters(copyOf.User[copyrecord.PropParameters])[contract.ParamOwnerDigest]
	return s, nil
}

// findSnapshot finds a CSI snapshot through the index, reading it to be
// sure: an entry whose snapshot is gone (destroyed by hand, or rolled back
// on a replica) makes the index list again, once.
func (m *Manager) findSnapshot(ctx context.Context, id string) (Snapshot, error) {
	if !contract.IsSnapshotID(id) {
		return Snapshot{}, fmt.Errorf("%w: snapshot %q", errdefs.ErrNotFound, id)
	}
	for attempt := 0; ; attempt++ {
		index, err := m.index.snapshots(ctx)
		if err != nil {
			return Snapshot{}, err
		}
		name, ok := index[id]
		if !ok {
			return Snapshot{}, fmt.Errorf("%w: snapshot %s", errdefs.ErrNotFound, id)
		}
		s, err := m.readSnapshot(ctx, name)
		if errors.Is(err, errdefs.ErrNotFound) && attempt == 0 {
			m.index.snapshotIndex.invalidate()
			continue
		}
		return s, err
	}
}

// ForgetDeleted removes the record of snapshot id, if there is one, once
// no copy it covers is on the node. It takes the copy lock of the
// snapshot's volume first, so it waits for a receive into that volume to
// end: a push that started before the delete may still carry a copy, and
// the receive drops it only while the record lives (Received, which
// calls dropDeleted under that lock).
func (m *Manager) ForgetDeleted(ctx context.Context, id string) error {
	d, ok, err := m.records.deletedRecord(ctx, id)
	if err != nil || !ok {
		return err
	}
	if contract.IsVolumeID(d.SourceVolumeID) {
		unlock, err := m.lock(ctx, d.SourceVolumeID, "forgetting deleted snapshot "+id)
		if err != nil {
			return fmt.Errorf("the record of deleted snapshot %s is kept: %w", id, err)
		}
		defer unlock()
	}
	switch snap, err := m.findSnapshot(ctx, id); {
	case err == nil && snap.Created.Unix() <= d.CreatedUnix:
		return fmt.Errorf("%w: the record of deleted snapshot %s is kept: a copy it covers is on this node (%s); delete it first",
			errdefs.ErrFailedPrecondition, id, snap.Dataset)
	case err != nil && !errors.Is(err, errdefs.ErrNotFound):
		return err
	}
	return m.records.forgetDeleted(ctx, id, d.SourceVolumeID)
}

// dropDeleted destroys the CSI snapshots among names (of the copy of
// volume id) that a record of their deletion covers: a push that started
// before the delete brought them (docs/replication.md, "Deleted
// snapshots"). The caller holds the copy's lock. A
// failure leaves the copy hidden by the record, and the controller's
// next pass deletes it.
func (m *Manager) dropDeleted(ctx context.Context, id string, names []string) {
	for _, name := range names {
		snapID := shortName(name)
		if !contract.IsSnapshotID(snapID) {
			continue
		}
		d, ok, err := m.records.deletedRecord(ctx, snapID)
		if err != nil || !ok {
			continue
		}
		snap, err := m.readSnapshot(ctx, name)
		if err != nil || snap.Created.Unix() > d.CreatedUnix {
			continue // gone, or taken again after the deletion
		}
		if err := m.zfs.DestroyDeferred(ctx, name); err != nil && !errors.Is(err, zfs.ErrNotFound) {
			m.log.Warn("dropping a received copy of a deleted snapshot failed; it stays hidden, and the controller deletes it", "volume_id", id, "snapshot_id", snapID, "error", err)
			continue
		}
		m.index.reindexSnapshot(ctx, snapID, name)
		m.log.Info("dropped a received copy of a deleted snapshot: the push that carried it started before the delete", "volume_id", id, "snapshot_id", snapID, "dataset", name)
	}
}

// readSnapshot reads one CSI snapshot by its name.
func (m *Manager) readSnapshot(ctx context.Context, name string) (Snapshot, error) {
	ds, err := m.zfs.Get(ctx, name)
	if err != nil {
		return Snapshot{}, zfsError(err, "snapshot "+name)
	}
	if !isCSISnapshot(ds) {
		return Snapshot{}, errdefs.Wrap(errdefs.ErrNotFound, "%s is no CSI snapshot", name)
	}
	return snapshotOf(ds), nil
}
