package volume

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfsfake"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// The node's migration steps refuse what would give two writers or lose
// data, and repeat harmlessly.
func TestHandoffSteps(t *testing.T) {
	ctx := context.Background()
	m, fake := newManager(t)
	v := create(t, m, CreateRequest{Name: "data", RequiredBytes: 1 << 30})
	mounted := true
	m.host.Mounted = func(string) (bool, error) { return mounted, nil }

	if _, err := m.Fence(ctx, v.ID, "n2"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("fencing a mounted volume: %v, want FailedPrecondition", err)
	}
	mounted = false
	// A fence for a promotion this node did not promise is refused: the
	// move reserves first, so that no instance can lift the fence
	// without superseding the move's promise.
	if _, err := m.Fence(ctx, v.ID, "n2"); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "has not promised node n2") {
		t.Fatalf("fencing for n2 with no promise to n2: %v, want FailedPrecondition saying the node did not promise it", err)
	}
	reserve(t, m, v.ID, 2, "n3")
	if _, err := m.Fence(ctx, v.ID, "n2"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("fencing for n2 with generation 2 promised to n3: %v, want FailedPrecondition", err)
	}
	reserve(t, m, v.ID, 3, "n2")
	at, err := m.Fence(ctx, v.ID, "n2")
	if err != nil {
		t.Fatal(err)
	}
	if again, err := m.Fence(ctx, v.ID, "n2"); err != nil || again != at {
		t.Fatalf("repeated fence: %d, %v; want the first fence time %d", again, err, at)
	}
	if ds, _ := fake.Get(ctx, v.Dataset); !ds.ReadOnly {
		t.Error("a fenced volume is writable")
	}
	if _, _, err := m.Stageable(ctx, v.ID, 1); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("staging a fenced volume: %v", err)
	}
	if _, err := m.CreateSnapshot(ctx, v.ID, "during-move"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("snapshot of a fenced volume: %v, want Unavailable", err)
	}
	reserve(t, m, v.ID, 4, "n1") // a publish here supersedes the move's promise
	if err := m.Unfence(ctx, v.ID, v.Generation); err != nil {
		t.Fatal(err)
	}
	_, unlock, err := m.Stageable(ctx, v.ID, 1)
	if err != nil {
		t.Fatalf("staging after the fence was lifted: %v", err)
	}
	unlock()
	if _, _, err := m.Stageable(ctx, v.ID, 2); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("staging with another generation: %v", err)
	}

	// Demotion: never of the newest generation; a fenced copy becomes a
	// replica, an unfenced one is set aside, renamed and kept.
	if err := m.Demote(ctx, v.ID, 1, false); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("demoting to its own generation: %v", err)
	}
	if err := m.Demote(ctx, v.ID, 5, false); err != nil {
		t.Fatal(err)
	}
	c, err := m.Copy(ctx, v.ID)
	if err != nil || c.Exists {
		t.Fatalf("after setting aside, the volume's name holds %+v (%v)", c, err)
	}
	all, _ := fake.List(ctx, "tank/nomad")
	aside := false
	for _, ds := range all {
		aside = aside || strings.HasPrefix(ds.Name, v.Dataset+"-aside-") && ds.User[copyrecord.PropRole] == contract.RoleSetAside && ds.ReadOnly
	}
	if !aside {
		t.Errorf("no read-only set-aside copy among %v", all)
	}
	if err := m.Demote(ctx, v.ID, 2, false); err != nil {
		t.Errorf("repeated demotion: %v", err)
	}
}

