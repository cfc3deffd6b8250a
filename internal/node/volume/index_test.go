package volume

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfsfake"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// primaryIDsListed are the node's primaries from a full listing: the
// truth the index must agree with.
func primaryIDsListed(t *testing.T, m *Manager) []string {
	t.Helper()
	vols, err := m.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return idsOf(vols)
}

func pageIDs(t *testing.T, m *Manager, from string, limit int) []string {
	t.Helper()
	vols, err := m.index.ListPage(context.Background(), from, limit)
	if err != nil {
		t.Fatal(err)
	}
	return idsOf(vols)
}

func idsOf(vols []Volume) []string {
	var ids []string
	for _, v := range vols {
		ids = append(ids, v.ID)
	}
	return ids
}

// TestIndexFollowsTheDriversChanges: after every change that makes or
// ends a primary, the index (the volume count placement reads, and
// ListVolumes' pages) agrees with a full listing, without one.
func TestIndexFollowsTheDriversChanges(t *testing.T) {
	ctx := context.Background()
	m, fake := newManager(t)
	agree := func(step string) {
		t.Helper()
		want := primaryIDsListed(t, m)
		if got := pageIDs(t, m, "", 0); !slices.Equal(got, want) {
			t.Errorf("after %s: index %v, listing %v", step, got, want)
		}
		c, err := m.Capacity(ctx)
		if err != nil || c.Volumes != len(want) {
			t.Errorf("after %s: Capacity counts %d (%v), want %d", step, c.Volumes, err, len(want))
		}
	}
	agree("nothing")
	var ids []string
	for _, name := range []string{"a", "b", "c", "d"} {
		v := create(t, m, CreateRequest{Name: name})
		ids = append(ids, v.ID)
	}
	agree("creates")
	if err := m.Delete(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	agree("a delete")
	if err := m.Demote(ctx, ids[1], 2, true); err != nil {
		t.Fatal(err)
	}
	agree("a demotion")
	// A replica promoted here.
	id, _ := putCopy(t, fake, "r", contract.RoleReplica, 1, nil)
	if _, _, err := m.records.Reserve(ctx, id, 2, "n1"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Promote(ctx, id, 2, 0, "", true); err != nil {
		t.Fatal(err)
	}
	agree("a promotion")

	// Pages: from an ID on, a limited number.
	all := primaryIDsListed(t, m)
	if got := pageIDs(t, m, all[1], 1); !slices.Equal(got, all[1:2]) {
		t.Errorf("page from %s of 1: %v, want %v", all[1], got, all[1:2])
	}
	// By hand, behind the driver's back: a page skips what is gone, and
	// the count follows at the next listing.
	if err := fake.Destroy(ctx, "tank/nomad/"+all[0]); err != nil {
		t.Fatal(err)
	}
	if got := pageIDs(t, m, "", 0); slices.Contains(got, all[0]) {
		t.Errorf("a page lists %s, destroyed by hand", all[0])
	}
	m.UseClock(func() time.Time { return time.Now().Add(indexMaxAge + time.Second) })
	pageIDs(t, m, "", 0) // starts the listing of an index past its age
	waitForListing(t, &m.index.primaryIndex)
	agree("a destroy by hand, after indexMaxAge and the listing it started")
}

// waitForListing waits until no listing of x runs.
func waitForListing(t *testing.T, x *idIndex) {
	t.Helper()
	x.mu.Lock()
	done := x.filling
	x.mu.Unlock()
	if done == nil {
		return
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the index's listing did not end within 5s")
	}
}

// TestIndexServesItselfWhileItListsAgain: an index past indexMaxAge is
// listed again apart from its readers, who get the index as it is
// meanwhile (exact for the driver's own changes) instead of waiting for a
// listing of the whole node; a change made while the listing runs is not
// lost, and the next read after it has what the listing found.
func TestIndexServesItselfWhileItListsAgain(t *testing.T) {
	var x idIndex
	clock := time.Now()
	now := func() time.Time { return clock }
	first := func(context.Context) (map[string]string, error) {
		return map[string]string{"vol-a": "tank/nomad/vol-a"}, nil
	}
	if _, err := x.read(context.Background(), now, first); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(indexMaxAge)
	release := make(chan struct{})
	lists := 0
	slow := func(context.Context) (map[string]string, error) {
		lists++
		<-release
		// vol-b was made by hand; vol-c by the driver after the listing read.
		return map[string]string{"vol-a": "tank/nomad/vol-a", "vol-b": "tank/nomad/vol-b"}, nil
	}
	read := func(step string, want ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		got, err := x.read(ctx, now, slow)
		if err != nil {
			t.Fatalf("%s: %v (the read waited for the listing)", step, err)
		}
		if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, want) {
			t.Errorf("%s: %v, want %v", step, keys, want)
		}
	}
	read("past its age, while the listing runs", "vol-a")
	x.update("vol-c", "tank/nomad/vol-c")
	read("after a change, while the listing runs", "vol-a", "vol-c")
	close(release)
	waitForListing(t, &x)
	read("after the listing", "vol-a", "vol-b", "vol-c")
	if lists != 1 {
		t.Errorf("%d listings, want one: reads of a listing index start none", lists)
	}
}

// TestIndexListsAgainNoSoonerThanAWhileAfterAFailure: a stale index whose
// background listing failed keeps serving what it has, and its readers do
// not each start one more listing of the whole node: the next waits
// relistAfterFailure.
func TestIndexListsAgainNoSoonerThanAWhileAfterAFailure(t *testing.T) {
	var x idIndex
	clock := time.Now()
	now := func() time.Time { return clock }
	lists := 0
	list := func(context.Context) (map[string]string, error) {
		lists++
		if lists == 1 {
			return map[string]string{"vol-a": "tank/nomad/vol-a"}, nil
		}
		return nil, errors.New("the pool is sick")
	}
	read := func(step string, wantLists int) {
		t.Helper()
		got, err := x.read(context.Background(), now, list)
		if err != nil || len(got) != 1 {
			t.Fatalf("%s: %v, %v; want the index it has", step, got, err)
		}
		waitForListing(t, &x)
		if lists != wantLists {
			t.Errorf("%s: %d listings, want %d", step, lists, wantLists)
		}
	}
	read("filled", 1)
	clock = clock.Add(indexMaxAge)
	read("stale: lists again, and that fails", 2)
	read("right after the failure", 2)
	clock = clock.Add(relistAfterFailure - time.Second)
	read("before relistAfterFailure", 2)
	clock = clock.Add(time.Second)
	read("after relistAfterFailure", 3)
}

// TestASlowListingSpacesTheNext: an index whose listing took long trusts
// it for relistSpacing times that, not only indexMaxAge, so a node with a
// thousand volumes under a slow pool does not spend a tenth of its time
// listing; a quick listing keeps indexMaxAge.
func TestASlowListingSpacesTheNext(t *testing.T) {
	tests := []struct {
		name     string
		took     time.Duration
		fresh    time.Duration // still fresh this long after the listing began
		relisted time.Duration // listed again by a read this long after
	}{
		{"quick", time.Second, indexMaxAge - time.Second, indexMaxAge},
		{"at the bound", indexMaxAge / relistSpacing, indexMaxAge - time.Second, indexMaxAge},
		{"slow", 30 * time.Second, relistSpacing*30*time.Second - time.Second, relistSpacing * 30 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var x idIndex
			began := time.Now()
			clock := began
			now := func() time.Time { return clock }
			lists := 0
			list := func(context.Context) (map[string]string, error) {
				lists++
				clock = clock.Add(tt.took) // the listing's duration, on the index's clock
				return map[string]string{"vol-a": "tank/nomad/vol-a"}, nil
			}
			read := func(at time.Duration, wantLists int) {
				t.Helper()
				clock = began.Add(at)
				if _, err := x.read(context.Background(), now, list); err != nil {
					t.Fatal(err)
				}
				waitForListing(t, &x)
				if lists != wantLists {
					t.Errorf("a read %v after the first listing began: %d listings, want %d", at, lists, wantLists)
				}
			}
			read(0, 1)
			read(tt.fresh, 1)
			read(tt.relisted, 2)
		})
	}
}

