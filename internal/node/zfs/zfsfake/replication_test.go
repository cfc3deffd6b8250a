package zfsfake_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/zfs-nomad/zfs-nomad/internal/node/agent"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copylock"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/replication"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// TestRealReplication runs the real Pusher and Receiver over two fakes,
// through gRPC in memory: the fake must be the pool they expect, for a
// full push, a resumed one and an incremental one.
func TestRealReplication(t *testing.T) {
	src, dst, id, fs := primaryAndPeer(t)
	push := pusherTo(t, src, dst)

	check := func(kind string) {
		t.Helper()
		prog, err := push(id)
		if err != nil || prog.Kind != kind {
			t.Fatalf("push: %+v, %v; want a %s push", prog, err, kind)
		}
		snaps := dst.snaps(t, fs)
		newest := snaps[len(snaps)-1]
		if got, want := dst.content(t, newest.Name), src.content(t, newest.Name); !slices.Equal(got, want) {
			t.Errorf("after the %s push the replica's %s holds %v, the source's %v", kind, newest.Name, got, want)
		}
		if tok := dst.get(t, fs, "receive_resume_token"); tok != "-" {
			t.Errorf("after the %s push the replica has a resume token", kind)
		}
	}
	must(t, src.Write(fs, "a"))
	check(replication.KindFull)

	// A push whose stream broke: the replica keeps a partial receive of
	// a snapshot the source has, and the next push resumes it.
	must(t, src.Write(fs, "b"))
	base := src.snaps(t, fs)[0].Name
	must(t, src.s.Snapshot(ctx, fs+"@zn-1", nil))
	stream := src.send(t, zfs.SendSpec{Snapshot: fs + "@zn-1", Base: base})
	if err := dst.s.Receive(ctx, fs, nil, bytes.NewReader(stream[:400])); err == nil {
		t.Fatal("a cut stream was received whole")
	}
	check(replication.KindResume)
	if got := dst.content(t, fs+"@zn-1"); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("the resumed snapshot holds %v", got)
	}

	must(t, src.Write(fs, "c"))
	check(replication.KindIncremental)
	if got := dst.content(t, fs); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("the replica holds %v", got)
	}
}

// primaryAndPeer returns two nodes, the first holding a primary at
// generation 1, with its volume ID and dataset.
func primaryAndPeer(t *testing.T) (src, dst node, id, fs string) {
	id = "vol-0123456789abcdef0123"
	src, dst = newNode(t, 1, "tank/nomad"), newNode(t, 2, "tank/nomad")
	fs = "tank/nomad/" + id
	must(t, src.CreateFilesystem(ctx, fs, map[string]string{copyrecord.PropRole: contract.RolePrimary, copyrecord.PropVolumeID: id,
		copyrecord.PropGeneration: "1", copyrecord.PropName: "v", "refquota": "1000000"}))
	return src, dst, id, fs
}

// pusherTo returns a push of a volume from src to a Receiver on dst.
func pusherTo(t *testing.T, src, dst node) func(id string) (replication.Progress, error) {
	p := pusherWith(t, src, dst, new(copylock.Locks))
	return func(id string) (replication.Progress, error) {
		return p.Push(ctx, id, "n2", 0, func(replication.Progress) {})
	}
}

