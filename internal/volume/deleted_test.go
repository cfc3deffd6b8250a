package volume

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/vocab"
	"github.com/zfs-nomad/zfs-nomad/internal/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/zfs/zfsfake"
)

// TestDeletedSnapshotRecords: a node remembers a deleted snapshot across
// a restart (the record is in the pool, not only in memory), a record
// never deletes a copy taken after it, and forgetting removes it.
func TestDeletedSnapshotRecords(t *testing.T) {
	m, fake := newManager(t)
	ctx := context.Background()
	v := create(t, m, CreateRequest{Name: "v"})
	snap := snapshot(t, m, v.ID, "s")
	created := snap.Created.Unix()

	// An older incarnation's record keeps this copy: it was taken after.
	if err := m.DeleteSnapshotUpTo(ctx, snap.ID, created-1); err != nil {
		t.Fatal(err)
	}
	if _, err := m.GetSnapshot(ctx, snap.ID); err != nil {
		t.Fatalf("a copy newer than the record was deleted: %v", err)
	}

	d := DeletedSnapshot{ID: snap.ID, SourceVolumeID: v.ID, CreatedUnix: created}
	if err := m.RememberDeleted(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := m.RememberDeleted(ctx, DeletedSnapshot{ID: snap.ID, SourceVolumeID: v.ID, CreatedUnix: created - 5}); err != nil {
		t.Fatal(err)
	}
	restarted := NewManager(fake, m.cfg, hclog.NewNullLogger())
	records, err := restarted.DeletedSnapshots(ctx)
	if err != nil || len(records) != 1 || records[0] != d {
		t.Fatalf("records after a restart: %+v, %v; want only %+v (an older record never replaces a newer one)", records, err, d)
	}
	if err := restarted.DeleteSnapshotUpTo(ctx, snap.ID, created); err != nil {
		t.Fatal(err)
	}
	if _, err := restarted.GetSnapshot(ctx, snap.ID); err == nil {
		t.Fatal("the copy the record covers is still there")
	}
	if err := restarted.ForgetDeleted(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	if err := restarted.ForgetDeleted(ctx, snap.ID); err != nil {
		t.Fatalf("forgetting twice: %v", err)
	}
	again := NewManager(fake, m.cfg, hclog.NewNullLogger())
	if records, err := again.DeletedSnapshots(ctx); err != nil || len(records) != 0 {
		t.Fatalf("records after forgetting: %+v, %v; want none", records, err)
	}
	if err := m.RememberDeleted(ctx, DeletedSnapshot{ID: "not-a-snapshot", CreatedUnix: 1}); err == nil {
		t.Error("a record of no snapshot ID was accepted")
	}
}

// TestWaitPast: a snapshot taken again under the name of one a record
// covers waits until the node's clock, which stamps it, is past the
// record's second, so the record never covers it.
func TestWaitPast(t *testing.T) {
	m, _ := newManager(t)
	base := time.Unix(1_800_000_000, 0)
	reads := 0
	m.now = func() time.Time { reads++; return base.Add(time.Duration(reads) * 300 * time.Millisecond) }
	if err := m.waitPast(context.Background(), base.Unix()); err != nil {
		t.Fatal(err)
	}
	if got := m.now(); got.Unix() <= base.Unix() {
		t.Fatalf("waitPast returned at %s, not past %s", got, base)
	}
	if reads < 4 {
		t.Fatalf("waitPast read the clock %d times: it did not wait", reads)
	}
}

// TestAReceiveDropsADeletedSnapshot: a copy of a deleted snapshot that a
// receive brings (a push that started before the delete) is dropped while
// the node's record lives, and a copy taken after the deletion is kept;
// the record is forgotten only once no receive into the volume runs
// (forgetting waits for the copy's lock) and no copy it covers is left.
func TestAReceiveDropsADeletedSnapshot(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	v := create(t, m, CreateRequest{Name: "v"})
	old := snapshot(t, m, v.ID, "old")
	if err := m.RememberDeleted(ctx, DeletedSnapshot{ID: old.ID, SourceVolumeID: v.ID, CreatedUnix: old.Created.Unix()}); err != nil {
		t.Fatal(err)
	}
	later := snapshot(t, m, v.ID, "later")
	if err := m.RememberDeleted(ctx, DeletedSnapshot{ID: later.ID, SourceVolumeID: v.ID, CreatedUnix: later.Created.Unix() - 1}); err != nil {
		t.Fatal(err)
	}

	// The copy is there (as a receive left it) and the record covers it:
	// the record stays.
	if err := m.ForgetDeleted(ctx, old.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("forgetting a record whose covered copy is on the node: %v, want FailedPrecondition", err)
	}

	unlock, err := m.Locks().Lock(ctx, v.ID, "receive from node n1")
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := m.ForgetDeleted(short, later.ID); err == nil { // no copy it covers: only the lock keeps it
		t.Fatal("a record was forgotten while a receive into its volume held the copy's lock")
	}
	m.Received(v.ID) // the receive ends: called under its lock
	unlock()

	if _, err := m.GetSnapshot(ctx, old.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the received copy of the deleted snapshot: %v, want it dropped (NotFound)", err)
	}
	if _, err := m.GetSnapshot(ctx, later.ID); err != nil {
		t.Errorf("a copy taken after its record's second was dropped: %v", err)
	}
	for _, id := range []string{old.ID, later.ID} {
		if err := m.ForgetDeleted(ctx, id); err != nil {
			t.Fatalf("forgetting %s once the receive ended: %v", id, err)
		}
	}
	if records, err := m.DeletedSnapshots(ctx); err != nil || len(records) != 0 {
		t.Fatalf("records left: %+v, %v; want none", records, err)
	}
}

// TestAReceiveDropsAKeptDuplicate: a replica replaced by a full send
// leaves its CSI snapshots on a tombstone; when the new replica receives
// the same snapshot, the tombstone's copy goes, so the node holds one copy
// per snapshot and a DeleteSnapshot leaves none (simulation seed 26863:
// the index knew one copy, the delete destroyed it, and the tombstone's
// was listed again after a restart).
func TestAReceiveDropsAKeptDuplicate(t *testing.T) {
	m, fake, v, s, kept := keptTwice(t)
	ctx := context.Background()
	unlock, err := m.Locks().Lock(ctx, v.ID, "receive from node n2")
	if err != nil {
		t.Fatal(err)
	}
	m.Received(v.ID)
	unlock()

	if _, err := fake.Get(ctx, kept); !errors.Is(err, zfs.ErrNotFound) {
		t.Errorf("the tombstone's copy of a snapshot received again: %v, want it dropped", err)
	}
	if err := m.DeleteSnapshot(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	wantNotListed(t, m, s.ID) // a listing of the pool, as after a restart
}

// TestADeleteTakesADuplicateTheListingFound: the same case as
// TestAReceiveDropsAKeptDuplicate, but the receive's own step never ran
// (the process crashed after the receive, or the receive came before the
// snapshot index was filled): a new process lists both copies. Its
// delete of the snapshot must destroy both, or the next listing finds
// the deleted snapshot again.
func TestADeleteTakesADuplicateTheListingFound(t *testing.T) {
	m, fake, v, s, _ := keptTwice(t)
	ctx := context.Background()
	restarted := NewManager(fake, m.cfg, hclog.NewNullLogger())
	found, err := restarted.findSnapshot(ctx, s.ID)
	if err != nil || found.Dataset != v.Dataset+"@"+s.ID {
		t.Errorf("the restarted node finds the snapshot at %+v, %v; want the live copy's", found, err)
	}
	if err := restarted.DeleteSnapshot(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	wantNotListed(t, NewManager(fake, m.cfg, hclog.NewNullLogger()), s.ID)
}

// keptTwice makes a node hold CSI snapshot s of volume v twice: v is
// deleted, which keeps s on a tombstone (at kept), and the same snapshot
// then arrives again in a copy under v's name, as a new replica's
// receive brings it. Nothing has told m of the receive.
func keptTwice(t *testing.T) (m *Manager, fake *zfsfake.Fake, v Volume, s Snapshot, kept string) {
	t.Helper()
	m, fake = newManager(t)
	ctx := context.Background()
	v = create(t, m, CreateRequest{Name: "v"})
	s = snapshot(t, m, v.ID, "s")
	if err := m.Delete(ctx, v.ID); err != nil { // a copy with a snapshot becomes a tombstone
		t.Fatal(err)
	}
	onTombstone, err := m.findSnapshot(ctx, s.ID)
	if err != nil || zfs.Parent(onTombstone.Dataset) == v.Dataset {
		t.Fatalf("the snapshot after its volume's delete: %+v, %v; want it on a tombstone", onTombstone, err)
	}
	snapProps, err := fake.Get(ctx, onTombstone.Dataset)
	if err != nil {
		t.Fatal(err)
	}
	if err := fake.CreateFilesystem(ctx, v.Dataset, map[string]string{PropRole: vocab.RoleReplica, PropVolumeID: v.ID}); err != nil {
		t.Fatal(err)
	}
	if err := fake.Snapshot(ctx, v.Dataset+"@"+s.ID, snapProps.User); err != nil {
		t.Fatal(err)
	}
	return m, fake, v, s, onTombstone.Dataset
}

// wantNotListed fails the test if m's listing of its pool finds snapshot
// id.
func wantNotListed(t *testing.T, m *Manager, id string) {
	t.Helper()
	listed, err := m.ListSnapshots(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range listed {
		if l.ID == id {
			t.Errorf("deleted snapshot %s still on the node at %s", id, l.Dataset)
		}
	}
}

func TestOneCopyEach(t *testing.T) {
	const (
		id    = "vol-0123456789abcdef0123"
		other = "vol-3210fedcba9876543210"
		snap  = "snap-0123456789abcdef0123"
	)
	live := root + "/" + id + "@" + snap
	tomb := root + "/" + id + "-deleted-1@" + snap
	aside := root + "/" + id + "-aside-2@" + snap
	elsewhere := root + "/" + other + "@" + snap
	tests := []struct {
		name      string
		in        []string
		want      []string
		duplicate []string
	}{
		{"one copy", []string{live}, []string{live}, nil},
		{"live copy listed first", []string{live, tomb}, []string{live}, []string{tomb}},
		{"live copy listed last", []string{tomb, aside, live}, []string{live}, []string{tomb, aside}},
		{"no live copy", []string{tomb, aside}, []string{tomb}, []string{aside}},
		{"another volume's copy is no duplicate", []string{live, elsewhere}, []string{live, elsewhere}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var in []Snapshot
			for _, name := range tt.in {
				in = append(in, Snapshot{ID: snap, Dataset: name})
			}
			kept, duplicates := oneCopyEach(root, in)
			var got []string
			for _, k := range kept {
				got = append(got, k.Dataset)
			}
			dups := slices.Sorted(slices.Values(duplicates[snap]))
			if !slices.Equal(got, tt.want) || !slices.Equal(dups, slices.Sorted(slices.Values(tt.duplicate))) {
				t.Errorf("oneCopyEach(%v) = %v, %v; want %v, %v", tt.in, got, duplicates[snap], tt.want, tt.duplicate)
			}
		})
	}
}