// TestChangedSince: the node tells which volumes changed since a version
// it reported, each once, as long as it can be sure: not for another
// process's version, not past an invalidation, not further back than its
// log, not more than the caller's limit.
func TestChangedSince(t *testing.T) {
	ctx := context.Background()
	m, _ := newManager(t)
	v0 := m.index.VolumesVersion()
	a := create(t, m, CreateRequest{Name: "a"})
	v1 := m.index.VolumesVersion()
	b := create(t, m, CreateRequest{Name: "b"})
	if err := m.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	v2 := m.index.VolumesVersion()
	m.index.NoteChanged("vol-replica-gone")
	all := []string{a.ID, b.ID, "vol-replica-gone"}
	slices.Sort(all)
	now := m.index.VolumesVersion()
	tests := []struct {
		name   string
		since  string
		limit  int
		want   []string
		wantOK bool
	}{
		{"from the start", v0, 10, all, true},
		{"after the first create (a deleted since)", v1, 10, all, true},
		{"after the delete", v2, 10, []string{"vol-replica-gone"}, true},
		{"nothing since", now, 10, nil, true},
		{"more than the limit", v0, 2, nil, false},
		{"another process's version", "1-0", 10, nil, false},
		{"a version from the future", strings.Split(now, "-")[0] + "-999999", 10, nil, false},
		{"not a version", "garbage", 10, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := m.index.ChangedSince(tt.since, tt.limit)
			if ok != tt.wantOK || !slices.Equal(got, tt.want) {
				t.Errorf("ChangedSince(%s, %d) = %v, %v; want %v, %v", tt.since, tt.limit, got, ok, tt.want, tt.wantOK)
			}
		})
	}
	if v1 == now {
		t.Errorf("the version did not move: %s", now)
	}
	m.index.primaryIndex.invalidate()
	if got, ok := m.index.ChangedSince(now, 10); ok {
		t.Errorf("after an invalidation: %v, true; want not known", got)
	}
}

