package migration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/replication"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// TestSnapshotsFollowTheVolume on real ZFS: a CSI snapshot taken on n1
// reaches n2 with the replica's first (full) push, the volume moves to
// n2, and there the snapshot is listed once and restored with the data it
// was taken with. The volume is deleted: its copies on both nodes become
// tombstones that keep the snapshot. DeleteSnapshot with n1 away
// succeeds: n2 and n3 remember it and n2's copy goes; once n1 is back its
// copy is never listed or restored, the controller deletes it, the
// records go, and nothing of the volume is left.
func TestSnapshotsFollowTheVolume(t *testing.T) {
	t.Parallel()
	e := start(t)
	id, dir, taken, snapID := e.snapshotted("snapped", nil, "echo before > a && dd if=/dev/urandom of=blob bs=1M count=4 2>/dev/null", "before-the-move")
	e.write("n1", dir, "echo after > a")

	if prog := e.replicate(id, "n1", "n2"); prog.GetKind() != "full" {
		t.Fatalf("the first push was %s, want full", prog.GetKind())
	}
	e.unpublish(id, "n1")
	dir2 := e.mustPublish(id, "n2")
	e.waitPrimaries(id, "n2(gen 2)")
	for _, n := range []string{"n1", "n2"} {
		if out := guesttest.Run(t, "sh", "-c", "zfs list -H -o name -t snapshot "+e.node(n).RootDataset+"/"+id+" | grep @"+snapID+" || true"); strings.TrimSpace(out) == "" {
			t.Fatalf("node %s holds no copy of snapshot %s after the move", n, snapID)
		}
	}
	listed, err := e.controller().ListSnapshots(e.ctx, &csi.ListSnapshotsRequest{SourceVolumeId: id})
	if err != nil || len(listed.GetEntries()) != 1 || listed.GetEntries()[0].GetSnapshot().GetSnapshotId() != snapID {
		t.Fatalf("ListSnapshots of the moved volume: %v, %v; want %s once", listed, err, snapID)
	}

	// Restored on n2, where the volume now lives: the data it was taken with.
	e.deleteVolume(e.restoreHolds("restored", snapID, map[string]string{"node": "n2"}, "n2", taken))

	// The volume goes; the snapshot outlives it on both nodes.
	_ = dir2
	e.unpublish(id, "n2")
	if _, err := e.controller().DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
	listed, err = e.controller().ListSnapshots(e.ctx, &csi.ListSnapshotsRequest{SnapshotId: snapID})
	if err != nil || len(listed.GetEntries()) != 1 {
		t.Fatalf("ListSnapshots after the volume's delete: %v, %v; want %s once", listed, err, snapID)
	}

	// Deleted while n1, which holds a copy, is away: n2 and n3 remember
	// the deletion, n2's copy goes, and the delete succeeds.
	e.loseNode("n1")
	deleteSnapshot := func() error {
		_, err := e.controller().DeleteSnapshot(e.ctx, &csi.DeleteSnapshotRequest{SnapshotId: snapID})
		return err
	}
	if err := deleteSnapshot(); err != nil {
		t.Fatalf("DeleteSnapshot with n1 (holding a copy) away and n2, n3 answering: %v, want OK", err)
	}
	if out := guesttest.Run(t, "sh", "-c", "zfs list -H -o name -t snapshot -r "+e.node("n2").RootDataset+" | grep @"+snapID+" || true"); strings.TrimSpace(out) != "" {
		t.Fatalf("n2's copy of the snapshot outlived the delete:\n%s", out)
	}
	for _, n := range []string{"n2", "n3"} {
		if !strings.Contains(e.deletionRecords(n), snapID) {
			t.Fatalf("node %s does not remember the deletion of %s", n, snapID)
		}
	}

	// n1 is back with its copy: never listed, never restored, and deleted
	// by the controller within a couple of its minutes; then the records go.
	e.returnNode("n1")
	if err := onceNodeBack(func() error { _, err := e.agent("n1").GetNode(e.ctx, &pb.GetNodeRequest{}); return err }); err != nil {
		t.Fatal(err)
	}
	err = whileUnavailable(func() error {
		_, err := e.controller().CreateVolume(e.ctx, &csi.CreateVolumeRequest{Name: "from-deleted", VolumeCapabilities: []*csi.VolumeCapability{writer},
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snapID}}}})
		return err
	})
	wantCode(t, err, codes.NotFound, snapID)
	if listed, err := e.controller().ListSnapshots(e.ctx, &csi.ListSnapshotsRequest{SnapshotId: snapID}); err != nil || len(listed.GetEntries()) != 0 {
		t.Errorf("ListSnapshots of the deleted snapshot with n1 back: %v, %v; want nothing", listed, err)
	}
	e.waitNothingLeft(id, "of the volume and its snapshot after both deletes and n1's return")
}

