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

func (r *Records) recordsDataset() string {
	return r.root + "/" + copyrecord.PromisesDataset
}

// loadDeleted reads the records once; the caller holds r.deleted.mu.
func (r *Records) loadDeleted(ctx context.Context) error {
	if r.deleted.loaded {
		return nil
	}
	props, err := r.zfs.OwnUserProperties(ctx, r.recordsDataset(), copyrecord.PropDeletedSnapshotPrefix)
	if err != nil && !errors.Is(err, zfs.ErrNotFound) { // no dataset: no record yet
		return zfsError(err, "reading the records of deleted snapshots")
	}
	r.deleted.byID = map[string]copyrecord.DeletedSnapshot{}
	for key, v := range props {
		id := strings.TrimPrefix(key, copyrecord.PropDeletedSnapshotPrefix)
		if d, ok := copyrecord.ParseDeletedSnapshot(id, v); ok {
			r.deleted.byID[id] = d
		}
	}
	r.deleted.loaded = true
	return nil
}

// DeletedSnapshots returns the node's records of deleted snapshots,
// sorted by ID.
func (r *Records) DeletedSnapshots(ctx context.Context) ([]copyrecord.DeletedSnapshot, error) {
	r.deleted.mu.Lock()
	defer r.deleted.mu.Unlock()
	if err := r.loadDeleted(ctx); err != nil {
		return nil, err
	}
	out := make([]copyrecord.DeletedSnapshot, 0, len(r.deleted.byID))
	for _, d := range r.deleted.byID {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// RememberDeleted records d; a record of the same snapshot that covers
// later copies stays.
func (r *Records) RememberDeleted(ctx context.Context, d copyrecord.DeletedSnapshot) error {
	if !contract.IsSnapshotID(d.ID) || d.CreatedUnix <= 0 {
		return fmt.Errorf("%w: remembering a deleted snapshot needs a snapshot ID and its creation time (got %q, %d)", errdefs.ErrInvalidArgument, d.ID, d.CreatedUnix)
	}
	r.deleted.mu.Lock()
	defer r.deleted.mu.Unlock()
	if err := r.loadDeleted(ctx); err != nil {
		return err
	}
	if old, ok := r.deleted.byID[d.ID]; ok && old.CreatedUnix >= d.CreatedUnix {
		return nil
	}
	if err := r.makeRecordDatasets(ctx, r.recordsDataset()); err != nil {
		return zfsError(err, "making the dataset of the node's records")
	}
	if err := r.zfs.SetProperties(ctx, r.recordsDataset(), map[string]string{copyrecord.PropDeletedSnapshotPrefix + d.ID: d.String()}); err != nil {
		return zfsError(err, "remembering that snapshot "+d.ID+" is deleted")
	}
	r.deleted.byID[d.ID] = d
	r.log.Info("remembered a deleted snapshot: a copy the delete could not reach is hidden until it is deleted", "snapshot_id", d.ID, "volume_id", d.SourceVolumeID)
	return nil
}

// deletedRecord returns the node's record of snapshot id's deletion.
func (r *Records) deletedRecord(ctx context.Context, id string) (copyrecord.DeletedSnapshot, bool, error) {
	r.deleted.mu.Lock()
	defer r.deleted.mu.Unlock()
	if err := r.loadDeleted(ctx); err != nil {
		return copyrecord.DeletedSnapshot{}, false, err
	}
	d, ok := r.deleted.byID[id]
	return d, ok, nil
}

// forgetDeleted removes the record of snapshot id, if there is one; the
// caller checked that no copy it covers is on the node
// (Manager.ForgetDeleted).
func (r *Records) forgetDeleted(ctx context.Context, id, volumeID string) error {
	r.deleted.mu.Lock()
	defer r.deleted.mu.Unlock()
	if _, ok := r.deleted.byID[id]; !ok {
		return nil
	}
	if err := r.zfs.ClearUserProperty(ctx, r.recordsDataset(), copyrecord.PropDeletedSnapshotPrefix+id); err != nil {
		return zfsError(err, "forgetting that snapshot "+id+" is deleted")
	}
	delete(r.deleted.byID, id)
	r.log.Info("forgot a deleted snapshot: no copy is left", "snapshot_id", id, "volume_id", volumeID)
	return nil
}