// TestFencedPush: a move's final push fences the primary under the lock
// that guards its snapshot, names the snapshot after the fence's time and
// reports that time; a refused fence sends nothing and leaves no snapshot.
func TestFencedPush(t *testing.T) {
	src, dst, id, fs := primaryAndPeer(t)
	must(t, src.Write(fs, "a"))
	push := pusherTo(t, src, dst)
	if _, err := push(id); err != nil {
		t.Fatal(err)
	}
	locks := new(copylock.Locks)
	p := pusherWith(t, src, dst, locks)

	var fencedAt int64
	lockedDuringFence := false
	fence := func(ctx context.Context, at int64) (int64, error) {
		probe, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		if unlock, err := locks.Lock(probe, id, "a probe"); err == nil {
			unlock()
		} else {
			lockedDuringFence = true
		}
		fencedAt = at
		return at, nil
	}
	must(t, src.Write(fs, "b"))
	prog, err := p.PushFenced(ctx, id, "n2", "", "test", 0, func(replication.Progress) {}, fence)
	if err != nil {
		t.Fatal(err)
	}
	if !lockedDuringFence {
		t.Error("the fence ran without the copy's lock held")
	}
	if prog.FencedAt != fencedAt || fencedAt == 0 {
		t.Errorf("the push reported fence time %d, the fence %d", prog.FencedAt, fencedAt)
	}
	if at, ok := contract.ReplicationSnapshotTime(prog.Snapshot); !ok || at < fencedAt {
		t.Errorf("the final snapshot %s is not named after the fence (%d)", prog.Snapshot, fencedAt)
	}
	if got := dst.content(t, fs); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("the replica holds %v after the fenced push", got)
	}

	received := len(dst.snaps(t, fs))
	must(t, src.Write(fs, "c"))
	refuse := func(context.Context, int64) (int64, error) {
		return 0, errors.New("volume is still mounted")
	}
	if _, err := p.PushFenced(ctx, id, "n2", "", "test", 0, func(replication.Progress) {}, refuse); err == nil || !strings.Contains(err.Error(), "still mounted") {
		t.Errorf("a push whose fence was refused: %v, want the fence's error", err)
	}
	if n := len(dst.snaps(t, fs)); n != received {
		t.Errorf("a push whose fence was refused sent a snapshot (%d, were %d)", n, received)
	}
	// The unsent snapshot goes under the lock, after the answer.
	newest := func() string { snaps := src.snaps(t, fs); return snaps[len(snaps)-1].Name }
	for deadline := time.Now().Add(10 * time.Second); newest() != prog.Snapshot && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := newest(); n != prog.Snapshot {
		t.Errorf("a push whose fence was refused left its snapshot %s", n)
	}
}

// TestAFencedPrimarySendsOnlyToItsMovesTarget: a primary fenced for a
// move (labelled with the node it moves to, as volume.Manager's fence
// labels it) refuses every push but to its move's target (the move's
// catch-up and final pushes), and takes no snapshot for one: every
// snapshot it takes must reach the target, or the replica the move
// demotes it to would hold a snapshot its new primary lacks. Once the
// target is promoted, the source's push is refused and its snapshot goes.
func TestAFencedPrimarySendsOnlyToItsMovesTarget(t *testing.T) {
	src, dst, id, fs := primaryAndPeer(t)
	must(t, src.Write(fs, "a"))
	push := pusherTo(t, src, dst)
	if _, err := push(id); err != nil {
		t.Fatal(err)
	}
	must(t, src.SetProperties(ctx, fs, map[string]string{copyrecord.PropMovingTo: "n2"}))
	before := src.snaps(t, fs)
	if _, err := push(id); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "fenced") {
		t.Fatalf("a fenced primary's push to an unnamed node: %v, want FailedPrecondition naming the fence", err)
	}
	if got := src.snaps(t, fs); len(got) != len(before) {
		t.Errorf("the refused push left snapshots %v, were %v", got, before)
	}
	p := pusherWith(t, src, dst, new(copylock.Locks))
	pushTo := func(fence replication.Fence) error {
		_, err := p.PushFenced(ctx, id, "n2", "n2", "test", 0, func(replication.Progress) {}, fence)
		return err
	}
	if err := pushTo(nil); err != nil {
		t.Errorf("the move's catch-up push to its target: %v", err)
	}
	if err := pushTo(func(_ context.Context, at int64) (int64, error) { return at, nil }); err != nil {
		t.Errorf("the move's final push: %v", err)
	}

	// The target is promoted; a push from the source (a retry that did
	// not see it) is refused (by the plan, which reads the target's
	// state), and leaves no snapshot behind.
	must(t, dst.SetProperties(ctx, fs, map[string]string{copyrecord.PropRole: contract.RolePrimary, copyrecord.PropGeneration: "2"}))
	before = src.snaps(t, fs)
	if err := pushTo(nil); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("a push to a target holding the primary: %v, want FailedPrecondition", err)
	}
	for _, s := range src.snaps(t, fs) { // the earlier push's tidy may prune meanwhile
		if !slices.ContainsFunc(before, func(b zfs.Snap) bool { return b.Name == s.Name }) {
			t.Errorf("the refused push left its snapshot %s", s.Name)
		}
	}
}