// waitNothingLeft waits for the controller's pass over deleted snapshots
// (every 10 s here) to leave no dataset or snapshot whose name holds
// pattern on any node, and no record of a deleted snapshot.
func (e *env) waitNothingLeft(pattern, what string) {
	e.t.Helper()
	var left string
	for deadline := time.Now().Add(150 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Second) {
		left = strings.TrimSpace(guesttest.Run(e.t, "sh", "-c", "zfs list -H -o name -t all | grep -- "+pattern+" || true"))
		for _, n := range []string{"n1", "n2", "n3"} {
			if r := e.deletionRecords(n); r != "" {
				left += "\nrecord on " + n + ": " + r
			}
		}
		if left == "" {
			return
		}
	}
	e.t.Fatalf("left %s:\n%s", what, left)
}

// TestASnapshotDeletedDuringAPush on real ZFS: a CSI snapshot is deleted,
// as a CO does (retried while the answer says retry), while a push that
// carries it runs, throttled to 10 MiB/s. Whatever ZFS does with the
// destroy on the sender while its send runs (refuses it as busy, or
// defers it), the snapshot is not listed once the delete answered OK and
// the push ended, no copy is left on the target, and the controller's
// pass leaves no copy and no record anywhere.
func TestASnapshotDeletedDuringAPush(t *testing.T) {
	t.Parallel()
	e := start(t)
	e.throttle("n1", "5M") // 60 MiB: about 12 s of push
	id, _, _, snapID := e.snapshotted("in-flight", nil, guesttest.RandomFile("blob", 60), "deleted-in-flight")
	pushed := make(chan error, 1)
	go func() { pushed <- e.push(id, "n1", "n2") }()
	e.waitForTransfer(id, "n1")

	began, tries := time.Now(), 0
	for {
		tries++
		_, err := e.controller().DeleteSnapshot(e.ctx, &csi.DeleteSnapshotRequest{SnapshotId: snapID})
		if err == nil {
			break
		}
		if c := status.Code(err); c != codes.Unavailable && c != codes.Aborted || time.Since(began) > 3*time.Minute {
			t.Fatalf("DeleteSnapshot during the push, try %d: %v", tries, err)
		}
		t.Logf("DeleteSnapshot during the push, try %d: %v", tries, err)
		time.Sleep(time.Second)
	}
	t.Logf("DeleteSnapshot answered OK after %d tries, %s", tries, time.Since(began).Round(time.Millisecond))
	t.Logf("the push ended: %v", <-pushed)

	if listed, err := e.controller().ListSnapshots(e.ctx, &csi.ListSnapshotsRequest{SnapshotId: snapID}); err != nil || len(listed.GetEntries()) != 0 {
		t.Errorf("ListSnapshots after the delete and the push: %v, %v; want nothing", listed, err)
	}
	if out := guesttest.Run(t, "sh", "-c", "zfs list -H -o name -t snapshot -r "+e.node("n2").RootDataset+" | grep @"+snapID+" || true"); strings.TrimSpace(out) != "" {
		t.Errorf("the push landed a copy of the deleted snapshot on n2 and it stayed:\n%s", out)
	}
	e.waitNothingLeft(snapID, "of the snapshot deleted during a push")
}

