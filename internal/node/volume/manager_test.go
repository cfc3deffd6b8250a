package volume

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfsfake"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

func TestCreateIsIdempotentAndChecksCompatibility(t *testing.T) {
	m, fake := newManager(t)
	ctx := context.Background()
	req := CreateRequest{Name: "data", RequiredBytes: 1 << 30, Parameters: map[string]string{"compression": "zstd"}}
	v, err := m.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if v.ID != contract.VolumeIDForName("data") || v.Capacity != 1<<30 || v.Dataset != root+"/"+v.ID {
		t.Fatalf("created %+v", v)
	}
	if got := fake.NativeProperty(v.Dataset, "compression"); got != "zstd" {
		t.Errorf("compression = %q, want the parameter's zstd", got)
	}
	if got := fake.NativeProperty(v.Dataset, "mountpoint"); got != "legacy" {
		t.Errorf("mountpoint = %q, want legacy", got)
	}
	again, err := m.Create(ctx, req)
	if err != nil || again.ID != v.ID {
		t.Fatalf("repeated create: %+v, %v", again, err)
	}

	incompatible := []CreateRequest{
		{Name: "data", RequiredBytes: 2 << 30, Parameters: req.Parameters},
		{Name: "data", RequiredBytes: 1 << 30, Parameters: map[string]string{"compression": "off"}},
		{Name: "data", RequiredBytes: 1 << 30, LimitBytes: 1 << 29, Parameters: req.Parameters},
	}
	for _, r := range incompatible {
		_, err := m.Create(ctx, r)
		if !errors.Is(err, errdefs.ErrAlreadyExists) && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("create %+v: %v, want AlreadyExists (or InvalidArgument for a bad range)", r, err)
		}
	}
}

func TestCreateValidatesAgainstOperatorRules(t *testing.T) {
	tests := []struct {
		name string
		req  CreateRequest
		want error
		msg  string
	}{
		{"empty name", CreateRequest{}, errdefs.ErrInvalidArgument, "name is required"},
		{"above ceiling", CreateRequest{Name: "a", RequiredBytes: 5 << 30}, errdefs.ErrOutOfRange, "maximum volume size"},
		{"required above limit", CreateRequest{Name: "a", RequiredBytes: 2 << 30, LimitBytes: 1 << 30}, errdefs.ErrInvalidArgument, "above the limit"},
		{"unknown parameter", CreateRequest{Name: "a", Parameters: map[string]string{"mountpoint": "/etc"}}, errdefs.ErrInvalidArgument, `"mountpoint" is not allowed`},
		{"value not allowed", CreateRequest{Name: "a", Parameters: map[string]string{"compression": "gzip"}}, errdefs.ErrInvalidArgument, "operator allows lz4, off, zstd"},
		{"syntax in value", CreateRequest{Name: "a", Parameters: map[string]string{"atime": "on,quota=1"}}, errdefs.ErrInvalidArgument, "not allowed"},
		{"missing snapshot", CreateRequest{Name: "a", SourceSnapshotID: contract.SnapshotIDForName("nope")}, errdefs.ErrNotFound, "snapshot"},
		{"missing volume", CreateRequest{Name: "a", SourceVolumeID: contract.VolumeIDForName("nope")}, errdefs.ErrNotFound, "volume"},
		{"two sources", CreateRequest{Name: "a", SourceVolumeID: "x", SourceSnapshotID: "y"}, errdefs.ErrInvalidArgument, "at most one source"},
		{"k8s parameters ignored", CreateRequest{Name: "a", Parameters: map[string]string{"csi.storage.k8s.io/pvc/name": "x"}}, nil, ""},
		{"node parameter accepted", CreateRequest{Name: "b", Parameters: map[string]string{"node": "n1"}}, nil, ""},
		{"owner digest malformed", CreateRequest{Name: "a", Parameters: map[string]string{contract.ParamOwnerDigest: "sha256:00"}}, errdefs.ErrInvalidArgument, "the driver's own"},
		{"owner digest accepted", CreateRequest{Name: "a", Parameters: map[string]string{contract.ParamOwnerDigest: contract.OwnerDigest("0123456789abcdef")}}, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := newManager(t)
			_, err := m.Create(context.Background(), tc.req)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("got %v, want success", err)
				}
				return
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("got %v, want %v containing %q", err, tc.want, tc.msg)
			}
		})
	}
}