// TestChangeLogForgetsTheOldest: the change log keeps the newest changes;
// a caller further behind is told to ask for everything.
func TestChangeLogForgetsTheOldest(t *testing.T) {
	var x idIndex
	for i := range changeLogMax + 1 {
		x.update(fmt.Sprintf("vol-%d", i), "tank/nomad/x")
	}
	if _, ok := x.changedSince(0, changeLogMax*2); ok {
		t.Error("since the start, past the log's reach: known; want not")
	}
	ids, ok := x.changedSince(x.changes-1, 10)
	if !ok || !slices.Equal(ids, []string{fmt.Sprintf("vol-%d", changeLogMax)}) {
		t.Errorf("the last change: %v, %v", ids, ok)
	}
	if len(x.changed) > changeLogMax {
		t.Errorf("the log holds %d changes, more than %d", len(x.changed), changeLogMax)
	}
}

// TestIndexAppliesTheUpdatesThatRacedItsListing: a listing may read a
// dataset before or after a change that ends while it runs (the
// simulation found a count one too high after a start, when the node's
// first listing raced a change that ended a primary); the change's update
// is applied over the listing, and the listing is kept.
func TestIndexAppliesTheUpdatesThatRacedItsListing(t *testing.T) {
	var x idIndex
	now := time.Now
	stale := func(context.Context) (map[string]string, error) {
		x.update("vol-new", "tank/nomad/vol-new") // a create finished meanwhile
		x.update("vol-gone", "")                  // and a delete
		return map[string]string{"vol-old": "tank/nomad/vol-old", "vol-gone": "tank/nomad/vol-gone"}, nil
	}
	got, err := x.read(context.Background(), now, stale)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"vol-old": "tank/nomad/vol-old", "vol-new": "tank/nomad/vol-new"}
	if !maps.Equal(got, want) {
		t.Errorf("a listing raced by a create and a delete: %v, want %v", got, want)
	}
	if got, _ := x.read(context.Background(), now, failingList); !maps.Equal(got, want) {
		t.Errorf("the next read: %v, want the kept listing %v", got, want)
	}
}

// TestIndexKeepsNoListingThatAnInvalidationRaced: what made the index
// invalid may be missing from a listing that ran meanwhile, so the read
// lists again instead of answering from it.
func TestIndexKeepsNoListingThatAnInvalidationRaced(t *testing.T) {
	var x idIndex
	lists := 0
	list := func(context.Context) (map[string]string, error) {
		lists++
		if lists == 1 {
			x.invalidate()
			return map[string]string{"vol-stale": "tank/nomad/vol-stale"}, nil
		}
		return map[string]string{"vol-a": "tank/nomad/vol-a"}, nil
	}
	got, err := x.read(context.Background(), time.Now, list)
	if err != nil || lists != 2 || len(got) != 1 || got["vol-a"] == "" {
		t.Errorf("read: %v, %v after %d listings; want vol-a from a second listing", got, err, lists)
	}
}

