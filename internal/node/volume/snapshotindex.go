package volume

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// The index of the node's CSI snapshots, beside that of its primaries
// (index.go says how both are kept exact).

// snapshots returns the index of the node's CSI snapshots: ID to snapshot
// name (dataset@ID).
func (x *Index) snapshots(ctx context.Context) (map[string]string, error) {
	return x.snapshotIndex.read(ctx, x.copies.now, x.listSnapshotIndex)
}

// listSnapshotIndex lists the node's CSI snapshots for their index.
func (x *Index) listSnapshotIndex(ctx context.Context) (map[string]string, error) {
	var duplicates map[string][]string
	list := func(ctx context.Context) ([]Snapshot, error) {
		all, err := x.copies.ListSnapshots(ctx)
		if err != nil {
			return nil, err
		}
		var kept []Snapshot
		kept, duplicates = oneCopyEach(x.root, all)
		return kept, nil
	}
	index, err := listForIndex(ctx, x.log, "CSI snapshots", &x.snapshotsListed, list, func(s Snapshot) (string, string) { return s.ID, s.Dataset })
	if err == nil {
		for id, copies := range duplicates {
			x.log.Info("a CSI snapshot is kept twice on this node; the copies of the indexed one's volume go with the snapshot's delete",
				"volume_id", copyIDOf(index[id]), "snapshot_id", id, "indexed", index[id], "duplicates", copies)
		}
		x.duplicates.set(duplicates)
	}
	return index, err
}

// snapshotDuplicates are the copies of CSI snapshots that the node's
// last listing found besides the one the snapshot index holds: a volume's
// live copy and a tombstone or set-aside copy of it holding the same
// snapshot. A receive that brings a snapshot such a copy keeps drops the
// older copy (Received, dropDuplicate), but only once the index is
// filled, and a process that crashed between the receive and that step
// never takes it; the index holds one dataset per ID, so a delete of the
// snapshot would destroy one copy and the next listing would find the
// other: a deleted snapshot listed again (docs/safety.md, D1). So the
// listing remembers the others, and DeleteSnapshotUpTo destroys them with
// the indexed copy.
type snapshotDuplicates struct {
	mu  sync.Mutex
	ids map[string][]string // snapshot ID -> the copies not indexed
}

// add remembers copy name of snapshot id beside the indexed one.
func (d *snapshotDuplicates) add(id, name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if slices.Contains(d.ids[id], name) {
		return
	}
	if d.ids == nil {
		d.ids = map[string][]string{}
	}
	d.ids[id] = append(d.ids[id], name)
}

func (d *snapshotDuplicates) set(ids map[string][]string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ids = ids
}

// of returns the copies of snapshot id besides the indexed one that the
// last listing found; they may be gone since.
func (d *snapshotDuplicates) of(id string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.ids[id])
}

// oneCopyEach returns snaps with one copy of each CSI snapshot, the one
// the index holds, and the others by snapshot ID.
//
// Copies are the same snapshot only when their GUIDs agree: a stream may
// bring any snapshot name (keepIndexed), so the name alone never makes a
// copy the genuine one. The copy that was on the node first (the lowest
// CreateTXG, which the pool gives and no stream sets) decides the GUID;
// of the copies with that GUID, the one on the volume's live copy
// (<root>/<id>) is kept, as a receive indexes it. Every other copy is
// returned as a duplicate, and a delete of the snapshot destroys those of
// the indexed copy's volume with it (deleteDuplicates).
func oneCopyEach(root string, snaps []Snapshot) (kept []Snapshot, duplicates map[string][]string) {
	byID := map[string][]Snapshot{}
	var order []string
	for _, s := range snaps {
		if _, seen := byID[s.ID]; !seen {
			order = append(order, s.ID)
		}
		byID[s.ID] = append(byID[s.ID], s)
	}
	for _, id := range order {
		copies := byID[id]
		best := indexedCopy(root, copies)
		kept = append(kept, copies[best])
		for i, c := range copies {
			if i == best {
				continue
			}
			if duplicates == nil {
				duplicates = map[string][]string{}
			}
			duplicates[id] = append(duplicates[id], c.Dataset)
		}
	}
	return kept, duplicates
}

// indexedCopy returns the place in copies (of one snapshot ID) of the
// copy the index holds (oneCopyEach).
func indexedCopy(root string, copies []Snapshot) int {
	first := 0
	for i, c := range copies {
		if c.CreateTXG < copies[first].CreateTXG {
			first = i
		}
	}
	best := first
	for i, c := range copies {
		if c.GUID == copies[first].GUID && zfs.Parent(c.Dataset) == root+"/"+copyIDOf(c.Dataset) {
			if zfs.Parent(copies[best].Dataset) != root+"/"+copyIDOf(copies[best].Dataset) || c.CreateTXG < copies[best].CreateTXG {
				best = i
			}
		}
	}
	return best
}

// reindexSnapshot reads one snapshot again and updates the index.
func (x *Index) reindexSnapshot(ctx context.Context, id, name string) {
	ds, err := x.zfs.Get(ctx, name)
	switch {
	case err == nil && isCSISnapshot(ds):
		x.snapshotIndex.update(id, ds.Name)
	case err == nil, errors.Is(err, zfs.ErrNotFound):
		x.snapshotIndex.update(id, "")
	default:
		x.snapshotIndex.invalidate()
	}
}

// reindexSnapshotsOf reads the CSI snapshots of a filesystem again after
// it was renamed (a tombstone, a copy set aside).
func (x *Index) reindexSnapshotsOf(ctx context.Context, fs string) {
	names, err := x.zfs.SnapshotNames(ctx, fs)
	if err != nil {
		x.snapshotIndex.invalidate()
		return
	}
	for _, name := range names {
		if id := shortName(name); contract.IsSnapshotID(id) {
			x.reindexSnapshot(ctx, id, name)
		}
	}
}

// SnapshotPage returns up to limit of the node's CSI snapshots (all, for
// limit 0) in the order of their IDs, from the first ID at or after from;
// only those of volume source when it is set (a snapshot's name says whose
// copy it is on, so no other is read).
func (x *Index) SnapshotPage(ctx context.Context, from string, limit int, source string) ([]Snapshot, error) {
	index, err := x.snapshots(ctx)
	if err != nil {
		return nil, err
	}
	return readPage(index, from, limit, func(_, name string) (Snapshot, bool, error) {
		if source != "" && copyIDOf(name) != source {
			return Snapshot{}, false, nil
		}
		s, err := x.copies.readSnapshot(ctx, name)
		if errors.Is(err, errdefs.ErrNotFound) {
			return s, false, nil
		}
		return s, true, err
	})
}