// TestUnfenceRefusesACopyPromisedAway: a copy fenced for a move stays
// fenced while this node's own record promises a newer generation to the
// move's target: the target may be promoted with it at any moment, and
// the copy would be a second primary. Once a newer generation is reserved
// for this node's copy (the publish here superseding the move's promise),
// the fence is lifted.
func TestUnfenceRefusesACopyPromisedAway(t *testing.T) {
	ctx := context.Background()
	m, fake := newManager(t)
	v := create(t, m, CreateRequest{Name: "moving"})
	reserve(t, m, v.ID, 2, "n2")
	if _, err := m.Fence(ctx, v.ID, "n2"); err != nil {
		t.Fatal(err)
	}
	err := m.Unfence(ctx, v.ID, v.Generation)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "promised generation 2 of volume "+v.ID+" to node n2") {
		t.Fatalf("unfencing a copy whose node promised generation 2 to n2: %v, want FailedPrecondition naming the promise", err)
	}
	if ds, _ := fake.Get(ctx, v.Dataset); !ds.ReadOnly || movingTo(ds) != "n2" {
		t.Fatalf("after the refused unfence: read-only %v, moving to %q; want still fenced for n2", ds.ReadOnly, movingTo(ds))
	}
	// The publish here supersedes the move's promise, then unfences.
	if _, granted, err := m.records.Reserve(ctx, v.ID, 3, "n1"); err != nil || !granted {
		t.Fatalf("reserving generation 3 for this node: granted %v, %v", granted, err)
	}
	if err := m.Unfence(ctx, v.ID, v.Generation); err != nil {
		t.Fatalf("unfencing once the promise is superseded: %v", err)
	}
	if ds, _ := fake.Get(ctx, v.Dataset); ds.ReadOnly || movingTo(ds) != "" {
		t.Errorf("after the unfence: read-only %v, moving to %q; want writable and not moving", ds.ReadOnly, movingTo(ds))
	}
}

// TestADemotedPrimaryIsMarked: a primary demoted after its move carries
// the time of its demotion (the schedule removes it once the volume's
// other replicas are as fresh: docs/replication.md, "Surplus copies"); a
// promotion of it clears the mark, so a primary never carries one.
func TestADemotedPrimaryIsMarked(t *testing.T) {
	ctx := context.Background()
	m, fake := newManager(t)
	demotedAt := time.Unix(1_800_000_000, 0)
	m.UseClock(func() time.Time { return demotedAt })
	v := create(t, m, CreateRequest{Name: "moved"})
	mark := func() string {
		t.Helper()
		ds, err := fake.Get(ctx, v.Dataset)
		if err != nil {
			t.Fatal(err)
		}
		return ds.User[copyrecord.PropDemotedAt]
	}
	if got := copyrecord.DemotedAt(mark()); !got.IsZero() {
		t.Fatalf("a new primary is marked demoted at %v", got)
	}
	reserve(t, m, v.ID, 2, "n2")
	if _, err := m.Fence(ctx, v.ID, "n2"); err != nil {
		t.Fatal(err)
	}
	if err := fake.Snapshot(ctx, v.Dataset+"@zn-final", nil); err != nil {
		t.Fatal(err)
	}
	if err := m.Demote(ctx, v.ID, 2, false); err != nil {
		t.Fatal(err)
	}
	if got := copyrecord.DemotedAt(mark()); !got.Equal(demotedAt) {
		t.Fatalf("demoted after its move: marked %v (%q), want %v", got, mark(), demotedAt)
	}
	if _, granted, err := m.records.Reserve(ctx, v.ID, 3, "n1"); err != nil || !granted {
		t.Fatalf("reserving generation 3: granted %v, %v", granted, err)
	}
	if _, err := m.Promote(ctx, v.ID, 3, 0, "", false); err != nil {
		t.Fatal(err)
	}
	if got := copyrecord.DemotedAt(mark()); !got.IsZero() {
		t.Errorf("promoted again: still marked demoted at %v (%q)", got, mark())
	}
}

// receivedReplica puts a replica of volume "r" in the fake as a receive
// leaves it: read-only at generation gen, with props on top, and its
// snapshot zn-100.
func receivedReplica(t *testing.T, fake *zfsfake.Fake, gen uint64, props map[string]string) (id, ds string) {
	t.Helper()
	all := map[string]string{"readonly": "on"}
	maps.Copy(all, props)
	id, ds = putCopy(t, fake, "r", contract.RoleReplica, gen, all)
	if err := fake.Snapshot(context.Background(), ds+"@zn-100", nil); err != nil {
		t.Fatal(err)
	}
	return id, ds
}

