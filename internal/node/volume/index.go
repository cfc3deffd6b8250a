package volume

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// The node's indexes of its primaries and of its CSI snapshots
// (docs/volumes.md, "Counting and listing"): placement's volume count,
// ListVolumes' and ListSnapshots' pages and finding a snapshot by ID come
// from them, so none opens every dataset on the node. One listing fills
// an index, at the node's start (WarmIndexes) or when first needed; every
// change that can make, end or rename a primary or a CSI snapshot
// (create, delete, promote, demote, snapshot), holding the copy's lock,
// reads what it changed again and updates the index, and an update made
// while a listing runs is applied over that listing too. So an index is
// exact for the driver's own changes, and a crash loses nothing (the next
// process lists again). A change made by hand behind the driver's back
// shows at the latest after the index's maxAge, when the next read starts a
// listing (and serves the index it has until that listing ends); an entry
// whose dataset is gone is caught when it is read (ListPage and
// findSnapshot read each entry they return).

// Index is the node's index of its primaries and of its CSI snapshots.
// It reads the copies through indexedCopies (the Manager), which updates
// it after every change it makes under a copy's lock.
type Index struct {
	copies indexedCopies
	zfs    zfs.Reader
	root   string
	log    hclog.Logger
	// started is the process's start: part of VolumesVersion.
	started time.Time
	// primariesListed and snapshotsListed tell whether each index was
	// listed once since the start.
	primaryIndex, snapshotIndex      idIndex
	primariesListed, snapshotsListed atomic.Bool
	// duplicates: the second copies of CSI snapshots the last listing
	// found (snapshotDuplicates).
	duplicates snapshotDuplicates
}

// indexedCopies are the node's copies as the Index lists and reads them.
type indexedCopies interface {
	// listPrimaries lists the node's primaries (and sees to what the
	// same listing finds: Manager.listPrimaries).
	listPrimaries(ctx context.Context) ([]Volume, error)
	ListSnapshots(ctx context.Context) ([]Snapshot, error)
	get(ctx context.Context, id string) (Volume, error)
	readSnapshot(ctx context.Context, name string) (Snapshot, error)
	// received sees to what a receive brought into a copy (Received).
	received(id string)
	// now is the node's wall clock, which ages the indexes.
	now() time.Time
}

func newIndex(copies indexedCopies, z zfs.Reader, root string, log hclog.Logger) *Index {
	return &Index{copies: copies, zfs: z, root: root, log: log, started: time.Now()}
}

// indexMaxAge bounds how long an index trusts itself without a listing,
// unless its listings are slow (relistSpacing).
const indexMaxAge = 5 * time.Minute

// relistSpacing keeps an index from listing again sooner than this many
// times its last listing took: a listing of a node's whole tree walks
// every dataset, and on a node with a thousand volumes under a slow pool
// (30 s in the test guest) a listing every five minutes would compete
// with the calls it serves a tenth of the time, for the sake of changes
// made by hand. Spaced this way, relisting costs a node at most about
// 1/relistSpacing of one pool's time per index; a change made by hand
// shows after at most relistSpacing listings' time.
const relistSpacing = 60

// slowListing is how long a listing may take before it is logged at info
// level: an operator sees why calls slow down, and how often the node
// lists again.
const slowListing = 5 * time.Second

// idIndex maps IDs to their datasets.
type idIndex struct {
	mu      sync.Mutex
	entries map[string]string // nil until filled
	listed  time.Time         // when it was filled
	changes uint64            // updates so far (VolumesVersion)
	// changed logs which ID each of the last updates changed (at most
	// changeLogMax), for ChangedSince; updates up to logFloor are not in
	// it any more.
	changed  []change
	logFloor uint64
	filling  chan struct{} // closed when the running listing ends; nil when none runs
	// raced holds the updates made while the running listing runs: the
	// listing may have read their datasets before or after the change,
	// so they are applied over it when it ends.
	raced map[string]string
	// invalidations counts invalidate calls: a listing that one raced is
	// not kept, as what went wrong may be missing from it.
	invalidations uint64
	lastErr       error         // why the last listing failed
	failed        time.Time     // when the last failed listing began
	took          time.Duration // how long the last kept listing took
}