// TestAFencedCopyGainsOnlyItsFencesSnapshot: after its fence a primary
// gains one snapshot, the fence's (zn-<fenced_at>): taken by the final
// push, or by the next push when a crash came between the fence and it.
// Every later push to the move's target (a retried final push, a catch-up
// that did not see the fence) sends that one again, or nothing when the
// target holds it. A newer snapshot, were its stream to break or the
// target be promoted first, would be one the demoted source holds and its
// new primary lacks, which every push to that replica would then meet.
func TestAFencedCopyGainsOnlyItsFencesSnapshot(t *testing.T) {
	src, dst, id, fs := primaryAndPeer(t)
	must(t, src.Write(fs, "a"))
	p := pusherWith(t, src, dst, new(copylock.Locks))
	pushTo := func(fence replication.Fence) replication.Progress {
		t.Helper()
		prog, err := p.PushFenced(ctx, id, "n2", "n2", "test", 0, func(replication.Progress) {}, fence)
		if err != nil {
			t.Fatal(err)
		}
		return prog
	}
	pushTo(nil)
	must(t, src.Write(fs, "b"))
	// As volume.Manager.FenceHeld fences: the first fence keeps its time.
	fence := func(ctx context.Context, at int64) (int64, error) {
		v, err := src.s.Property(ctx, fs, copyrecord.PropFencedAt)
		if earlier, ok := copyrecord.FencedAt(v); err == nil && ok {
			return earlier, nil
		}
		return at, src.SetProperties(ctx, fs, map[string]string{copyrecord.PropMovingTo: "n2", copyrecord.PropFencedAt: strconv.FormatInt(at, 10)})
	}
	final := pushTo(fence)
	want := fs + "@" + contract.ReplicationSnapshotName(final.FencedAt)
	if final.Snapshot != want {
		t.Fatalf("the final push sent %s, want the fence's snapshot %s", final.Snapshot, want)
	}
	before := src.snaps(t, fs)
	for _, push := range []struct {
		name  string
		fence replication.Fence
	}{{"a retried final push", fence}, {"a catch-up push", nil}} {
		prog := pushTo(push.fence)
		if prog.Snapshot != want || prog.Bytes != 0 || prog.FencedAt != final.FencedAt && push.fence != nil {
			t.Errorf("%s: %+v, want the fence's snapshot %s, nothing sent", push.name, prog, want)
		}
		for _, s := range src.snaps(t, fs) { // the earlier push's tidy may prune meanwhile
			if !slices.ContainsFunc(before, func(b zfs.Snap) bool { return b.Name == s.Name }) {
				t.Errorf("%s took the snapshot %s after the fence's", push.name, s.Name)
			}
		}
	}
	if snaps := dst.snaps(t, fs); snaps[len(snaps)-1].Name != want {
		t.Errorf("the target's newest snapshot is %s, want the fence's %s", snaps[len(snaps)-1].Name, want)
	}

	// Fenced, its snapshot never taken (a crash between): the next push
	// takes the fence's.
	src, dst, id, fs = primaryAndPeer(t)
	must(t, src.Write(fs, "a"))
	p = pusherWith(t, src, dst, new(copylock.Locks))
	pushTo(nil)
	must(t, src.Write(fs, "b"))
	must(t, src.SetProperties(ctx, fs, map[string]string{copyrecord.PropMovingTo: "n2", copyrecord.PropFencedAt: "777"}))
	if prog := pushTo(nil); prog.Snapshot != fs+"@zn-777" || prog.Bytes == 0 {
		t.Errorf("a push of a copy fenced without its snapshot: %+v, want zn-777 taken and sent", prog)
	}
}