// snapshotted creates volume name (with params) on n1, runs script in it,
// and takes CSI snapshot snapName of it; it returns the volume's ID and
// mount directory, the checksums of the files the snapshot holds, and the
// snapshot's ID.
func (e *env) snapshotted(name string, params map[string]string, script, snapName string) (id, dir, taken, snapID string) {
	e.t.Helper()
	id, dir = e.createWritten(name, params, script)
	taken = e.checksums("n1", dir)
	snap, err := e.controller().CreateSnapshot(e.ctx, &csi.CreateSnapshotRequest{SourceVolumeId: id, Name: snapName})
	if err != nil {
		e.t.Fatal(err)
	}
	return id, dir, taken, snap.GetSnapshot().GetSnapshotId()
}

// restore creates volume name from snapshot snapID on the snapshot's node.
func (e *env) restore(name, snapID string, params map[string]string) string {
	e.t.Helper()
	p := map[string]string{"compression": "off"}
	for k, v := range params {
		p[k] = v
	}
	resp, err := e.controller().CreateVolume(e.ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{writer},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}, Parameters: p, Secrets: e.secrets,
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snapID}}}})
	if err != nil {
		e.t.Fatalf("restoring %s as %s: %v", snapID, name, err)
	}
	return resp.GetVolume().GetVolumeId()
}

// restoreHolds restores snapshot snapID as volume name (with params),
// publishes it on node, checks that it holds the files taken (checksums),
// unpublishes it and returns its ID.
func (e *env) restoreHolds(name, snapID string, params map[string]string, node, taken string) string {
	e.t.Helper()
	rid := e.restore(name, snapID, params)
	rdir := e.mustPublish(rid, node)
	if got := e.checksums(node, rdir); got != taken {
		e.t.Fatalf("the volume restored on %s holds:\n%s\nwant what the snapshot was taken of:\n%s", node, got, taken)
	}
	e.unpublish(rid, node)
	return rid
}

// deleteVolume deletes volume id, retrying while a node just back does
// not answer yet.
func (e *env) deleteVolume(id string) {
	e.t.Helper()
	if err := onceNodeBack(func() error {
		_, err := e.controller().DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: id})
		return err
	}); err != nil {
		e.t.Fatalf("deleting %s: %v", id, err)
	}
}

// deletionRecords returns what node n remembers of deleted snapshots
// (copyrecord.PropDeletedSnapshotPrefix properties), one per line.
func (e *env) deletionRecords(n string) string {
	e.t.Helper()
	ds := e.node(n).RootDataset + "/" + copyrecord.PromisesDataset
	return strings.TrimSpace(guesttest.Run(e.t, "sh", "-c", "zfs get -H -o property,value -s local all "+ds+" 2>/dev/null | grep "+copyrecord.PropDeletedSnapshotPrefix+" || true"))
}