func TestPromoteChecksTheReplica(t *testing.T) {
	ctx := context.Background()
	m, fake := newManager(t)
	id, ds := receivedReplica(t, fake, 1, map[string]string{copyrecord.PropParameters: `{"compression":"lz4"}`, copyrecord.PropCapacity: "1073741824"})
	tests := []struct {
		name       string
		generation uint64
		notBefore  int64
		used       uint64
		want       error
	}{
		{"not newer than the replica", 1, 0, 0, errdefs.ErrFailedPrecondition},
		// The controller reserves a generation on a majority first.
		{"generation not reserved", 2, 100, 0, errdefs.ErrFailedPrecondition},
		{"final snapshot missing", 2, 200, 0, errdefs.ErrFailedPrecondition},
		// The replica's zn-100 is named after the fence but is not the
		// fence's snapshot: taken before it, by a clock that stepped
		// back since.
		{"final snapshot missing, a later-named one held", 2, 50, 0, errdefs.ErrFailedPrecondition},
		// ZFS refuses a quota below the space used but sets the other
		// properties of the same call: the quota goes first, alone, so
		// the copy stays a replica, and a retry finishes the promotion.
		{"quota cannot be set", 2, 100, 2 << 30, nil},
		{"planned move", 2, 100, 0, nil},
		{"repeated", 2, 100, 0, nil},
	}
	for _, tt := range tests {
		if tt.name == "final snapshot missing" {
			if _, granted, err := m.records.Reserve(ctx, id, 2, "n1"); err != nil || !granted {
				t.Fatalf("reserving generation 2: granted %v, %v", granted, err)
			}
		}
		fake.SetUsed(ds, tt.used)
		_, err := m.Promote(ctx, id, tt.generation, tt.notBefore, "", false)
		if tt.used > 0 {
			if c, _ := m.Copy(ctx, id); err == nil || c.Role != contract.RoleReplica {
				t.Errorf("%s: %v, and the copy is a %s; want an error and still a replica", tt.name, err, c.Role)
			}
			continue
		}
		if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
	v, err := m.Get(ctx, id)
	if err != nil || v.Generation != 2 || v.Capacity != 1<<30 {
		t.Fatalf("promoted volume: %+v, %v", v, err)
	}
}

// TestDeleteAndDemoteStopTheTransfer: a delete or demotion stops the
// volume's running transfer (a push) and waits for it, holding the copy's
// one lock, so no push can snapshot or send the copy meanwhile and no
// second lock is taken in another order.
func TestDeleteAndDemoteStopTheTransfer(t *testing.T) {
	ctx := context.Background()
	ops := []struct {
		name string
		run  func(m *Manager, id string) error
	}{
		{"delete", func(m *Manager, id string) error { return m.Delete(ctx, id) }},
		{"demote", func(m *Manager, id string) error { return m.Demote(ctx, id, 2, true) }},
	}
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			m, _ := newManager(t)
			v := create(t, m, CreateRequest{Name: "v"})
			tctx, end, err := m.Locks().StartTransfer(ctx, v.ID, "a push to n2")
			if err != nil {
				t.Fatal(err)
			}
			stopped := make(chan string, 1)
			go func() {
				<-tctx.Done()
				what, held := m.Locks().Held(v.ID)
				if !held {
					what = "nothing"
				}
				stopped <- what
				end()
			}()
			if err := op.run(m, v.ID); err != nil {
				t.Fatal(err)
			}
			select {
			case what := <-stopped:
				if what != op.name {
					t.Errorf("the transfer was stopped while %s held the copy's lock, want %s", what, op.name)
				}
			default:
				t.Errorf("%s returned without stopping the transfer", op.name)
			}
		})
	}
}

// TestPromotionCarriesTheHistory: a planned move keeps what the replica's
// history holds (its sender's, fenced with a final snapshot the replica
// has); a failover starts the history at the new generation, and a copy
// that never recorded one vouches for its own generation alone.
func TestPromotionCarriesTheHistory(t *testing.T) {
	tests := []struct {
		name        string
		historyFrom string // the replica's label; "" for none
		failover    bool
		want        uint64
	}{
		{"a planned move", "1", false, 1},
		{"a planned move from a copy without a history", "", false, 2},
		{"a failover", "1", true, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			m, fake := newManager(t)
			props := map[string]string{}
			if tt.historyFrom != "" {
				props[copyrecord.PropHistoryFrom] = tt.historyFrom
			}
			id, _ := receivedReplica(t, fake, 2, props)
			if _, granted, err := m.records.Reserve(ctx, id, 3, "n1"); err != nil || !granted {
				t.Fatalf("reserving generation 3: granted %v, %v", granted, err)
			}
			notBefore := int64(100)
			if tt.failover {
				notBefore = 0
			}
			if _, err := m.Promote(ctx, id, 3, notBefore, "", tt.failover); err != nil {
				t.Fatal(err)
			}
			c, err := m.Copy(ctx, id)
			if err != nil || c.Generation != 3 || c.HistoryFrom != tt.want {
				t.Errorf("promoted copy: generation %d, history from %d (%v); want 3, %d", c.Generation, c.HistoryFrom, err, tt.want)
			}
		})
	}
}

