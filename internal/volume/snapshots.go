package volume

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/zfs-nomad/zfs-nomad/internal/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/zfs"
)

// CreateSnapshot snapshots a volume, or returns the snapshot an earlier
// identical request created. The same name for another volume fails with
// ErrAlreadyExists.
func (m *Manager) CreateSnapshot(ctx context.Context, volumeID, name string) (Snapshot, error) {
	if err := ValidateName("snapshot", name); err != nil {
		return Snapshot{}, err
	}
	id := SnapshotIDForName(name)
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
	dataset := v.Dataset + "@" + id
	props := map[string]string{PropSnapshotName: name, PropSourceVolume: volumeID}
	if err := m.zfs.Snapshot(ctx, dataset, props); err != nil {
		return Snapshot{}, zfsError(err, "creating snapshot "+id)
	}
	log.Info("snapshot created", "name", name, "dataset", dataset)
	ds, err := m.zfs.Get(ctx, dataset)
	if err != nil {
		return Snapshot{}, zfsError(err, "reading snapshot "+id)
	}
	return snapshotOf(ds), nil
}

// DeleteSnapshot deletes a snapshot; one that does not exist is deleted
// already. A snapshot with clones is destroyed once its last clone is.
func (m *Manager) DeleteSnapshot(ctx context.Context, id string) error {
	if !IsSnapshotID(id) {
		return nil
	}
	unlock, err := m.lock(ctx, id, "deleting a snapshot")
	if err != nil {
		return err
	}
	defer unlock()
	snap, err := m.findSnapshot(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	err = m.zfs.DestroyDeferred(ctx, snap.Dataset)
	if err != nil && !errors.Is(err, zfs.ErrNotFound) { // gone meanwhile: deleted
		return zfsError(err, "deleting snapshot "+id)
	}
	m.log.Info("snapshot deleted", "volume_id", snap.SourceVolumeID, "snapshot_id", id, "dataset", snap.Dataset)
	m.collectTombstones(ctx)
	return nil
}

// ListSnapshots returns the node's CSI snapshots sorted by ID, including
// those of deleted volumes.
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

// GetSnapshot returns one snapshot by ID.
func (m *Manager) GetSnapshot(ctx context.Context, id string) (Snapshot, error) {
	return m.findSnapshot(ctx, id)
}

func (m *Manager) findSnapshot(ctx context.Context, id string) (Snapshot, error) {
	if !IsSnapshotID(id) {
		return Snapshot{}, fmt.Errorf("%w: snapshot %q", errdefs.ErrNotFound, id)
	}
	snaps, err := m.ListSnapshots(ctx)
	if err != nil {
		return Snapshot{}, err
	}
	for _, s := range snaps {
		if s.ID == id {
			return s, nil
		}
	}
	return Snapshot{}, fmt.Errorf("%w: snapshot %s", errdefs.ErrNotFound, id)
}