// TestAnOperatorMayRequireOwnerSecrets: with require_owner_secret, a
// create without an owner secret's digest is refused and creates
// nothing; one with it succeeds.
func TestAnOperatorMayRequireOwnerSecrets(t *testing.T) {
	m, fake := newManager(t)
	m.cfg.RequireOwnerSecret = true
	ctx := context.Background()
	_, err := m.Create(ctx, CreateRequest{Name: "plain"})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "require_owner_secret") {
		t.Fatalf("a create without an owner secret: %v, want InvalidArgument naming require_owner_secret", err)
	}
	wantOnlyRoot(t, fake, "after the refused create")
	if _, err := m.Create(ctx, CreateRequest{Name: "owned", Parameters: map[string]string{contract.ParamOwnerDigest: contract.OwnerDigest("0123456789abcdef")}}); err != nil {
		t.Fatalf("a create with an owner secret: %v", err)
	}
}

func TestDeleteWithSnapshotsLeavesTombstoneUntilLastSnapshotGoes(t *testing.T) {
	m, fake := newManager(t)
	ctx := context.Background()
	v := create(t, m, CreateRequest{Name: "data"})
	snap := snapshot(t, m, v.ID, "s1")
	if err := m.Delete(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Get(ctx, v.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("deleted volume Get: %v, want NotFound", err)
	}
	if vols, _ := m.List(ctx); len(vols) != 0 {
		t.Errorf("List after delete = %v, want none", vols)
	}
	// The snapshot outlives its volume and can still be restored.
	snaps, err := m.ListSnapshots(ctx)
	if err != nil || len(snaps) != 1 || snaps[0].ID != snap.ID || snaps[0].SourceVolumeID != v.ID {
		t.Fatalf("snapshots after volume delete: %+v, %v", snaps, err)
	}
	restored := create(t, m, CreateRequest{Name: "restored", SourceSnapshotID: snap.ID})
	// The name is free again.
	if _, err := m.Create(ctx, CreateRequest{Name: "data"}); err != nil {
		t.Fatalf("re-create after delete: %v", err)
	}
	// Deleting the snapshot defers while the clone lives; deleting the clone
	// then removes snapshot and tombstone.
	if err := m.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	if snaps, _ := m.ListSnapshots(ctx); len(snaps) != 0 {
		t.Errorf("deleted snapshot still listed: %+v", snaps)
	}
	if err := m.Delete(ctx, restored.ID); err != nil {
		t.Fatal(err)
	}
	for _, name := range fake.Names() {
		if strings.Contains(name, "deleted") || strings.Contains(name, "@") {
			t.Errorf("left behind: %s (all: %v)", name, fake.Names())
		}
	}
}

func TestCloneOfVolumeSurvivesSourceDeletion(t *testing.T) {
	m, fake := newManager(t)
	ctx := context.Background()
	src, _ := m.Create(ctx, CreateRequest{Name: "src"})
	clone := create(t, m, CreateRequest{Name: "clone", SourceVolumeID: src.ID})
	if clone.Source != "volume:"+src.ID {
		t.Errorf("clone source = %q", clone.Source)
	}
	// The private clone snapshot is no CSI snapshot.
	if snaps, _ := m.ListSnapshots(ctx); len(snaps) != 0 {
		t.Errorf("private snapshot listed: %+v", snaps)
	}
	if err := m.Delete(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Get(ctx, clone.ID); err != nil {
		t.Fatalf("clone after source delete: %v", err)
	}
	if err := m.Delete(ctx, clone.ID); err != nil {
		t.Fatal(err)
	}
	wantOnlyRoot(t, fake, "after both volumes went")
}

func TestDeleteAndSnapshotIdempotency(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	for _, id := range []string{"", "garbage", "vol-../../etc", contract.VolumeIDForName("never")} {
		if err := m.Delete(ctx, id); err != nil {
			t.Errorf("Delete(%q) = %v, want success", id, err)
		}
		if err := m.DeleteSnapshot(ctx, id); err != nil {
			t.Errorf("DeleteSnapshot(%q) = %v, want success", id, err)
		}
	}
	a, _ := m.Create(ctx, CreateRequest{Name: "a"})
	b, _ := m.Create(ctx, CreateRequest{Name: "b"})
	s1, err := m.CreateSnapshot(ctx, a.ID, "snap")
	if err != nil {
		t.Fatal(err)
	}
	if again, err := m.CreateSnapshot(ctx, a.ID, "snap"); err != nil || again.ID != s1.ID {
		t.Errorf("repeat CreateSnapshot: %+v, %v", again, err)
	}
	if _, err := m.CreateSnapshot(ctx, b.ID, "snap"); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("same snapshot name on another volume: %v, want AlreadyExists", err)
	}
	if _, err := m.CreateSnapshot(ctx, contract.VolumeIDForName("missing"), "other"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("snapshot of a missing volume: %v, want NotFound", err)
	}
}

func TestExpand(t *testing.T) {
	m, fake := newManager(t)
	ctx := context.Background()
	v, _ := m.Create(ctx, CreateRequest{Name: "a", RequiredBytes: 1 << 30})
	tests := []struct {
		required uint64
		want     uint64
		err      error
	}{
		{2 << 30, 2 << 30, nil},
		{1 << 30, 2 << 30, nil}, // never shrinks
		{8 << 30, 0, errdefs.ErrOutOfRange},
	}
	for _, tc := range tests {
		got, err := m.Expand(ctx, v.ID, tc.required, 0)
		if !errors.Is(err, tc.err) || got != tc.want {
			t.Errorf("Expand(%d) = %d, %v; want %d, %v", tc.required, got, err, tc.want, tc.err)
		}
	}
	if q := fake.NativeProperty(v.Dataset, "refquota"); q != "2147483648" {
		t.Errorf("refquota = %s", q)
	}
	if _, err := m.Expand(ctx, contract.VolumeIDForName("missing"), 1, 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("expand missing: %v", err)
	}
}

func TestForeignDatasetIsNeverTreatedAsVolume(t *testing.T) {
	m, fake := newManager(t)
	ctx := context.Background()
	id := contract.VolumeIDForName("x")
	// A dataset at a volume's path that the driver did not label.
	if err := fake.CreateFilesystem(ctx, root+"/"+id, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Get(ctx, id); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Get of an unlabelled dataset: %v, want FailedPrecondition", err)
	}
	if err := m.Delete(ctx, id); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Delete of an unlabelled dataset: %v, want FailedPrecondition (never destroyed)", err)
	}
	if _, err := fake.Get(ctx, root+"/"+id); err != nil {
		t.Errorf("foreign dataset gone: %v", err)
	}
}