// TestARestoreOnAReplica on real ZFS: a volume restored on a replica's
// node is a clone of the replica's copy of the snapshot, which ties the
// replica down while the clone lives. The replica still takes incremental
// pushes; the volume's delete turns the replica into a tombstone under
// the clone instead of failing; the snapshot's delete is deferred there
// and the listing forgets it at once; the clone's delete takes the
// snapshot and the tombstone along, and nothing of either volume is left.
func TestARestoreOnAReplica(t *testing.T) {
	t.Parallel()
	e := start(t)
	id, dir, taken, snapID := e.snapshotted("cloned-replica", nil, "echo before > a && dd if=/dev/urandom of=blob bs=1M count=2 2>/dev/null", "restored-on-the-replica")
	e.write("n1", dir, "echo after > a")
	e.replicate(id, "n1", "n2")

	rid := e.restoreHolds("clone-on-n2", snapID, map[string]string{"node": "n2"}, "n2", taken)
	origin := strings.TrimSpace(guesttest.Run(t, "zfs", "get", "-H", "-o", "value", "origin", e.node("n2").RootDataset+"/"+rid))
	if want := e.node("n2").RootDataset + "/" + id + "@" + snapID; origin != want {
		t.Fatalf("the restored volume's origin is %q, want the replica's copy %s", origin, want)
	}

	e.write("n1", dir, "echo later > b")
	if prog := e.replicate(id, "n1", "n2"); prog.GetKind() != "incremental" {
		t.Fatalf("a push to the replica holding a clone's origin was %s, want incremental", prog.GetKind())
	}

	e.unpublish(id, "n1")
	e.deleteVolume(id)
	if out := guesttest.Run(t, "sh", "-c", "zfs list -H -o name -t snapshot -r "+e.node("n2").RootDataset+" | grep @"+snapID+" || true"); strings.TrimSpace(out) == "" {
		t.Fatalf("the volume's delete took the snapshot the clone on n2 depends on")
	}
	listed, err := e.controller().ListSnapshots(e.ctx, &csi.ListSnapshotsRequest{SnapshotId: snapID})
	if err != nil || len(listed.GetEntries()) != 1 {
		t.Fatalf("ListSnapshots after the volume's delete: %v, %v; want %s once", listed, err, snapID)
	}

	if _, err := e.controller().DeleteSnapshot(e.ctx, &csi.DeleteSnapshotRequest{SnapshotId: snapID}); err != nil {
		t.Fatalf("DeleteSnapshot with a clone of its copy on n2: %v, want OK (destroyed deferred)", err)
	}
	if listed, err := e.controller().ListSnapshots(e.ctx, &csi.ListSnapshotsRequest{SnapshotId: snapID}); err != nil || len(listed.GetEntries()) != 0 {
		t.Fatalf("ListSnapshots after the delete: %v, %v; want nothing", listed, err)
	}
	// The clone still holds the data it was restored with.
	rdir := e.mustPublish(rid, "n2")
	if got := e.checksums("n2", rdir); got != taken {
		t.Fatalf("the clone after its origin's delete holds:\n%s\nwant:\n%s", got, taken)
	}
	e.unpublish(rid, "n2")

	e.deleteVolume(rid)
	var left string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		if left = strings.TrimSpace(guesttest.Run(t, "sh", "-c", "zfs list -H -o name -t all | grep -e "+id+" -e "+rid+" || true")); left == "" {
			return
		}
	}
	t.Fatalf("left of the volume, its snapshot and the clone after all three deletes:\n%s", left)
}

// TestAReplacedReplicaKeepsItsSnapshots on real ZFS: a replica replaced
// by a full send, while it holds a CSI snapshot the new primary lacks, is
// set aside rather than destroyed, and the snapshot stays listed once and
// restorable. The primary lost the snapshot and every snapshot it shared
// with n2 by hand (zfs destroy, as an operator might), then moved to n3,
// so the next push to n2 is a full one of a newer generation.
func TestAReplacedReplicaKeepsItsSnapshots(t *testing.T) {
	t.Parallel()
	e := start(t)
	id, dir, taken, snapID := e.snapshotted("replaced", nil, "echo kept > a && dd if=/dev/urandom of=blob bs=1M count=2 2>/dev/null", "only-on-the-old-replica")
	e.replicate(id, "n1", "n2")

	src := e.node("n1").RootDataset + "/" + id
	guesttest.Run(t, "sh", "-c", "for s in $(zfs list -H -t snapshot -o name -d 1 "+src+"); do "+
		"for tag in $(zfs holds -H $s | cut -f2); do zfs release $tag $s; done; zfs destroy $s; done")
	e.write("n1", dir, "echo later > b")
	e.unpublish(id, "n1")
	e.mustPublish(id, "n3")
	e.waitPrimaries(id, "n3(gen 2)")
	e.unpublish(id, "n3")

	if prog := e.replicate(id, "n3", "n2"); prog.GetKind() != "full" {
		t.Fatalf("the push from the new primary to n2 was %s, want full (they share no snapshot)", prog.GetKind())
	}
	if out := guesttest.Run(t, "sh", "-c", "zfs list -H -o name -t snapshot -r "+e.node("n2").RootDataset+" | grep @"+snapID+" || true"); strings.TrimSpace(out) == "" {
		t.Fatal("the full send's replacement destroyed the only copy of the CSI snapshot")
	}
	listed, err := e.controller().ListSnapshots(e.ctx, &csi.ListSnapshotsRequest{SnapshotId: snapID})
	if err != nil || len(listed.GetEntries()) != 1 {
		t.Fatalf("ListSnapshots after the replacement: %v, %v; want %s once", listed, err, snapID)
	}
	e.deleteVolume(e.restoreHolds("from-the-set-aside", snapID, map[string]string{"node": "n2"}, "n2", taken))
}

