package volume

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// A deleted CSI snapshot is remembered by every node that answered the
// delete, a majority of them (docs/replication.md, "Deleted snapshots"):
// a copy the delete could not reach (on a node that was away, or landed
// by a push that started before the delete) is hidden from every listing
// and restore while one of them answers, and deleted; then the controller
// has the records forgotten. Records are few (they live from a delete to
// the controller's next pass, or until an outage ends), so each node
// keeps them as user properties of one dataset, copyrecord.PromisesDataset (no
// volume descends from it), and in memory once read.

// deletedRecords is the node's records in memory, read from the pool on
// first use; every change is written to the pool before it is kept here.
type deletedRecords struct {
	mu     sync.Mutex
	loaded bool
	byID   map[string]copyrecord.DeletedSnapshot
}

func (m *Manager) recordsDataset() string {
	return m.cfg.RootDataset + "/" + copyrecord.PromisesDataset
}

// loadDeleted reads the records once; the caller holds m.deleted.mu.
func (m *Manager) loadDeleted(ctx context.Context) error {
	if m.deleted.loaded {
		return nil
	}
	props, err := m.zfs.OwnUserProperties(ctx, m.recordsDataset(), copyrecord.PropDeletedSnapshotPrefix)
	if err != nil && !errors.Is(err, zfs.ErrNotFound) { // no dataset: no record yet
		return zfsError(err, "reading the records of deleted snapshots")
	}
	m.deleted.byID = map[string]copyrecord.DeletedSnapshot{}
	for key, v := range props {
		id := strings.TrimPrefix(key, copyrecord.PropDeletedSnapshotPrefix)
		if d, ok := copyrecord.ParseDeletedSnapshot(id, v); ok {
			m.deleted.byID[id] = d
		}
	}
	m.deleted.loaded = true
	return nil
}

// DeletedSnapshots returns the node's records of deleted snapshots,
// sorted by ID.
func (m *Manager) DeletedSnapshots(ctx context.Context) ([]copyrecord.DeletedSnapshot, error) {
	m.deleted.mu.Lock()
	defer m.deleted.mu.Unlock()
	if err := m.loadDeleted(ctx); err != nil {
		return nil, err
	}
	out := make([]copyrecord.DeletedSnapshot, 0, len(m.deleted.byID))
	for _, d := range m.deleted.byID {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// RememberDeleted records d; a record of the same snapshot that covers
// later copies stays.
func (m *Manager) RememberDeleted(ctx context.Context, d copyrecord.DeletedSnapshot) error {
	if !contract.IsSnapshotID(d.ID) || d.CreatedUnix <= 0 {
		return fmt.Errorf("%w: remembering a deleted snapshot needs a snapshot ID and its creation time (got %q, %d)", errdefs.ErrInvalidArgument, d.ID, d.CreatedUnix)
	}
	m.deleted.mu.Lock()
	defer m.deleted.mu.Unlock()
	if err := m.loadDeleted(ctx); err != nil {
		return err
	}
	if old, ok := m.deleted.byID[d.ID]; ok && old.CreatedUnix >= d.CreatedUnix {
		return nil
	}
	if err := m.makeRecordDatasets(ctx, m.recordsDataset()); err != nil {
		return zfsError(err, "making the dataset of the node's records")
	}
	if err := m.zfs.SetProperties(ctx, m.recordsDataset(), map[string]string{copyrecord.PropDeletedSnapshotPrefix + d.ID: d.String()}); err != nil {
		return zfsError(err, "remembering that snapshot "+d.ID+" is deleted")
	}
	m.deleted.byID[d.ID] = d
	m.log.Info("remembered a deleted snapshot: a copy the delete could not reach is hidden until it is deleted", "snapshot_id", d.ID, "volume_id", d.SourceVolumeID)
	return nil
}

// ForgetDeleted removes the record of snapshot id, if there is one, once
// no copy it covers is on the node. It takes the copy lock of the
// snapshot's volume first, so it waits for a receive into that volume to
// end: a push that started before the delete may still carry a copy, and
// the receive drops it only while the record lives (Received, which
// calls dropDeleted under that lock).
func (m *Manager) ForgetDeleted(ctx context.Context, id string) error {
	d, ok, err := m.deletedRecord(ctx, id)
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
	m.deleted.mu.Lock()
	defer m.deleted.mu.Unlock()
	if _, ok := m.deleted.byID[id]; !ok {
		return nil
	}
	if err := m.zfs.ClearUserProperty(ctx, m.recordsDataset(), copyrecord.PropDeletedSnapshotPrefix+id); err != nil {
		return zfsError(err, "forgetting that snapshot "+id+" is deleted")
	}
	delete(m.deleted.byID, id)
	m.log.Info("forgot a deleted snapshot: no copy is left", "snapshot_id", id, "volume_id", d.SourceVolumeID)
	return nil
}

// deletedRecord returns the node's record of snapshot id's deletion.
func (m *Manager) deletedRecord(ctx context.Context, id string) (copyrecord.DeletedSnapshot, bool, error) {
	m.deleted.mu.Lock()
	defer m.deleted.mu.Unlock()
	if err := m.loadDeleted(ctx); err != nil {
		return copyrecord.DeletedSnapshot{}, false, err
	}
	d, ok := m.deleted.byID[id]
	return d, ok, nil
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
		d, ok, err := m.deletedRecord(ctx, snapID)
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
		m.reindexSnapshot(ctx, snapID, name)
		m.log.Info("dropped a received copy of a deleted snapshot: the push that carried it started before the delete", "volume_id", id, "snapshot_id", snapID, "dataset", name)
	}
}