// relistAfterFailure is how long an index that has entries waits after a
// failed listing before it lists again: without it, every read of a stale
// index whose listings fail (a sick pool) would start one more listing of
// the whole node, each costing seconds at a thousand volumes.
const relistAfterFailure = 30 * time.Second

// fillTimeout bounds one listing of the node. It runs apart from the
// call that started it: on a node with many volumes under a slow pool it
// may outlast that call's deadline (the controller's GetNode), and
// cutting it short every time would leave the index empty for good.
const fillTimeout = 10 * time.Minute

// read returns a copy of the index. An index that was never filled, or
// was invalidated, is listed first with list, and the caller waits; one
// older than its maxAge on the clock now is returned as it is while a
// listing runs apart (it is exact for the driver's own changes, which
// update it; only a change made by hand waits for that listing). So no
// call but the first after a start or an invalidation meets a listing,
// which takes seconds with a thousand volumes: BenchmarkScale found every
// fifth minute's create and delete waiting for one. One listing runs at
// a time, whoever asked; a caller whose ctx ends stops waiting for it,
// not the listing. A listing that an invalidation raced is not kept, and
// the caller waits for another.
func (x *idIndex) read(ctx context.Context, now func() time.Time, list func(context.Context) (map[string]string, error)) (map[string]string, error) {
	for {
		x.mu.Lock()
		if x.entries != nil {
			defer x.mu.Unlock()
			if x.relistDue(now) {
				x.startFill(now, list)
			}
			return copyMap(x.entries), nil
		}
		done := x.startFill(now, list)
		x.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return nil, fmt.Errorf("listing the node's datasets (still running): %w", ctx.Err())
		}
		x.mu.Lock()
		err := x.lastErr
		x.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
}

// warm starts a listing unless the index is fresh or one runs.
func (x *idIndex) warm(now func() time.Time, list func(context.Context) (map[string]string, error)) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.relistDue(now) {
		x.startFill(now, list)
	}
}

// relistDue tells whether an index should list again: it is not fresh,
// and its last listing did not fail within relistAfterFailure (one that
// has no entries lists at once: its readers wait for it). The caller
// holds x.mu.
func (x *idIndex) relistDue(now func() time.Time) bool {
	if x.fresh(now) {
		return false
	}
	sinceFailure := now().Sub(x.failed)
	return x.entries == nil || x.lastErr == nil || sinceFailure >= relistAfterFailure || sinceFailure < 0
}

// fresh tells whether the index holds a listing younger than its
// maxAge. The caller holds x.mu.
func (x *idIndex) fresh(now func() time.Time) bool {
	return x.entries != nil && now().Sub(x.listed) < x.maxAge() && !now().Before(x.listed)
}

// maxAge is how long the index trusts its last listing: indexMaxAge, or
// relistSpacing times that listing's duration when that is longer. The
// caller holds x.mu.
func (x *idIndex) maxAge() time.Duration { return relistAfter(x.took) }

// relistAfter is how long an index trusts a listing that took took.
func relistAfter(took time.Duration) time.Duration {
	return max(indexMaxAge, relistSpacing*took)
}

// startFill starts a listing unless one runs, and returns the channel
// closed when the running one ends. The caller holds x.mu.
func (x *idIndex) startFill(now func() time.Time, list func(context.Context) (map[string]string, error)) chan struct{} {
	if x.filling == nil {
		x.filling = make(chan struct{})
		x.raced = map[string]string{}
		go x.fill(now, list, x.filling)
	}
	return x.filling
}

// fill lists the node and keeps the listing, with the updates that raced
// it applied over it, unless an invalidation raced it.
func (x *idIndex) fill(now func() time.Time, list func(context.Context) (map[string]string, error), done chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), fillTimeout)
	defer cancel()
	x.mu.Lock()
	invalidations, started := x.invalidations, now()
	x.mu.Unlock()
	entries, err := list(ctx)
	x.mu.Lock()
	defer x.mu.Unlock()
	x.lastErr = err
	if err != nil {
		x.failed = started
	}
	if err == nil && x.invalidations == invalidations {
		for id, dataset := range x.raced {
			set(entries, id, dataset)
		}
		x.entries, x.listed, x.took = entries, started, max(0, now().Sub(started))
	}
	x.filling, x.raced = nil, nil
	close(done)
}