// TestAPlannedPromotionHoldsTheSourcesBase: the move's source becomes a
// replica holding the final snapshot, so the promoted copy holds it as
// the source's base, as a push to the source would: pruned, the source's
// replica would be ahead of its primary at the primary's own generation,
// and every push to it refused. A failover (the source is lost, its copy
// set aside) and a promotion from an older controller (no source) hold
// nothing.
func TestAPlannedPromotionHoldsTheSourcesBase(t *testing.T) {
	tests := []struct {
		name     string
		source   string
		failover bool
		// skewed: the final snapshot's name is older than an earlier
		// one's (the source's clock stepped back): the newest by creation
		// is held, not by the time in its name.
		skewed bool
		want   []string
	}{
		{"a planned move", "n2", false, false, []string{copyrecord.PeerBaseTag("n2")}},
		{"a planned move, the source's clock stepped back", "n2", false, true, []string{copyrecord.PeerBaseTag("n2")}},
		{"a failover", "n2", true, false, nil},
		{"an older controller", "", false, false, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			m, fake := newManager(t)
			id, ds := receivedReplica(t, fake, 2, nil)
			final := ds + "@zn-100"
			if tt.skewed {
				final = ds + "@zn-99"
				if err := fake.Snapshot(ctx, final, nil); err != nil {
					t.Fatal(err)
				}
			}
			if _, granted, err := m.records.Reserve(ctx, id, 3, "n1"); err != nil || !granted {
				t.Fatalf("reserving generation 3: granted %v, %v", granted, err)
			}
			notBefore, _ := contract.ReplicationSnapshotTime(final) // the fence's time names its snapshot
			if tt.failover {
				notBefore = 0
			}
			if _, err := m.Promote(ctx, id, 3, notBefore, tt.source, tt.failover); err != nil {
				t.Fatal(err)
			}
			holds, err := fake.Holds(ctx, ds)
			if err != nil {
				t.Fatal(err)
			}
			if got := holds[final]; !slices.Equal(got, tt.want) {
				t.Errorf("the final snapshot's holds are %v, want %v (all holds: %v)", got, tt.want, holds)
			}
		})
	}
}

// TestPromotionSetsTheQuotaOnlyWhenMissing: each property change waits for
// a pool sync, which a move waits for. A replica received with its
// primary's quota is promoted in one change; one without gets the quota
// in a step of its own first.
func TestPromotionSetsTheQuotaOnlyWhenMissing(t *testing.T) {
	for _, tt := range []struct {
		name     string
		quota    string // the replica's refquota; "" for none
		wantSets int
	}{
		{"the replica carries its quota", "1073741824", 1},
		{"the replica lacks its quota", "", 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			m, fake := newManager(t)
			props := map[string]string{copyrecord.PropCapacity: "1073741824"}
			if tt.quota != "" {
				props["refquota"] = tt.quota
			}
			id, ds := receivedReplica(t, fake, 1, props)
			if _, granted, err := m.records.Reserve(ctx, id, 2, "n1"); err != nil || !granted {
				t.Fatalf("reserving generation 2: granted %v, %v", granted, err)
			}
			sets := 0
			fake.Before = func(op, name string) {
				if op == "set" && name == ds {
					sets++
				}
			}
			if _, err := m.Promote(ctx, id, 2, 100, "", false); err != nil {
				t.Fatal(err)
			}
			fake.Before = nil
			if sets != tt.wantSets {
				t.Errorf("the promotion changed properties %d times, want %d", sets, tt.wantSets)
			}
			if v, err := m.Get(ctx, id); err != nil || v.Capacity != 1<<30 {
				t.Errorf("promoted volume: %+v, %v; want 1 GiB", v, err)
			}
		})
	}
}