func failingList(context.Context) (map[string]string, error) {
	return nil, errors.New("listed again")
}

// TestSnapshotIndex: CSI snapshots are found by ID through the index,
// also once their volume's dataset became a tombstone, and one destroyed
// by hand is not found.
func TestSnapshotIndex(t *testing.T) {
	ctx := context.Background()
	m, fake := newManager(t)
	v, _ := m.Create(ctx, CreateRequest{Name: "v"})
	s1, err := m.CreateSnapshot(ctx, v.ID, "s1")
	if err != nil {
		t.Fatal(err)
	}
	s2, _ := m.CreateSnapshot(ctx, v.ID, "s2")
	if err := m.Delete(ctx, v.ID); err != nil { // a tombstone: it has snapshots
		t.Fatal(err)
	}
	got, err := m.GetSnapshot(ctx, s1.ID)
	if err != nil || got.Dataset == s1.Dataset {
		t.Fatalf("snapshot %s after its volume became a tombstone: %+v, %v; want it found on the tombstone", s1.ID, got, err)
	}
	if err := fake.Destroy(ctx, got.Dataset); err != nil {
		t.Fatal(err)
	}
	if _, err := m.GetSnapshot(ctx, s1.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a snapshot destroyed by hand: %v, want NotFound", err)
	}
	if err := m.DeleteSnapshot(ctx, s2.ID); err != nil {
		t.Fatal(err)
	}
	wantOnlyRoot(t, fake, "after the last snapshot went, the tombstone must be collected")
	page, err := m.index.SnapshotPage(ctx, "", 0, "")
	if err != nil || len(page) != 0 {
		t.Errorf("snapshots left: %v, %v", page, err)
	}
}

// TestUnconfirmedCostsTheUnconfirmed: the heartbeat asks for the
// unconfirmed primaries at every beat while one stays so; that reads the
// unconfirmed ones, not every volume on the node.
func TestUnconfirmedCostsTheUnconfirmed(t *testing.T) {
	ctx := context.Background()
	m, fake := newManager(t)
	counting := &zfsfake.Counting{Interface: fake}
	m.zfs = counting
	m.fences.RequireConfirmation()
	costWith := func(n int) int64 {
		for i := range n {
			if _, err := m.Create(ctx, CreateRequest{Name: fmt.Sprintf("v%d-%d", n, i)}); err != nil { // confirmed at create
				t.Fatal(err)
			}
		}
		m.fences.Confirm(contract.VolumeIDForName("stale"), 0) // a stale entry, never matched
		if _, err := m.fences.Unconfirmed(ctx); err != nil {   // fills the index
			t.Fatal(err)
		}
		before := counting.Work()
		pending, err := m.fences.Unconfirmed(ctx)
		if err != nil || len(pending) != 1 {
			t.Fatalf("unconfirmed: %v, %v; want the one made by hand", pending, err)
		}
		return counting.Work() - before
	}
	putCopy(t, fake, "unconfirmed", contract.RolePrimary, 3, nil) // a primary made by hand, never confirmed
	few, many := costWith(5), costWith(100)
	if many > few {
		t.Errorf("Unconfirmed made %d ZFS calls with 6 volumes, %d with 106: it grows with the volumes", few, many)
	}
}

func TestCopyIDOf(t *testing.T) {
	const id = "vol-0123456789abcdef0123"
	tests := []struct{ snapshot, want string }{
		{"tank/nomad/" + id + "@snap-0123456789abcdef0123", id},
		{"tank/nomad/" + id + "-deleted-1795498586594602304@snap-0123456789abcdef0123", id},
		{"tank/nomad/" + id + "-aside-1795498586594602304@snap-0123456789abcdef0123", id},
		{"tank/nomad/other@snap-0123456789abcdef0123", "other"},
	}
	for _, tt := range tests {
		if got := copyIDOf(tt.snapshot); got != tt.want {
			t.Errorf("copyIDOf(%q) = %q, want %q", tt.snapshot, got, tt.want)
		}
	}
}

