package volume

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfsfake"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// TestReserve: a node promises a generation of a volume once, to one
// holder: above everything it promised or holds, again to the same holder
// (a retry), never to a second holder; a promise to the volume's deletion
// refuses every other holder until deleting the volume forgets it.
func TestReserve(t *testing.T) {
	ctx := context.Background()
	m, fake := newManager(t)
	id, _ := putCopy(t, fake, "v", contract.RoleReplica, 3, nil)
	steps := []struct {
		name    string
		gen     uint64
		holder  string
		granted bool
		stands  copyrecord.Promise // what a refusal names
	}{
		{"not above the copy held here", 3, "n2", false, copyrecord.Promise{Generation: 3, Holder: "n1"}},
		{"above it", 4, "n2", true, copyrecord.Promise{}},
		{"the same again (a retry)", 4, "n2", true, copyrecord.Promise{}},
		{"the same generation to another holder", 4, "n3", false, copyrecord.Promise{Generation: 4, Holder: "n2"}},
		{"a lower one", 2, "n3", false, copyrecord.Promise{Generation: 4, Holder: "n2"}},
		{"a higher one to another holder", 5, "n3", true, copyrecord.Promise{}},
	}
	for _, s := range steps {
		got, granted, err := m.records.Reserve(ctx, id, s.gen, s.holder)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if granted != s.granted || !granted && got != s.stands {
			t.Errorf("%s: granted %v (%+v), want %v (%+v)", s.name, granted, got, s.granted, s.stands)
		}
	}
	if p, _ := m.records.Promised(ctx, id); p != (copyrecord.Promise{Generation: 5, Holder: "n3"}) {
		t.Errorf("promised %+v, want generation 5 to n3", p)
	}
	deletion := []struct {
		name    string
		gen     uint64
		holder  string
		granted bool
	}{
		{"a deletion not above the promise", 5, contract.DeletionHolder, false},
		{"a deletion above it", 6, contract.DeletionHolder, true},
		{"a retried deletion", 6, contract.DeletionHolder, true},
		{"a concurrent deletion that read less", 5, contract.DeletionHolder, true},
		{"a promotion above the deletion", 7, "n3", false},
		{"a creation's first generation", 1, "n2", false},
	}
	for _, s := range deletion {
		got, granted, err := m.records.Reserve(ctx, id, s.gen, s.holder)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if granted != s.granted {
			t.Errorf("%s: granted %v (%+v), want %v", s.name, granted, got, s.granted)
		}
	}
	if p, _ := m.records.Promised(ctx, id); p != (copyrecord.Promise{Generation: 6, Holder: contract.DeletionHolder}) {
		t.Errorf("promised %+v, want generation 6 to the deletion", p)
	}
	if err := m.Forget(ctx, id); err != nil {
		t.Fatal(err)
	}
	if p, _ := m.records.Promised(ctx, id); p != (copyrecord.Promise{}) {
		t.Errorf("after Forget: %+v, want nothing", p)
	}
}

// TestReserveDoesNotWaitForTheCopy: a move reserves its generation on
// every node while the copy's final snapshot is received (or sent) under
// the copy's lock. The reservation takes only the promise's lock: waiting
// for the copy's put a pool sync on the move's critical path (the move
// benchmark measured it at about 0.45 s of a 2 s move).
func TestReserveDoesNotWaitForTheCopy(t *testing.T) {
	ctx := context.Background()
	m, fake := newManager(t)
	id, _ := putCopy(t, fake, "v", contract.RoleReplica, 1, nil)
	unlock, err := m.Locks().Lock(ctx, id, "receiving the final snapshot")
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, granted, err := m.records.Reserve(rctx, id, 2, "n1"); err != nil || !granted {
		t.Fatalf("Reserve while the copy is locked: granted %v, %v; want granted at once", granted, err)
	}
}