// reserve has m promise generation gen of volume id to holder, as a
// controller's reservation does.
func reserve(t *testing.T, m *Manager, id string, gen uint64, holder string) {
	t.Helper()
	if _, granted, err := m.records.Reserve(context.Background(), id, gen, holder); err != nil || !granted {
		t.Fatalf("reserving generation %d of %s for %s: granted %v, %v", gen, id, holder, granted, err)
	}
}

// TestOwnersAreRequiredOfCreatesOnly: a node that requires owner secrets
// still promotes a replica of a volume made without one (before the
// operator required them, or on a node that did not), and keeps the
// owner of one made with one.
func TestOwnersAreRequiredOfCreatesOnly(t *testing.T) {
	owned := map[string]string{contract.ParamOwnerDigest: contract.OwnerDigest("0123456789abcdef")}
	for _, params := range []map[string]string{nil, owned} {
		ctx := context.Background()
		m, fake := newManager(t)
		m.cfg.RequireOwnerSecret = true
		id, _ := receivedReplica(t, fake, 1, map[string]string{copyrecord.PropParameters: copyrecord.EncodeParameters(params)})
		if _, granted, err := m.records.Reserve(ctx, id, 2, "n1"); err != nil || !granted {
			t.Fatalf("reserving generation 2: granted %v, %v", granted, err)
		}
		if _, err := m.Promote(ctx, id, 2, 0, "", true); err != nil {
			t.Fatalf("promoting a replica with parameters %v: %v", params, err)
		}
		if v, err := m.Get(ctx, id); err != nil || !contract.SameOwner(v.Parameters, params) {
			t.Errorf("promoted volume's parameters %v (%v), want the owner of %v", v.Parameters, err, params)
		}
	}
}

// TestCopyTellsWhatWasWrittenSinceItsReplicationSnapshots: an unmounted
// primary's copy reports the bytes written since each of its
// replication snapshots, whatever snapshots came after them; a mounted
// primary's and a replica's, nothing.
func TestCopyTellsWhatWasWrittenSinceItsReplicationSnapshots(t *testing.T) {
	ctx := context.Background()
	m, fake := newManager(t)
	v := create(t, m, CreateRequest{Name: "data", RequiredBytes: 1 << 30})
	if c, err := m.Copy(ctx, v.ID); err != nil || len(c.WrittenSince) != 0 {
		t.Fatalf("copy without a replication snapshot: %+v, %v; want nothing written reported", c, err)
	}
	steps := []struct{ snapshot, write string }{{"zn-100", "0123456789"}, {"zn-200", "abcde"}, {"user-snapshot", "xy"}}
	for _, s := range steps {
		if err := fake.Snapshot(ctx, v.Dataset+"@"+s.snapshot, nil); err != nil {
			t.Fatal(err)
		}
		if err := fake.Write(v.Dataset, s.write); err != nil {
			t.Fatal(err)
		}
	}
	c, err := m.Copy(ctx, v.ID)
	want := map[string]uint64{"zn-100": 17, "zn-200": 7}
	if err != nil || c.LastSnapshot != "zn-200" || !maps.Equal(c.WrittenSince, want) {
		t.Errorf("copy: last snapshot %q, written since %v, %v; want zn-200 and %v", c.LastSnapshot, c.WrittenSince, err, want)
	}
	m.host.Mounted = func(ds string) (bool, error) { return ds == v.Dataset, nil }
	if c, err := m.Copy(ctx, v.ID); err != nil || !c.Mounted || c.WrittenSince != nil {
		t.Errorf("a mounted primary's copy: mounted %v, written since %v, %v; want mounted, none", c.Mounted, c.WrittenSince, err)
	}
	m.host.Mounted = nil
	if err := fake.SetProperties(ctx, v.Dataset, map[string]string{copyrecord.PropRole: contract.RoleReplica}); err != nil {
		t.Fatal(err)
	}
	if c, err := m.Copy(ctx, v.ID); err != nil || c.WrittenSince != nil {
		t.Errorf("a replica's copy: written since %v, %v; want none", c.WrittenSince, err)
	}
}