// change is one logged update: the ID it changed, and its number.
type change struct {
	seq uint64
	id  string
}

// changeLogMax bounds the change log: a caller further behind asks for
// everything.
const changeLogMax = 4096

// note counts a change of id's copy on the node and logs it. The caller
// holds x.mu.
func (x *idIndex) note(id string) {
	x.changes++
	x.changed = append(x.changed, change{seq: x.changes, id: id})
	if len(x.changed) > changeLogMax {
		drop := len(x.changed) - changeLogMax/2
		x.logFloor = x.changed[drop-1].seq
		x.changed = slices.Clone(x.changed[drop:])
	}
}

// changedSince returns the IDs changed by the updates after the first
// seq, each once, or false when the log no longer holds all of them, or
// they are more than limit.
func (x *idIndex) changedSince(seq uint64, limit int) ([]string, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if seq < x.logFloor || seq > x.changes {
		return nil, false
	}
	seen := map[string]bool{}
	var ids []string
	for _, c := range x.changed {
		if c.seq > seq && !seen[c.id] {
			seen[c.id] = true
			ids = append(ids, c.id)
		}
	}
	if len(ids) > limit {
		return nil, false
	}
	sort.Strings(ids)
	return ids, true
}

// update sets id's dataset, or removes id when dataset is "".
func (x *idIndex) update(id, dataset string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.note(id)
	if x.raced != nil {
		x.raced[id] = dataset
	}
	if x.entries != nil {
		set(x.entries, id, dataset)
	}
}

// entry returns id's dataset in the index, if the index holds one.
func (x *idIndex) entry(id string) (string, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	dataset, ok := x.entries[id]
	return dataset, ok
}

// knows tells whether an update of id to dataset would change nothing:
// the index has it so, or holds nothing and no listing runs (the next
// read lists).
func (x *idIndex) knows(id, dataset string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.filling != nil {
		return false
	}
	return x.entries == nil || x.entries[id] == dataset
}

// set sets id's dataset in entries, or removes id when dataset is "".
func set(entries map[string]string, id, dataset string) {
	if dataset == "" {
		delete(entries, id)
	} else {
		entries[id] = dataset
	}
}

// invalidate makes the next read list again.
func (x *idIndex) invalidate() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.changes++
	x.invalidations++
	x.entries = nil
	// What changed is unknown: nobody behind this learns it from the log.
	x.changed, x.logFloor = nil, x.changes
}

func copyMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// sortedFrom returns the keys of m at or after from, sorted.
func sortedFrom(m map[string]string, from string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		if k >= from {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// primaries returns the index of the node's primaries: ID to dataset.
func (x *Index) primaries(ctx context.Context) (map[string]string, error) {
	return x.primaryIndex.read(ctx, x.copies.now, x.listPrimaries)
}

// listPrimaries lists the node's primaries for their index.
func (x *Index) listPrimaries(ctx context.Context) (map[string]string, error) {
	return listForIndex(ctx, x.log, "primaries", &x.primariesListed, x.copies.listPrimaries, func(v Volume) (string, string) { return v.ID, v.Dataset })
}

// listForIndex lists what an index holds with list, maps each item to
// its ID and dataset with entry, and logs how long that took: at a
// thousand volumes a listing costs seconds. The first listing since the
// start (listed tells) and a slow one log at info: an operator sees when
// a node that started has its indexes, and why calls slow down.
func listForIndex[T any](ctx context.Context, log hclog.Logger, what string, listed *atomic.Bool, list func(context.Context) ([]T, error), entry func(T) (id, dataset string)) (map[string]string, error) {
	began := time.Now()
	items, err := list(ctx)
	if err != nil {
		log.Warn("listing the node's "+what+" for their index failed", "error", err)
		return nil, err
	}
	out := make(map[string]string, len(items))
	for _, item := range items {
		id, dataset := entry(item)
		out[id] = dataset
	}
	took := time.Since(began)
	logAt := log.Debug
	if first := !listed.Swap(true); first || took >= slowListing {
		logAt = log.Info
	}
	logAt("listed the node's "+what+" for their index", "count", len(out), "took", took,
		"next_listing_after", relistAfter(took))
	return out, nil
}

// WarmIndexes starts the listings that fill the node's indexes, which the
// node runs once at its start: then the first calls after a start (the
// controller's GetNode, a ListVolumes) find them filled, instead of
// waiting for a listing that, with a thousand volumes under a slow pool,
// outlasts their deadline.
func (x *Index) WarmIndexes() {
	x.primaryIndex.warm(x.copies.now, x.listPrimaries)
	x.snapshotIndex.warm(x.copies.now, x.listSnapshotIndex)
}

// reindex reads volume id's copy again and updates the index of
// primaries. The caller holds the copy's lock and has just changed it (or
// tried to). An error other than "no primary here" makes the index list
// again.
func (x *Index) reindex(ctx context.Context, id string) {
	v, err := x.copies.get(ctx, id)
	switch {
	case err == nil:
		x.primaryIndex.update(id, v.Dataset)
	case errors.Is(err, errdefs.ErrNotFound), errors.Is(err, errdefs.ErrFailedPrecondition):
		x.primaryIndex.update(id, "")
	default:
		x.primaryIndex.invalidate()
	}
}

// VolumesVersion changes whenever the node's primaries change (every
// update of the index), a replica is deleted (NoteChanged) and when the
// process restarts: the schedule asks again only the nodes whose version
// changed, and only for what ChangedSince tells (scheduler.Scheduler).
func (x *Index) VolumesVersion() string {
	x.primaryIndex.mu.Lock()
	defer x.primaryIndex.mu.Unlock()
	return fmt.Sprintf("%d-%d", x.started.UnixNano(), x.primaryIndex.changes)
}

// NoteChanged counts a change of a volume's copy on the node that is no
// change of its primaries (a replica deleted), so that VolumesVersion
// moves and ChangedSince tells it.
func (x *Index) NoteChanged(id string) {
	x.primaryIndex.mu.Lock()
	defer x.primaryIndex.mu.Unlock()
	x.primaryIndex.note(id)
}

// ChangedSince returns the IDs of the volumes whose copy on the node
// changed since the node reported version (VolumesVersion), or false when
// it cannot tell: version is another process's, the node's change log no
// longer reaches back to it, or the IDs are more than limit.
func (x *Index) ChangedSince(version string, limit int) ([]string, bool) {
	started, seq, ok := strings.Cut(version, "-")
	if !ok || started != strconv.FormatInt(x.started.UnixNano(), 10) {
		return nil, false
	}
	n, err := strconv.ParseUint(seq, 10, 64)
	if err != nil {
		return nil, false
	}
	return x.primaryIndex.changedSince(n, limit)
}

// ListPage returns up to limit of the node's primaries (all, for limit 0)
// in the order of their IDs, from the first ID at or after from: the cost
// is the page's, not the node's.
func (x *Index) ListPage(ctx context.Context, from string, limit int) ([]Volume, error) {
	index, err := x.primaries(ctx)
	if err != nil {
		return nil, err
	}
	return readPage(index, from, limit, func(id, _ string) (Volume, bool, error) {
		v, err := x.copies.get(ctx, id)
		if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrFailedPrecondition) {
			return v, false, nil // gone or changed by hand: the index learns at its next listing
		}
		return v, true, err
	})
}

// readPage reads the entries of index (ID to dataset) in the order of
// their IDs, from the first ID at or after from, until it has limit of
// them (all, for limit 0). read returns false for an entry to pass over.
func readPage[T any](index map[string]string, from string, limit int, read func(id, name string) (T, bool, error)) ([]T, error) {
	var out []T
	for _, id := range sortedFrom(index, from) {
		if limit > 0 && len(out) == limit {
			break
		}
		v, ok, err := read(id, index[id])
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, v)
		}
	}
	return out, nil
}