// TestGetOfAReplicaSaysSo: the operator's commands ask every node for a
// volume; a node that holds a replica says that, not that an operator
// must look at a stranger.
func TestGetOfAReplicaSaysSo(t *testing.T) {
	m, fake := newManager(t)
	id, _ := putCopy(t, fake, "replicated", contract.RoleReplica, 2, nil)
	_, err := m.Get(context.Background(), id)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "node n1 holds a replica of volume "+id+", not its primary") {
		t.Errorf("Get of a replica: %v", err)
	}
}

func TestZFSErrorsAreClassified(t *testing.T) {
	m, fake := newManager(t)
	ctx := context.Background()
	fake.Fail = func(op, name string) error {
		if op == "create" {
			return zfs.ErrUnavailable
		}
		return nil
	}
	if _, err := m.Create(ctx, CreateRequest{Name: "a"}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("create with ZFS down: %v, want Unavailable", err)
	}
	fake.Fail = nil
	if err := m.Health(ctx); err != nil {
		t.Errorf("Health of a good node: %v", err)
	}
	fake.SetProperties(ctx, root, map[string]string{"readonly": "on"})
	if err := m.Health(ctx); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "readonly") {
		t.Errorf("Health with a read-only root: %v", err)
	}
	fake.Fail = func(op, name string) error { return zfs.ErrUnavailable }
	if err := m.Health(ctx); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Health with pool down: %v", err)
	}
}