// pusherWith is a Pusher from src to a Receiver on dst, over locks.
func pusherWith(t *testing.T, src, dst node, locks *copylock.Locks) *replication.Pusher {
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	pb.RegisterReplicationServer(srv, &agent.ReplicationServer{Receiver: replication.NewReceiver(dst.s, new(copylock.Locks), nil, "tank/nomad", "n2", 2, hclog.NewNullLogger())})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	dial := func(string) (*grpc.ClientConn, error) {
		return grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	}
	p := replication.NewPusher(src.s, locks, "tank/nomad", "n1", 2, nil, agent.NewReplicationPeers(dial), hclog.NewNullLogger())
	t.Cleanup(p.Close)
	return p
}

// TestReplicasShareABase: every push brings its target the bases of the
// primary's other replicas and the target holds them with their peers'
// tags, so a replica promoted by a failover shares a snapshot with every
// other replica, and its first push to each is an increment. Pushes
// alternate between two replicas, each with a snapshot of its own:
// without the bridges the two replicas share none.
func TestReplicasShareABase(t *testing.T) {
	const id = "vol-0123456789abcdef0123"
	fs := "tank/nomad/" + id
	nodes := map[string]node{"n1": newNode(t, 1, "tank/nomad"), "n2": newNode(t, 2, "tank/nomad"), "n3": newNode(t, 3, "tank/nomad")}
	must(t, nodes["n1"].CreateFilesystem(ctx, fs, map[string]string{copyrecord.PropRole: contract.RolePrimary, copyrecord.PropVolumeID: id,
		copyrecord.PropGeneration: "1", copyrecord.PropName: "v", "refquota": "1000000"}))
	pusher := meshOf(t, nodes)
	push := func(p *replication.Pusher, to string) replication.Progress {
		t.Helper()
		prog, err := p.Push(ctx, id, to, 0, func(replication.Progress) {})
		if err != nil {
			t.Fatalf("push to %s: %v", to, err)
		}
		return prog
	}
	a := pusher("n1")
	for i, to := range []string{"n3", "n2", "n3", "n2"} {
		must(t, nodes["n1"].Write(fs, string(rune('a'+i))))
		push(a, to)
	}
	// n3's base is held on n2 with n3's tag once n2's tidy has run.
	heldFor := func(on, peer string) bool {
		holds, err := nodes[on].s.Holds(ctx, fs)
		must(t, err)
		for _, tags := range holds {
			if slices.Contains(tags, replication.BaseHoldTag+"-"+peer) {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(5 * time.Second); !heldFor("n2", "n3") && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if !heldFor("n2", "n3") {
		t.Fatalf("n2 holds no snapshot with n3's tag: %v", nodes["n2"].snaps(t, fs))
	}

	// n1 is lost; n2's replica, the freshest, is promoted by a failover.
	must(t, nodes["n2"].SetProperties(ctx, fs, map[string]string{copyrecord.PropRole: contract.RolePrimary, copyrecord.PropGeneration: "2", copyrecord.PropHistoryFrom: "2", "readonly": "off"}))
	must(t, nodes["n2"].Write(fs, "e"))
	if prog := push(pusher("n2"), "n3"); prog.Kind != replication.KindIncremental {
		t.Errorf("the promoted replica's first push to the other replica was %s from %q, want an increment", prog.Kind, prog.Base)
	}
	if got, want := nodes["n3"].content(t, fs), nodes["n2"].content(t, fs); !slices.Equal(got, want) {
		t.Errorf("n3's replica holds %v, the new primary %v", got, want)
	}
}

// meshOf serves a Receiver on each node, addressed by its node ID, and
// returns a Pusher from any of them. A node's pusher and receiver share
// its copy locks, as in zfs-node.
func meshOf(t *testing.T, nodes map[string]node) func(from string) *replication.Pusher {
	listeners, locks := map[string]*bufconn.Listener{}, map[string]*copylock.Locks{}
	for id, n := range nodes {
		lis := bufconn.Listen(1 << 20)
		locks[id] = new(copylock.Locks)
		srv := grpc.NewServer()
		pb.RegisterReplicationServer(srv, &agent.ReplicationServer{Receiver: replication.NewReceiver(n.s, locks[id], nil, "tank/nomad", id, 2, hclog.NewNullLogger())})
		go func() { _ = srv.Serve(lis) }()
		t.Cleanup(srv.Stop)
		listeners[id] = lis
	}
	dial := func(addr string) (*grpc.ClientConn, error) {
		lis := listeners[addr]
		return grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	}
	return func(from string) *replication.Pusher {
		p := replication.NewPusher(nodes[from].s, locks[from], "tank/nomad", from, 2, nil, agent.NewReplicationPeers(dial), hclog.NewNullLogger())
		t.Cleanup(p.Close)
		return p
	}
}

// TestCSISnapshotsFollowTheirVolume: every push brings its target the CSI
// snapshots it lacks, those taken before the replica's first full send
// too, each an exact state of the volume; a deleted one (kept by a clone,
// destroyed deferred) stays behind; pruning the replication snapshots
// leaves them alone.
func TestCSISnapshotsFollowTheirVolume(t *testing.T) {
	const id = "vol-0123456789abcdef0123"
	fs := "tank/nomad/" + id
	nodes := map[string]node{"n1": newNode(t, 1, "tank/nomad"), "n2": newNode(t, 2, "tank/nomad")}
	must(t, nodes["n1"].CreateFilesystem(ctx, fs, map[string]string{copyrecord.PropRole: contract.RolePrimary, copyrecord.PropVolumeID: id,
		copyrecord.PropGeneration: "1", copyrecord.PropName: "v", "refquota": "1000000"}))
	push := meshOf(t, nodes)("n1")
	csiSnapshot := func(name string) string {
		t.Helper()
		snap := fs + "@" + contract.SnapshotIDForName(name)
		must(t, nodes["n1"].Snapshot(ctx, snap, map[string]string{copyrecord.PropSnapshotName: name, copyrecord.PropSourceVolume: id}))
		return snap
	}
	pushTo := func(want string) {
		t.Helper()
		prog, err := push.Push(ctx, id, "n2", 0, func(replication.Progress) {})
		if err != nil || prog.Kind != want {
			t.Fatalf("push: %+v, %v; want a %s push", prog, err, want)
		}
	}
	holds := func(snap string) bool {
		t.Helper()
		for _, s := range nodes["n2"].snaps(t, fs) {
			if s.Name == snap {
				if got, want := nodes["n2"].content(t, snap), nodes["n1"].content(t, snap); !slices.Equal(got, want) {
					t.Errorf("the replica's %s holds %v, the primary's %v", snap, got, want)
				}
				return true
			}
		}
		return false
	}

	must(t, nodes["n1"].Write(fs, "a"))
	before := csiSnapshot("before-the-replica")
	must(t, nodes["n1"].Write(fs, "b"))
	pushTo(replication.KindFull)
	if !holds(before) {
		t.Errorf("after the first (full) push the replica lacks %s, taken before it: %v", before, nodes["n2"].snaps(t, fs))
	}

	must(t, nodes["n1"].Write(fs, "c"))
	after := csiSnapshot("after-the-replica")
	must(t, nodes["n1"].Write(fs, "d"))
	deleted := csiSnapshot("deleted")
	must(t, nodes["n1"].Clone(ctx, deleted, "tank/nomad/clone", nil))
	must(t, nodes["n1"].DestroyDeferred(ctx, deleted))
	for range 4 { // more than the replication snapshots kept
		must(t, nodes["n1"].Write(fs, "e"))
		pushTo(replication.KindIncremental)
	}
	if !holds(after) || !holds(before) {
		t.Errorf("after incremental pushes the replica lacks a CSI snapshot: %v", nodes["n2"].snaps(t, fs))
	}
	if holds(deleted) {
		t.Errorf("the replica received %s, deleted on the primary", deleted)
	}
}

// TestAFailedSendSaysWhy: when zfs send fails on the source (a snapshot
// deleted under a push, say), the push answers the send's error, not the
// receiver's complaint about a stream that ended short.
func TestAFailedSendSaysWhy(t *testing.T) {
	src, dst, id, fs := primaryAndPeer(t)
	push := pusherTo(t, src, dst)
	must(t, src.Write(fs, "a"))
	src.Fail = func(op, name string) error {
		if op == "send" {
			return errors.New("the snapshot went away")
		}
		return nil
	}
	_, err := push(id)
	if !errors.Is(err, errdefs.ErrUnavailable) || errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "the snapshot went away") {
		t.Fatalf("a push whose zfs send failed answered %v; want the send's error, Unavailable (retried later)", err)
	}
}

// TestAReplicaKeepsABaseWithItsPrimary: a replica can come to hold a
// snapshot its primary does not count as its base: a bridge that arrived
// before a later stream of the same push failed, or a stream whose answer
// was lost after the replica took it. Pushes to the other replica go on
// and prune the primary's old replication snapshots; the primary spares
// those, so the next push to the replica goes on incrementally from its
// newest. Pruned, it left the replica ahead of its primary at the
// primary's own generation, which refuses every push until the volume's
// next move.
func TestAReplicaKeepsABaseWithItsPrimary(t *testing.T) {
	tests := []struct {
		name string
		// bridge: n3's own stream breaks after n2's new base reached it
		// as a bridge; otherwise n3 takes the push's stream and its
		// answer is lost.
		bridge bool
		// restart: n1's zfs-node restarts after the broken push, and
		// the new process knows nothing of its predecessor's streams.
		restart bool
		// first: the broken push is n3's first, so n1 holds no base of
		// n3's (its stream is a full one).
		first bool
	}{
		{"a bridge arrived before the push's own stream broke", true, false, false},
		{"the push's stream arrived and its answer was lost", false, false, false},
		{"a bridge arrived, then zfs-node restarted", true, true, false},
		{"the answer was lost, then zfs-node restarted", false, true, false},
		{"a full stream's bridge arrived, then zfs-node restarted", true, true, true},
		{"a full stream arrived and its answer was lost, then zfs-node restarted", false, true, true},
		{"a full stream's bridge arrived before its own stream broke", true, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const id = "vol-0123456789abcdef0123"
			fs := "tank/nomad/" + id
			nodes := map[string]node{"n1": newNode(t, 1, "tank/nomad"), "n2": newNode(t, 2, "tank/nomad"), "n3": newNode(t, 3, "tank/nomad")}
			n1, n3 := nodes["n1"], nodes["n3"]
			must(t, n1.CreateFilesystem(ctx, fs, map[string]string{copyrecord.PropRole: contract.RolePrimary, copyrecord.PropVolumeID: id,
				copyrecord.PropGeneration: "1", copyrecord.PropName: "v", "refquota": "1000000"}))
			var sendsOnly atomic.Pointer[string]
			var loseAnswer atomic.Bool
			n1.Fail = func(op, name string) error {
				if only := sendsOnly.Load(); op == "send" && only != nil && name != *only {
					return errors.New("the link to n3 broke")
				}
				return nil
			}
			n3.Fail = func(op, name string) error {
				if op == "get" && strings.Contains(name, "@") && loseAnswer.CompareAndSwap(true, false) {
					return errors.New("the answer was lost")
				}
				return nil
			}
			mesh := meshOf(t, nodes)
			a := mesh("n1")
			pushFrom := func(to string) (replication.Progress, error) {
				t.Helper()
				must(t, n1.Write(fs, to))
				prog, err := a.Push(ctx, id, to, 0, func(replication.Progress) {})
				if err == nil { // a failed push starts no tidy
					tidied(t, n1, fs, to)
				}
				return prog, err
			}
			push := func(to string) error {
				t.Helper()
				_, err := pushFrom(to)
				return err
			}
			must(t, push("n2"))
			if !tt.first {
				must(t, push("n3"))
			}

			if tt.bridge {
				// n2's new base reaches n3 as a bridge; n3's own
				// stream breaks.
				must(t, push("n2"))
				bridge := newest(t, nodes["n2"], fs)
				sendsOnly.Store(&bridge)
				if err := push("n3"); err == nil {
					t.Fatal("the push to n3 succeeded with its stream broken")
				}
				sendsOnly.Store(nil)
			} else {
				loseAnswer.Store(true)
				if err := push("n3"); err == nil {
					t.Fatal("the push to n3 succeeded with its answer lost")
				}
			}
			ahead := newest(t, n3, fs)
			if tt.restart {
				a = mesh("n1")
			}
			for range 4 { // more than the replication snapshots kept
				must(t, push("n2"))
			}
			// n1 spared ahead, so the push goes on from it: nothing n3
			// holds is rolled back. (n3's own tidies may prune ahead
			// after this push, as they prune any base it superseded.)
			prog, err := pushFrom("n3")
			if err != nil {
				t.Fatalf("the push to n3 after n1 pruned: %v\nn1: %v\nn3: %v", err, n1.snaps(t, fs), n3.snaps(t, fs))
			}
			if prog.Kind != replication.KindIncremental || prog.Base != ahead {
				t.Errorf("the push to n3 after n1 pruned was a %s push from %q, not an incremental from %s, which n3 held beyond its base on n1", prog.Kind, prog.Base, ahead)
			}
			if got, want := n3.content(t, fs), n1.content(t, fs); !slices.Equal(got, want) {
				t.Errorf("n3's replica holds %v, the primary %v", got, want)
			}
		})
	}
}

// newest is the name of n's newest snapshot of fs.
func newest(t *testing.T, n node, fs string) string {
	t.Helper()
	snaps := n.snaps(t, fs)
	if len(snaps) == 0 {
		t.Fatalf("no snapshot of %s", fs)
	}
	return snaps[len(snaps)-1].Name
}

// tidied waits until the tidy after a successful push from n to peer
// has run: the newest snapshot of fs is held with the peer's tag (the
// tidy's first step), and then nothing on n's copy of fs changes for two
// samples in a row (its releases and prunes). The hold comes first: a
// tidy whose goroutine has not started yet also leaves the copy still.
func tidied(t *testing.T, n node, fs, peer string) {
	t.Helper()
	tag := copyrecord.PeerBaseTag(peer)
	var last string
	for still, deadline := 0, time.Now().Add(5*time.Second); time.Now().Before(deadline); {
		holds, err := n.Holds(ctx, fs)
		must(t, err)
		now := fmt.Sprint(n.snaps(t, fs), holds)
		switch {
		case !slices.Contains(holds[newest(t, n, fs)], tag):
			still = 0
		case now == last:
			still++
		default:
			still = 1
		}
		if still == 3 {
			return
		}
		last = now
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no tidy after a push to %s: %s's newest snapshot not held with %q, or its snapshots kept changing: %s", peer, fs, tag, last)
}