// TestIndexListingOutlivesItsCaller: on a node whose listing takes longer
// than a caller's deadline (a thousand volumes, a slow pool, the
// controller's GetNode), the listing goes on after the caller gave up, so
// a later call finds the index filled instead of starting (and losing)
// the listing again.
func TestIndexListingOutlivesItsCaller(t *testing.T) {
	var x idIndex
	release := make(chan struct{})
	lists := 0
	slow := func(ctx context.Context) (map[string]string, error) {
		lists++
		select {
		case <-release:
			return map[string]string{"vol-a": "tank/nomad/vol-a"}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := x.read(short, time.Now, slow); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a caller whose deadline passed: %v, want DeadlineExceeded", err)
	}
	close(release)
	got, err := x.read(context.Background(), time.Now, slow)
	if err != nil || len(got) != 1 || lists != 1 {
		t.Errorf("after the listing finished: %v, %v, %d listings; want the one volume from the one listing", got, err, lists)
	}
}

// TestWarmIndexes: the listings a node starts with fill both indexes, so
// the first count and the first page after a start list nothing.
func TestWarmIndexes(t *testing.T) {
	ctx := context.Background()
	m, fake := newManager(t)
	v, _ := m.Create(ctx, CreateRequest{Name: "v"})
	if _, err := m.CreateSnapshot(ctx, v.ID, "s"); err != nil {
		t.Fatal(err)
	}
	m.index.primaryIndex.invalidate() // as a process that just started
	m.index.snapshotIndex.invalidate()
	var mu sync.Mutex
	lists := 0
	fake.Before = func(op, name string) {
		if op == "list" && name == root {
			mu.Lock()
			lists++
			mu.Unlock()
		}
	}
	m.index.WarmIndexes()
	for _, x := range []*idIndex{&m.index.primaryIndex, &m.index.snapshotIndex} {
		if _, err := x.read(ctx, m.now, failingList); err != nil {
			t.Fatal(err)
		}
	}
	c, err := m.Capacity(ctx)
	if err != nil || c.Volumes != 1 {
		t.Fatalf("capacity: %+v, %v; want one volume", c, err)
	}
	if page, err := m.index.SnapshotPage(ctx, "", 0, ""); err != nil || len(page) != 1 {
		t.Fatalf("snapshots: %v, %v; want one", page, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if lists != 2 {
		t.Errorf("%d listings of the node; want the two the start ran", lists)
	}
}

// TestReceivedCSISnapshotsAreIndexed: a CSI snapshot a receive brings to
// a replica, without the labels it was taken with, is found by ID and
// listed as its volume's once the receiver tells the node (Received),
// without a listing of the node; a receive that brings none reads no
// snapshot.
func TestReceivedCSISnapshotsAreIndexed(t *testing.T) {
	ctx := context.Background()
	m, fake := newManager(t)
	counting := &zfsfake.Counting{Interface: fake}
	m.zfs = counting
	id := contract.VolumeIDForName("replicated")
	fs := root + "/" + id
	if err := fake.CreateFilesystem(ctx, fs, map[string]string{copyrecord.PropVolumeID: id, copyrecord.PropRole: contract.RoleReplica, copyrecord.PropGeneration: "1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.index.SnapshotPage(ctx, "", 0, ""); err != nil { // fills the index
		t.Fatal(err)
	}
	snapID := contract.SnapshotIDForName("before-upgrade")
	for _, s := range []string{"zn-1", snapID, "zn-2"} {
		if err := fake.Snapshot(ctx, fs+"@"+s, nil); err != nil {
			t.Fatal(err)
		}
	}
	m.index.Received(id)
	before := counting.Work()
	got, err := m.GetSnapshot(ctx, snapID)
	if err != nil || got.SourceVolumeID != id || got.Dataset != fs+"@"+snapID {
		t.Fatalf("the received snapshot: %+v, %v; want it found on %s, of volume %s", got, err, fs, id)
	}
	if n := counting.Work() - before; n != 2 {
		t.Errorf("finding it cost %d ZFS calls, want 2 (a read of it and of the copy it is on, for its owner; no listing of the node)", n)
	}
	before = counting.Work()
	m.index.Received(id) // nothing new
	if n := counting.Work() - before; n != 4 {
		t.Errorf("a receive that brought no snapshot cost %d, want 4 (the listing of the copy's 3 snapshot names)", n)
	}
}