func TestCapacity(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	m.Create(ctx, CreateRequest{Name: "a"})
	c, err := m.Capacity(ctx)
	if err != nil || c.Volumes != 1 || c.MaxQuota != 4<<30 || c.Available != 10<<30 {
		t.Errorf("Capacity = %+v, %v", c, err)
	}
}

func TestRootSpace(t *testing.T) {
	m, fake := newManager(t)
	ctx := context.Background()
	fake.SetUsed(root, 3<<30)
	used, available, err := m.RootSpace(ctx)
	if err != nil || used != 3<<30 || available != 7<<30 {
		t.Errorf("RootSpace = %d used, %d available, %v; want 3 GiB and 7 GiB of the 10 GiB pool", used, available, err)
	}
	if err := fake.Destroy(ctx, root); err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.RootSpace(ctx); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("RootSpace without the root dataset: %v, want NotFound", err)
	}
}

func TestReplicationParameters(t *testing.T) {
	tests := []struct {
		params map[string]string
		ok     bool
	}{
		{map[string]string{"replicas": "2", "replication_interval": "5m"}, true},
		{map[string]string{"replicas": "0"}, true},
		{map[string]string{"replicas": "3"}, false},  // above max_replicas 2
		{map[string]string{"replicas": "-1"}, false}, // negative
		{map[string]string{"replicas": "two"}, false},
		{map[string]string{"replicas": "1", "replication_interval": "10s"}, false}, // below 1m
		{map[string]string{"replication_interval": "soon"}, false},
		{map[string]string{"backup_retention": "1h:24,1d:14"}, true},
		{map[string]string{"backup_retention": "1d:14,1d:7"}, false}, // an interval twice
		{map[string]string{"backup_retention": "daily"}, false},
		{map[string]string{"backup_to": "vault", "backup_every": "2h"}, true},
		{map[string]string{"backup_to": "vault,offsite"}, true},
		{map[string]string{"backup_to": "elsewhere"}, false},                   // not in backup_targets
		{map[string]string{"backup_to": "vault", "backup_every": "5m"}, false}, // below min_backup_interval 1h
		{map[string]string{"backup_every": "2h"}, false},                       // no target
	}
	for _, tc := range tests {
		m, _ := newManager(t)
		_, err := m.Create(context.Background(), CreateRequest{Name: "r", Parameters: tc.params})
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, errdefs.ErrInvalidArgument)) {
			t.Errorf("Create with %v: %v; want ok=%v", tc.params, err, tc.ok)
		}
	}
	if n, d := contract.ReplicationPolicy(map[string]string{"replicas": "2"}); n != 2 || d != contract.DefaultReplicationInterval {
		t.Errorf("contract.ReplicationPolicy = %d, %s", n, d)
	}
}

// replicatedVolume creates a volume with two replication snapshots, the
// newer held as a peer's incremental base.
func replicatedVolume(t *testing.T, m *Manager, fake *zfsfake.Fake) Volume {
	t.Helper()
	ctx := context.Background()
	v := create(t, m, CreateRequest{Name: "replicated"})
	for _, s := range []string{"zn-1", "zn-2"} {
		if err := fake.Snapshot(ctx, v.Dataset+"@"+s, nil); err != nil {
			t.Fatal(err)
		}
	}
	fake.PutHold(v.Dataset+"@zn-2", "zfs-nomad-base-n2")
	return v
}