// TestPromiseRecordsStayOffTheRoot: every volume below the root inherits
// the root's user properties, so a record kept there would make every
// open of every volume read all records. Records go to the shards, and a
// deletion removes them rather than leaving a "0" behind.
func TestPromiseRecordsStayOffTheRoot(t *testing.T) {
	ctx := context.Background()
	m, fake := newManager(t)
	if err := m.records.CheckLegacyPromises(ctx); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 200 {
		id := contract.VolumeIDForName(fmt.Sprintf("v%d", i))
		ids = append(ids, id)
		if _, granted, err := m.records.Reserve(ctx, id, 1, "n2"); err != nil || !granted {
			t.Fatalf("Reserve %s: granted %v, %v", id, granted, err)
		}
	}
	if onRoot, _ := fake.OwnUserProperties(ctx, root, copyrecord.PropPromisePrefix); len(onRoot) != 0 {
		t.Errorf("%d promise records on the root dataset, want none", len(onRoot))
	}
	perShard := map[string]int{}
	for _, id := range ids {
		shard := copyrecord.PromiseShard(root, id)
		if !strings.HasPrefix(shard, root+"/"+copyrecord.PromisesDataset+"/") {
			t.Fatalf("shard %s of %s is not under %s/%s", shard, id, root, copyrecord.PromisesDataset)
		}
		perShard[shard]++
	}
	if len(perShard) > copyrecord.PromiseShards || len(perShard) < copyrecord.PromiseShards/2 {
		t.Errorf("200 records in %d shards, want them spread over about %d", len(perShard), copyrecord.PromiseShards)
	}
	for _, id := range ids[:100] {
		if err := m.Forget(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	left := 0
	for shard := range perShard {
		records, err := fake.OwnUserProperties(ctx, shard, copyrecord.PropPromisePrefix)
		if err != nil {
			t.Fatal(err)
		}
		left += len(records)
	}
	if left != 100 {
		t.Errorf("%d records left after forgetting 100 of 200, want 100", left)
	}
	if p, _ := m.records.Promised(ctx, ids[150]); p != (copyrecord.Promise{Generation: 1, Holder: "n2"}) {
		t.Errorf("promised %+v, want generation 1 to n2", p)
	}
}

// TestLegacyPromiseRecords: records an earlier build kept on the root
// still count (they guard I3), move to their shard at the volume's next
// reservation and go with its deletion; a node that found none at its
// start never reads the root for them.
func TestLegacyPromiseRecords(t *testing.T) {
	ctx := context.Background()
	m, fake := newManager(t)
	a, b := contract.VolumeIDForName("a"), contract.VolumeIDForName("b")
	if err := fake.SetProperties(ctx, root, map[string]string{copyrecord.PromiseProperty(a): "3 n2", copyrecord.PromiseProperty(b): "1 n1"}); err != nil {
		t.Fatal(err)
	}
	if err := m.records.CheckLegacyPromises(ctx); err != nil {
		t.Fatal(err)
	}
	if p, _ := m.records.Promised(ctx, a); p != (copyrecord.Promise{Generation: 3, Holder: "n2"}) {
		t.Errorf("a: promised %+v, want the root's generation 3 to n2", p)
	}
	if got, granted, err := m.records.Reserve(ctx, a, 3, "n3"); err != nil || granted || got != (copyrecord.Promise{Generation: 3, Holder: "n2"}) {
		t.Errorf("Reserve a 3 to n3: granted %v (%+v), %v; want refused by the root's record", granted, got, err)
	}
	if _, granted, err := m.records.Reserve(ctx, a, 4, "n3"); err != nil || !granted {
		t.Fatalf("Reserve a 4 to n3: granted %v, %v", granted, err)
	}
	if err := m.Forget(ctx, b); err != nil {
		t.Fatal(err)
	}
	if onRoot, _ := fake.OwnUserProperties(ctx, root, copyrecord.PropPromisePrefix); len(onRoot) != 0 {
		t.Errorf("records left on the root: %v, want none (a moved to its shard, b forgotten)", onRoot)
	}
	if p, _ := m.records.Promised(ctx, a); p != (copyrecord.Promise{Generation: 4, Holder: "n3"}) {
		t.Errorf("a: promised %+v, want generation 4 to n3 from its shard", p)
	}

	// A restarted node finds none left, and stops reading the root.
	if err := m.records.CheckLegacyPromises(ctx); err != nil {
		t.Fatal(err)
	}
	if err := fake.SetProperties(ctx, root, map[string]string{copyrecord.PromiseProperty(b): "9 n9"}); err != nil {
		t.Fatal(err)
	}
	if p, _ := m.records.Promised(ctx, b); p != (copyrecord.Promise{}) {
		t.Errorf("b: promised %+v after a start that found no record on the root; want the root left unread", p)
	}
}

// TestForgottenLegacyRecordsGo: the "0" an earlier build left on the
// root for each deleted volume promises nothing; the node removes them
// after its start, and with no other record kept there stops reading the
// root. A deletion of a volume with no record writes nothing (a removal
// costs a pool sync).
func TestForgottenLegacyRecordsGo(t *testing.T) {
	ctx := context.Background()
	m, fake := newManager(t)
	old := contract.VolumeIDForName("deleted long ago")
	if err := fake.SetProperties(ctx, root, map[string]string{copyrecord.PromiseProperty(old): "0"}); err != nil {
		t.Fatal(err)
	}
	if err := m.records.CheckLegacyPromises(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); m.records.legacyPromises.Load() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if onRoot, _ := fake.OwnUserProperties(ctx, root, copyrecord.PropPromisePrefix); len(onRoot) != 0 || m.records.legacyPromises.Load() {
		t.Fatalf("after the start: %v on the root, still read: %v; want none, not read", onRoot, m.records.legacyPromises.Load())
	}

	counting := &zfsfake.Counting{Interface: fake}
	m.zfs = counting
	if err := m.Forget(ctx, contract.VolumeIDForName("never promised here")); err != nil {
		t.Fatal(err)
	}
	if err := m.Forget(ctx, contract.VolumeIDForName("never promised here")); err != nil {
		t.Fatal(err)
	}
	if w := counting.Work(); w > 2 {
		t.Errorf("two deletions of a volume with no record asked ZFS for %d calls, want reads only (a removal costs a pool sync)", w)
	}
}
