package volume

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfsfake"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
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

	d := copyrecord.DeletedSnapshot{ID: snap.ID, SourceVolumeID: v.ID, CreatedUnix: created}
	if err := m.records.RememberDeleted(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := m.records.RememberDeleted(ctx, copyrecord.DeletedSnapshot{ID: snap.ID, SourceVolumeID: v.ID, CreatedUnix: created - 5}); err != nil {
		t.Fatal(err)
	}
	restarted := NewManager(Deps{ZFS: fake, Config: m.cfg, Log: hclog.NewNullLogger()})
	records, err := restarted.records.DeletedSnapshots(ctx)
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
	again := NewManager(Deps{ZFS: fake, Config: m.cfg, Log: hclog.NewNullLogger()})
	if records, err := again.records.DeletedSnapshots(ctx); err != nil || len(records) != 0 {
		t.Fatalf("records after forgetting: %+v, %v; want none", records, err)
	}
	if err := m.records.RememberDeleted(ctx, copyrecord.DeletedSnapshot{ID: "not-a-snapshot", CreatedUnix: 1}); err == nil {
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
	m.UseClock(func() time.Time { reads++; return base.Add(time.Duration(reads) * 300 * time.Millisecond) })
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
	if err := m.records.RememberDeleted(ctx, copyrecord.DeletedSnapshot{ID: old.ID, SourceVolumeID: v.ID, CreatedUnix: old.Created.Unix()}); err != nil {
		t.Fatal(err)
	}
	later := snapshot(t, m, v.ID, "later")
	if err := m.records.RememberDeleted(ctx, copyrecord.DeletedSnapshot{ID: later.ID, SourceVolumeID: v.ID, CreatedUnix: later.Created.Unix() - 1}); err != nil {
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
	m.index.Received(v.ID) // the receive ends: called under its lock
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
	if records, err := m.records.DeletedSnapshots(ctx); err != nil || len(records) != 0 {
		t.Fatalf("records left: %+v, %v; want none", records, err)
	}
}

// TestAReceiveDropsAKeptDuplicate: a replica replaced by a full send
// leaves its CSI snapshots on a tombstone; when the new replica receives
// the same snapshot (its GUID), the tombstone's copy goes, so the node
// holds one copy per snapshot and a DeleteSnapshot leaves none
// (simulation seed 26863: the index knew one copy, the delete destroyed
// it, and the tombstone's was listed again after a restart).
func TestAReceiveDropsAKeptDuplicate(t *testing.T) {
	m, fake, v, s, kept := keptTwice(t, true)
	ctx := context.Background()
	unlock, err := m.Locks().Lock(ctx, v.ID, "receive from node n2")
	if err != nil {
		t.Fatal(err)
	}
	m.index.Received(v.ID)
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
	m, fake, v, s, _ := keptTwice(t, true)
	ctx := context.Background()
	restarted := NewManager(Deps{ZFS: fake, Config: m.cfg, Log: hclog.NewNullLogger()})
	found, err := restarted.findSnapshot(ctx, s.ID)
	if err != nil || found.Dataset != v.Dataset+"@"+s.ID {
		t.Errorf("the restarted node finds the snapshot at %+v, %v; want the live copy's", found, err)
	}
	if err := restarted.DeleteSnapshot(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	wantNotListed(t, NewManager(Deps{ZFS: fake, Config: m.cfg, Log: hclog.NewNullLogger()}), s.ID)
}

// TestAPlantedSnapshotNeverReplacesTheKeptOne: a stream brings a
// snapshot named like a CSI snapshot that a tombstone of the volume keeps,
// but it is another snapshot (another GUID, other data: a peer planted
// it). The name decides nothing: the tombstone's copy is neither
// destroyed nor displaced, so it is the one found, listed and restored,
// whether the receive's own step ran or a restarted node lists the pool;
// and a delete of the snapshot takes both copies.
func TestAPlantedSnapshotNeverReplacesTheKeptOne(t *testing.T) {
	tests := []struct {
		name string
		node func(t *testing.T, m *Manager, fake *zfsfake.Fake, v Volume) *Manager
	}{
		{"the receive's step ran", func(t *testing.T, m *Manager, _ *zfsfake.Fake, v Volume) *Manager {
			m.index.snapshots(context.Background()) // the index is filled before the receive
			unlock, err := m.Locks().Lock(context.Background(), v.ID, "receive from node n2")
			if err != nil {
				t.Fatal(err)
			}
			defer unlock()
			m.index.Received(v.ID)
			return m
		}},
		{"a restarted node lists the pool", func(_ *testing.T, m *Manager, fake *zfsfake.Fake, _ Volume) *Manager {
			return NewManager(Deps{ZFS: fake, Config: m.cfg, Log: hclog.NewNullLogger()})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, fake, v, s, kept := keptTwice(t, false)
			ctx := context.Background()
			node := tt.node(t, m, fake, v)

			if _, err := fake.Get(ctx, kept); err != nil {
				t.Fatalf("the genuine copy on the tombstone: %v, want it kept", err)
			}
			found, err := node.GetSnapshot(ctx, s.ID)
			if err != nil || found.Dataset != kept {
				t.Fatalf("the node finds the snapshot at %q (%v); want the genuine copy %q", found.Dataset, err, kept)
			}
			page, err := node.index.SnapshotPage(ctx, "", 0, "")
			if err != nil || len(page) != 1 || page[0].Dataset != kept {
				t.Fatalf("the node lists %+v (%v); want only the genuine copy %q", page, err, kept)
			}
			restored, err := node.Create(ctx, CreateRequest{Name: "restored", SourceSnapshotID: s.ID})
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := fake.Content(restored.Dataset); !slices.Equal(got, []string{"genuine"}) {
				t.Errorf("a restore of the snapshot holds %v, want the genuine data", got)
			}
			if err := node.Delete(ctx, restored.ID); err != nil {
				t.Fatal(err)
			}
			if err := node.DeleteSnapshot(ctx, s.ID); err != nil {
				t.Fatal(err)
			}
			wantNotListed(t, NewManager(Deps{ZFS: fake, Config: m.cfg, Log: hclog.NewNullLogger()}), s.ID)
		})
	}
}

// keptTwice makes a node hold CSI snapshot s of volume v twice: v, with
// the data "genuine", is deleted, which keeps s on a tombstone (at kept),
// and a snapshot named s then arrives again in a copy under v's name, as
// a new replica's receive brings it: the same snapshot (a stream of it,
// same GUID) when genuine, or else another one with the data "planted".
// Nothing has told m of the receive.
func keptTwice(t *testing.T, genuine bool) (m *Manager, fake *zfsfake.Fake, v Volume, s Snapshot, kept string) {
	t.Helper()
	m, fake = newManager(t)
	ctx := context.Background()
	v = create(t, m, CreateRequest{Name: "v"})
	if err := fake.Write(v.Dataset, "genuine"); err != nil {
		t.Fatal(err)
	}
	s = snapshot(t, m, v.ID, "s")
	if err := m.Delete(ctx, v.ID); err != nil { // a copy with a snapshot becomes a tombstone
		t.Fatal(err)
	}
	onTombstone, err := m.findSnapshot(ctx, s.ID)
	if err != nil || zfs.Parent(onTombstone.Dataset) == v.Dataset {
		t.Fatalf("the snapshot after its volume's delete: %+v, %v; want it on a tombstone", onTombstone, err)
	}
	replica := map[string]string{copyrecord.PropRole: contract.RoleReplica, copyrecord.PropVolumeID: v.ID}
	if genuine {
		var stream bytes.Buffer
		streams := fake
		if _, err := streams.Send(ctx, zfs.SendSpec{Snapshot: onTombstone.Dataset}, &stream); err != nil {
			t.Fatal(err)
		}
		if err := streams.Receive(ctx, v.Dataset, replica, &stream); err != nil {
			t.Fatal(err)
		}
		return m, fake, v, s, onTombstone.Dataset
	}
	snapProps, err := fake.Get(ctx, onTombstone.Dataset)
	if err != nil {
		t.Fatal(err)
	}
	if err := fake.CreateFilesystem(ctx, v.Dataset, replica); err != nil {
		t.Fatal(err)
	}
	if err := fake.Write(v.Dataset, "planted"); err != nil {
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

// TestOneCopyEach: the listing indexes, of the copies of one snapshot
// ID, the one that was on the node first (lowest createtxg) or a copy of
// the same snapshot (same GUID) on its volume's live copy; never a copy
// of another GUID that only carries the name.
func TestOneCopyEach(t *testing.T) {
	const (
		id    = "vol-0123456789abcdef0123"
		other = "vol-3210fedcba9876543210"
		snap  = "snap-0123456789abcdef0123"
	)
	type c struct {
		name      string
		guid, txg uint64
	}
	live := root + "/" + id + "@" + snap
	tomb := root + "/" + id + "-deleted-1@" + snap
	aside := root + "/" + id + "-aside-2@" + snap
	elsewhere := root + "/" + other + "@" + snap
	tests := []struct {
		name      string
		in        []c
		want      string
		duplicate []string
	}{
		{"one copy", []c{{live, 7, 1}}, live, nil},
		{"live copy listed first", []c{{live, 7, 2}, {tomb, 7, 1}}, live, []string{tomb}},
		{"live copy listed last", []c{{tomb, 7, 1}, {aside, 7, 2}, {live, 7, 3}}, live, []string{tomb, aside}},
		{"no live copy", []c{{aside, 7, 2}, {tomb, 7, 1}}, tomb, []string{aside}},
		{"a later live copy of another GUID", []c{{live, 9, 5}, {tomb, 7, 1}}, tomb, []string{live}},
		{"a later set-aside copy of another GUID", []c{{aside, 9, 5}, {live, 7, 1}}, live, []string{aside}},
		{"another volume's later copy", []c{{elsewhere, 9, 5}, {live, 7, 1}}, live, []string{elsewhere}},
		{"another volume's earlier copy", []c{{live, 9, 5}, {elsewhere, 7, 1}}, elsewhere, []string{live}},
		{"GUIDs not read: the live copy", []c{{tomb, 0, 0}, {live, 0, 0}}, live, []string{tomb}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var in []Snapshot
			for _, x := range tt.in {
				in = append(in, Snapshot{ID: snap, Dataset: x.name, GUID: x.guid, CreateTXG: x.txg})
			}
			kept, duplicates := oneCopyEach(root, in)
			dups := slices.Sorted(slices.Values(duplicates[snap]))
			if len(kept) != 1 || kept[0].Dataset != tt.want || !slices.Equal(dups, slices.Sorted(slices.Values(tt.duplicate))) {
				t.Errorf("oneCopyEach(%v) = %v, %v; want %v, %v", tt.in, kept, duplicates[snap], tt.want, tt.duplicate)
			}
		})
	}
}