func TestTombstonesIgnoreReplicationSnapshots(t *testing.T) {
	m, fake := newManager(t)
	ctx := context.Background()
	v, _ := m.Create(ctx, CreateRequest{Name: "busy"})
	snap, _ := m.CreateSnapshot(ctx, v.ID, "keep")
	if err := m.Delete(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	// A replication snapshot that appeared on the tombstone (a push that
	// raced the delete) does not keep it once the CSI snapshot goes.
	var tomb string
	for _, n := range fake.Names() {
		if strings.Contains(n, "-deleted-") && !strings.Contains(n, "@") {
			tomb = n
		}
	}
	if err := fake.Snapshot(ctx, tomb+"@zn-9", nil); err != nil {
		t.Fatal(err)
	}
	fake.PutHold(tomb+"@zn-9", "zfs-nomad-base-n2")
	if err := m.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	wantOnlyRoot(t, fake, "a replication snapshot must not keep the tombstone")
}

// TestDeleteRacesTidy has a push's tidy (which prunes and holds
// replication snapshots on its own schedule) act between a delete's steps:
// the delete must end with everything gone and answer OK. Held replication
// snapshots never keep a deleted volume, raced or not.
func TestDeleteRacesTidy(t *testing.T) {
	tests := []struct {
		name string
		// race runs once, just before the delete's op on the named
		// snapshot (short name), as the concurrent caller.
		op, snap string
		race     func(f *zfsfake.Fake, snap string)
	}{
		{"no race", "", "", nil},
		{"a snapshot pruned before its release", "release", "zn-1", func(f *zfsfake.Fake, s string) { _ = f.Destroy(context.Background(), s) }},
		{"a snapshot pruned before its destroy", "destroy", "zn-1", func(f *zfsfake.Fake, s string) { _ = f.Destroy(context.Background(), s) }},
		{"a snapshot held as the new base before its destroy", "destroy", "zn-2", func(f *zfsfake.Fake, s string) { f.PutHold(s, "zfs-nomad-base-n2") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, fake := newManager(t)
			ctx := context.Background()
			v := replicatedVolume(t, m, fake)
			raced := tt.race == nil // no race to wait for
			fake.Before = func(op, name string) {
				if !raced && op == tt.op && name == v.Dataset+"@"+tt.snap {
					raced = true
					tt.race(fake, name)
				}
			}
			if err := m.Delete(ctx, v.ID); err != nil {
				t.Fatalf("delete: %v", err)
			}
			if !raced {
				t.Fatal("the race never happened: the delete's steps changed, update the test")
			}
			wantOnlyRoot(t, fake, "after the delete")
		})
	}
}

func TestDeleteSnapshotGoneMeanwhile(t *testing.T) {
	m, fake := newManager(t)
	ctx := context.Background()
	v, _ := m.Create(ctx, CreateRequest{Name: "v"})
	snap, _ := m.CreateSnapshot(ctx, v.ID, "s")
	fake.Before = func(op, name string) {
		if op == "destroy" && name == snap.Dataset {
			fake.Before = nil
			_ = fake.Destroy(ctx, name)
		}
	}
	if err := m.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatalf("delete of a snapshot destroyed meanwhile: %v", err)
	}
}

func TestDeleteRefusesAMountedVolumeBeforeTouchingIt(t *testing.T) {
	m, fake := newManager(t)
	ctx := context.Background()
	v, _ := m.Create(ctx, CreateRequest{Name: "mounted"})
	if err := fake.Snapshot(ctx, v.Dataset+"@zn-1", nil); err != nil {
		t.Fatal(err)
	}
	fake.PutHold(v.Dataset+"@zn-1", "zfs-nomad-base-n2")
	m.host.Mounted = func(ds string) (bool, error) { return ds == v.Dataset, nil }
	err := m.Delete(ctx, v.ID)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "unpublish") {
		t.Fatalf("delete of a mounted volume: %v, want FailedPrecondition asking to unpublish", err)
	}
	if _, err := fake.Get(ctx, v.Dataset+"@zn-1"); err != nil {
		t.Errorf("the held replication base is gone after a refused delete: %v", err)
	}
}

