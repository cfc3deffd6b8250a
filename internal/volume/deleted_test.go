package volume

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// TestDeletedSnapshotRecords: a node remembers a deleted snapshot across
// a restart (the record is in the pool, not only in memory), a record
// never deletes a copy taken after it, and forgetting removes it.
func TestDeletedSnapshotRecords(t *testing.T) {
	m, fake := newManager(t)
	ctx := context.Background()
	v := create(t, m, CreateRequest{Name: "v"})
	snap, err := m.CreateSnapshot(ctx, v.ID, "s")
	if err != nil {
		t.Fatal(err)
	}
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