// TestASnapshotKeptTwiceGoesWithItsDelete (docs/safety.md, the seventh
// gap) on real ZFS: a node holds one CSI snapshot twice, on the
// volume's replica and on a tombstone of the same volume, and no receive
// told the node process (it came before the process's start: here the
// tombstone is made by hand while n2's process is down). The snapshot's
// delete must destroy both copies, or the node lists the deleted
// snapshot again once it lists its pool.
func TestASnapshotKeptTwiceGoesWithItsDelete(t *testing.T) {
	t.Parallel()
	e := start(t)
	id, _, _, snapID := e.snapshotted("kept-twice", nil, "echo kept > a", "twice")
	e.replicate(id, "n1", "n2")

	n2 := e.node("n2")
	copyOnN2 := n2.RootDataset + "/" + id
	tombstone := copyOnN2 + "-deleted-1"
	n2.Process.Stop()
	// A second after a receive the receiver moves its base hold to the
	// newest snapshot (Receiver.tidy). The replica is left as a stop
	// within that second leaves it, whenever this one came: the CSI
	// snapshot held as the base, the newest snapshot not. The restart
	// must move the hold (Receiver.Recover), or the delete below would
	// only defer the CSI snapshot's destroy and it would stay listed.
	guesttest.Run(t, "sh", "-c", fmt.Sprintf(`newest=$(zfs list -H -o name -t snapshot -s createtxg -d 1 %[1]s | tail -n 1)
[ "$newest" != %[1]s@%[2]s ] || { echo "no snapshot newer than the CSI snapshot on n2"; exit 1; }
zfs release %[3]s "$newest" 2>/dev/null || true
zfs hold %[3]s %[1]s@%[2]s 2>/dev/null || true
zfs holds -H %[1]s@%[2]s | grep -q %[3]s`, copyOnN2, snapID, replication.BaseHoldTag))
	guesttest.Run(t, "sh", "-c", fmt.Sprintf("zfs send %[1]s@%[2]s | zfs receive -u %[3]s && zfs set %[4]s=%[5]s %[6]s=%[7]s %[3]s",
		copyOnN2, snapID, tombstone, copyrecord.PropRole, contract.RoleDeleted, copyrecord.PropVolumeID, id))
	e.returnNodeProcess("n2")

	if _, err := e.controller().DeleteSnapshot(e.ctx, &csi.DeleteSnapshotRequest{SnapshotId: snapID}); err != nil {
		t.Fatalf("DeleteSnapshot: %v", err)
	}
	e.waitNothingLeft("@"+snapID, "copies of the deleted snapshot")
	if err := n2.RestartWith(); err != nil {
		t.Fatal(err)
	}
	e.awaitControllerReaches("n2")
	listed, err := e.controller().ListSnapshots(e.ctx, &csi.ListSnapshotsRequest{SnapshotId: snapID})
	if err != nil || len(listed.GetEntries()) != 0 {
		t.Fatalf("ListSnapshots after the delete and a restart of n2: %v, %v; want nothing", listed, err)
	}
	e.unpublish(id, "n1")
	e.deleteVolume(id)
}