// TestTheIndexListingCollectsTombstones: deletes list nothing (on a node
// with a thousand volumes, a delete that listed the node answered past the
// controller's deadline, BenchmarkScale), and the tombstone a crash left
// behind is collected by the next listing of the node's primaries, which
// a read of the index starts once it is indexMaxAge old.
func TestTheIndexListingCollectsTombstones(t *testing.T) {
	ctx := context.Background()
	m, fake := newManager(t)
	clock := time.Now()
	m.UseClock(func() time.Time { return clock })
	v, _ := m.Create(ctx, CreateRequest{Name: "v"})
	s, err := m.CreateSnapshot(ctx, v.ID, "s")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Delete(ctx, v.ID); err != nil { // a tombstone: it has a snapshot
		t.Fatal(err)
	}
	// The snapshot goes behind the driver's back (a crash between its
	// destroy and the tombstone's collection): only a listing finds it.
	held, err := m.GetSnapshot(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := fake.Destroy(ctx, held.Dataset); err != nil {
		t.Fatal(err)
	}
	tombstone := zfs.Parent(held.Dataset)

	var listings atomic.Int32
	fake.Before = func(op, name string) {
		if op == "list" && name == root {
			listings.Add(1)
		}
	}
	w, _ := m.Create(ctx, CreateRequest{Name: "w"})
	waitForListing(t, &m.index.primaryIndex)
	listings.Store(0)
	clock = clock.Add(indexMaxAge)
	if err := m.Delete(ctx, w.ID); err != nil {
		t.Fatal(err)
	}
	if n := listings.Load(); n != 0 {
		t.Errorf("a delete listed the node %d times, want none", n)
	}
	if _, err := fake.Get(ctx, tombstone); err != nil {
		t.Fatalf("tombstone %s collected before any listing: %v", tombstone, err)
	}

	if _, err := m.index.primaries(ctx); err != nil { // stale: starts a listing
		t.Fatal(err)
	}
	waitForListing(t, &m.index.primaryIndex)
	waitForSweep(t, m)
	if n := listings.Load(); n != 1 {
		t.Errorf("the index's listing and the tombstones' collection listed the node %d times, want once", n)
	}
	if _, err := fake.Get(ctx, tombstone); !errors.Is(err, zfs.ErrNotFound) {
		t.Errorf("tombstone %s after the index's listing: %v, want it collected", tombstone, err)
	}
}

// waitForSweep waits until no collection of tombstones runs.
func waitForSweep(t *testing.T, m *Manager) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		m.sweepMu.Lock()
		running := m.sweeping
		m.sweepMu.Unlock()
		if !running {
			return
		}
	}
	t.Fatal("the collection of tombstones did not end within 5s")
}

// TestATombstoneIsCollectedUnderItsCopysLock: a tombstone whose rename a
// crash cut short keeps the volume's own name; collecting it waits for
// the copy's lock (a receive may hold it), and destroys it once free.
// Found by the simulation (I5, seed 14533 of 10001-15000, 2026-11-27).
func TestATombstoneIsCollectedUnderItsCopysLock(t *testing.T) {
	m, fake := newManager(t)
	id, ds := putCopy(t, fake, "v", contract.RoleDeleted, 1, nil)
	unlock, err := m.Locks().Lock(context.Background(), id, "receive from node n1")
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	m.collectTombstone(short, ds)
	if !slices.Contains(fake.Names(), ds) {
		t.Fatal("the tombstone was destroyed while its copy's lock was held")
	}
	unlock()
	m.collectTombstone(context.Background(), ds)
	if slices.Contains(fake.Names(), ds) {
		t.Fatal("the tombstone was not collected once the lock was free")
	}
}

// busyDestroy is a pool whose destroy of one dataset is refused as busy,
// as ZFS refuses a dataset mounted in another mount namespace.
type busyDestroy struct {
	*zfsfake.Fake
	busy string
}

func (b busyDestroy) Destroy(ctx context.Context, name string) error {
	if name == b.busy {
		return fmt.Errorf("destroy %s: dataset is busy: %w", name, zfs.ErrBusy)
	}
	return b.Fake.Destroy(ctx, name)
}

