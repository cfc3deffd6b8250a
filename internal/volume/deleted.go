package volume

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/zfs-nomad/zfs-nomad/internal/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/vocab"
	"github.com/zfs-nomad/zfs-nomad/internal/zfs"
)

// A CSI snapshot deleted while a node that holds a copy was away is
// remembered by every node that answered the delete, a majority of them
// (docs/replication.md, "Deleted while a node was away"): the controller
// hides the away node's copy from every listing and restore while one of
// them answers, deletes it when the node is back, and then has the
// records forgotten. Records are rare (a delete during an outage) and
// live until the outage ends, so each node keeps them as user properties
// of one dataset, PromisesDataset (no volume descends from it), and in
// memory once read.

// PropDeletedSnapshotPrefix + snapshot ID, on PromisesDataset:
// "CREATED_UNIX SOURCE_VOLUME_ID".
const PropDeletedSnapshotPrefix = propPrefix + "deleted-snapshot:"

// DeletedSnapshot records that every copy of snapshot ID created at or
// before CreatedUnix is deleted.
type DeletedSnapshot struct {
	ID             string
	SourceVolumeID string
	CreatedUnix    int64
}

func (d DeletedSnapshot) String() string {
	return strconv.FormatInt(d.CreatedUnix, 10) + " " + d.SourceVolumeID
}

func parseDeletedSnapshot(id, v string) (DeletedSnapshot, bool) {
	created, source, _ := strings.Cut(v, " ")
	n, err := strconv.ParseInt(created, 10, 64)
	if err != nil || !vocab.IsSnapshotID(id) {
		return DeletedSnapshot{}, false
	}
	return DeletedSnapshot{ID: id, SourceVolumeID: source, CreatedUnix: n}, true
}

// deletedRecords is the node's records in memory, read from the pool on
// first use; every change is written to the pool before it is kept here.
type deletedRecords struct {
	mu     sync.Mutex
	loaded bool
	byID   map[string]DeletedSnapshot
}

func (m *Manager) recordsDataset() string { return m.cfg.RootDataset + "/" + PromisesDataset }

// loadDeleted reads the records once; the caller holds m.deleted.mu.
func (m *Manager) loadDeleted(ctx context.Context) error {
	if m.deleted.loaded {
		return nil
	}
	props, err := m.zfs.OwnUserProperties(ctx, m.recordsDataset(), PropDeletedSnapshotPrefix)
	if err != nil && !errors.Is(err, zfs.ErrNotFound) { // no dataset: no record yet
		return zfsError(err, "reading the records of deleted snapshots")
	}
	m.deleted.byID = map[string]DeletedSnapshot{}
	for key, v := range props {
		id := strings.TrimPrefix(key, PropDeletedSnapshotPrefix)
		if d, ok := parseDeletedSnapshot(id, v); ok {
			m.deleted.byID[id] = d
		}
	}
	m.deleted.loaded = true
	return nil
}

// DeletedSnapshots returns the node's records of deleted snapshots,
// sorted by ID.
func (m *Manager) DeletedSnapshots(ctx context.Context) ([]DeletedSnapshot, error) {
	m.deleted.mu.Lock()
	defer m.deleted.mu.Unlock()
	if err := m.loadDeleted(ctx); err != nil {
		return nil, err
	}
	out := make([]DeletedSnapshot, 0, len(m.deleted.byID))
	for _, d := range m.deleted.byID {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// RememberDeleted records d; a record of the same snapshot that covers
// later copies stays.
func (m *Manager) RememberDeleted(ctx context.Context, d DeletedSnapshot) error {
	if !vocab.IsSnapshotID(d.ID) || d.CreatedUnix <= 0 {
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
	if err := m.zfs.SetProperties(ctx, m.recordsDataset(), map[string]string{PropDeletedSnapshotPrefix + d.ID: d.String()}); err != nil {
		return zfsError(err, "remembering that snapshot "+d.ID+" is deleted")
	}
	m.deleted.byID[d.ID] = d
	m.log.Info("remembered a deleted snapshot: a copy on a node that was away is hidden until it is deleted there", "snapshot_id", d.ID, "volume_id", d.SourceVolumeID)
	return nil
}

// ForgetDeleted removes the record of snapshot id, if there is one.
func (m *Manager) ForgetDeleted(ctx context.Context, id string) error {
	m.deleted.mu.Lock()
	defer m.deleted.mu.Unlock()
	if err := m.loadDeleted(ctx); err != nil {
		return err
	}
	d, ok := m.deleted.byID[id]
	if !ok {
		return nil
	}
	if err := m.zfs.ClearUserProperty(ctx, m.recordsDataset(), PropDeletedSnapshotPrefix+id); err != nil {
		return zfsError(err, "forgetting that snapshot "+id+" is deleted")
	}
	delete(m.deleted.byID, id)
	m.log.Info("forgot a deleted snapshot: no copy is left", "snapshot_id", id, "volume_id", d.SourceVolumeID)
	return nil
}