func TestABusyDeleteSaysWhoHoldsTheVolume(t *testing.T) {
	m, fake := newManager(t)
	v := create(t, m, CreateRequest{Name: "v"})
	busy := NewManager(Deps{ZFS: busyDestroy{Fake: fake, busy: v.Dataset}, Config: m.cfg, Log: hclog.NewNullLogger()})
	busy.host.MountHolders = func(dataset string) []string {
		if dataset != v.Dataset {
			return nil
		}
		return []string{"pid 812 (sleep) at /data"}
	}
	err := busy.Delete(context.Background(), v.ID)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "pid 812 (sleep) at /data") {
		t.Errorf("Delete of a busy volume: %v; want FailedPrecondition naming the process that holds it", err)
	}
}

// TestDeleteOfAVolumeMountedElsewhereTouchesNothing: a volume the node
// unmounted may still be mounted in another mount namespace (a task's);
// ZFS refuses its destroy as busy only after the delete dropped its
// replication snapshots, the bases of its replicas' increments. The
// delete is refused first, naming the processes, and the volume keeps
// every snapshot.
func TestDeleteOfAVolumeMountedElsewhereTouchesNothing(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		holders []string
		refused bool
	}{
		{"mounted in a task's namespace", []string{"pid 812 (sleep) at /data"}, true},
		{"mounted nowhere", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, fake := newManager(t)
			v := create(t, m, CreateRequest{Name: "v"})
			if err := fake.Snapshot(ctx, v.Dataset+"@zn-1", nil); err != nil {
				t.Fatal(err)
			}
			fake.PutHold(v.Dataset+"@zn-1", "zfs-nomad-base-n2")
			if tc.refused { // and ZFS answers EBUSY, as it does
				m = NewManager(Deps{ZFS: busyDestroy{Fake: fake, busy: v.Dataset}, Config: m.cfg, Log: hclog.NewNullLogger()})
			}
			m.host.Mounted = func(string) (bool, error) { return false, nil } // not in the node's own table
			m.host.MountHolders = func(dataset string) []string {
				if dataset != v.Dataset {
					return nil
				}
				return tc.holders
			}
			err := m.Delete(ctx, v.ID)
			if !tc.refused {
				if err != nil {
					t.Fatalf("Delete: %v", err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "pid 812 (sleep) at /data") {
				t.Errorf("Delete: %v; want FailedPrecondition naming the process that holds it", err)
			}
			if !slices.Contains(fake.Names(), v.Dataset+"@zn-1") {
				t.Errorf("the refused delete destroyed the replication snapshot: left %v", fake.Names())
			}
		})
	}
}

// TestCreateAtThePromisedGeneration: a node creates a volume at the
// generation a majority promised it (1, or a later one when racing
// creations split generation 1: migration.ReserveCreation), and refuses
// one promised to another node.
func TestCreateAtThePromisedGeneration(t *testing.T) {
	tests := []struct {
		name    string
		promise uint64 // 0: none
		holder  string
		want    uint64 // 0: refused
	}{
		{"no promise (a node without peers)", 0, "", 1},
		{"generation 1 promised here", 1, "n1", 1},
		{"a later generation promised here", 3, "n1", 3},
		{"promised to another node", 3, "n2", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, _ := newManager(t)
			ctx := context.Background()
			id := contract.VolumeIDForName("data")
			if tt.promise > 0 {
				if _, granted, err := m.records.Reserve(ctx, id, tt.promise, tt.holder); err != nil || !granted {
					t.Fatalf("reserve: %v %v", granted, err)
				}
			}
			v, err := m.Create(ctx, CreateRequest{Name: "data"})
			if tt.want == 0 {
				if !errors.Is(err, errdefs.ErrFailedPrecondition) {
					t.Fatalf("create: %+v, %v; want FailedPrecondition", v, err)
				}
				return
			}
			if err != nil || v.Generation != tt.want {
				t.Fatalf("create: generation %d, %v; want %d", v.Generation, err, tt.want)
			}
			c, err := m.Copy(ctx, id)
			if err != nil || c.Generation != tt.want || c.HistoryFrom != tt.want {
				t.Fatalf("copy: %+v, %v; want generation and history from %d", c, err, tt.want)
			}
		})
	}
}
