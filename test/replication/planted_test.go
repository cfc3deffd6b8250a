package replication

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// TestPlantedGenerationIsRefused, on real ZFS: a peer with a valid node
// certificate sends streams of a living volume (its primary on n1 at
// generation 1, a genuine replica on n2) whose headers claim generation
// 2^48 (replication.MaxGeneration): a new replica on n3, an incremental
// onto n2's replica, a full stream replacing it. Each is refused; n2's
// replica keeps its generation and data and is not set aside; no copy
// anywhere claims the absurd generation; and a move of the volume still
// works, at generation 2 (a planted 2^48 would make every later move use
// 2^48+1, which receivers refuse).
func TestPlantedGenerationIsRefused(t *testing.T) {
	t.Parallel()
	const absurd = 1 << 48
	c := guesttest.StartCluster(t, 3, guestcluster.Options{ControllerArgs: []string{"-schedule-every", "0"}})
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	ctx := context.Background()
	id, target := publishedVolume(t, c, "genuine")
	guesttest.Exec(t, n1, "seq 1 50000 > "+target+"/numbers && sync")
	if _, err := replicate(t, ctx, c, n1, n2, id); err != nil {
		t.Fatal(err)
	}
	before := replicaChecksums(t, n2, id)

	// The liar holds a copy of the genuine data: the streams are real,
	// only the generation lies.
	src := n1.RootDataset + "/" + id
	snaps := strings.Fields(guesttest.Run(t, "zfs", "list", "-H", "-t", "snapshot", "-o", "name", "-s", "createtxg", "-d", "1", src))
	base := snaps[len(snaps)-1]
	guesttest.Exec(t, n1, "echo planted > "+target+"/planted && sync")
	guesttest.Run(t, "zfs", "snapshot", src+"@zn-planted")
	full := zfsSend(t, "-L -c "+src+"@zn-planted")
	incremental := zfsSend(t, "-i "+base+" "+src+"@zn-planted")
	nodeFiles, err := c.CA.Issue("peer", tlsconfig.RoleNode)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		to   *guestcluster.Node
		kind string
		data []byte
	}{
		{"a new replica on n3", n3, "full", full},
		{"an incremental onto n2's replica", n2, "incremental", incremental},
		{"a full stream replacing n2's replica", n2, "full", full},
	} {
		h := &pb.ReceiveHeader{VolumeId: id, VolumeName: "genuine", Kind: tt.kind, Snapshot: "zn-planted", SourceNodeId: "peer", Generation: absurd}
		err := sendStream(ctx, clientAs(t, nodeFiles, tt.to), h, tt.data)
		t.Logf("%s at generation %d: %v", tt.name, uint64(absurd), err)
		switch status.Code(err) {
		case codes.InvalidArgument, codes.FailedPrecondition, codes.PermissionDenied:
		default:
			t.Errorf("%s at generation %d: %v, want it refused (InvalidArgument, FailedPrecondition or PermissionDenied)", tt.name, uint64(absurd), err)
		}
	}
	if cp := copyOf(t, c, n3, id); cp.GetExists() {
		t.Errorf("n3 holds a copy after the planted stream: %+v", cp)
	}
	if cp := copyOf(t, c, n2, id); cp.GetRole() != "replica" || cp.GetGeneration() != 1 {
		t.Errorf("n2's genuine replica after the planted streams: %+v, want a replica at generation 1", cp)
	}
	if after := replicaChecksums(t, n2, id); after != before {
		t.Errorf("n2's replica changed:\n%s\nwas:\n%s", after, before)
	}
	for _, n := range c.Nodes {
		if aside := guesttest.Run(t, "sh", "-c", "zfs list -H -o name -r "+n.RootDataset+" | grep -- "+id+"-aside- || true"); strings.TrimSpace(aside) != "" {
			t.Errorf("%s set a copy aside after the planted streams: %s", n.ID, aside)
		}
	}
	if gens := guesttest.Run(t, "sh", "-c", "zfs get -H -o name,value -t filesystem zfs-nomad:generation | grep "+id+" || true"); strings.Contains(gens, "281474976710656") {
		t.Errorf("a copy claims generation 2^48:\n%s", gens)
	}

	// The volume still moves: to n2, at generation 2.
	unpublish(t, c, id, "genuine")
	ctl := csi.NewControllerClient(guesttest.Dial(t, c.ControllerEndpoint))
	resp, err := guestcluster.Publish(ctx, ctl, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: n2.ID, VolumeCapability: writer}, 2*time.Minute, guestcluster.CatchingUp)
	if err != nil {
		t.Fatalf("moving the volume to n2 after the planted streams: %v", err)
	}
	t.Logf("moved to n2 after the planted streams: publish context %v", resp.GetPublishContext())
	// A publish granted ahead of the move's end answers before the
	// promotion: wait for it.
	var moved *pb.Copy
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if moved = copyOf(t, c, n2, id); moved.GetRole() == "primary" {
			break
		}
	}
	if moved.GetRole() != "primary" || moved.GetGeneration() != 2 {
		t.Errorf("waited a minute after the move's publish for n2's copy to be the primary at generation 2: last %+v", moved)
	}
}

// TestALyingIncrementalLeavesEveryGenuineSnapshot: on real ZFS, a peer
// with a valid node certificate sends n2 an incremental from an older
// snapshot of n2's genuine replica, its header claiming generation 2 and
// a history that vouches for generation 1 (planned moves since): rolled
// back to that base, n2 would lose its later snapshots before zfs receive
// checked a byte. No generation above the replica's was promised on n2
// to that peer, so the stream is refused (FailedPrecondition), whether
// n2 promised generation 2 to no one or to the volume's primary (as a
// move's reservation does): every genuine snapshot stays with its data,
// nothing is set aside, and the primary's next push goes on by an
// increment.
func TestALyingIncrementalLeavesEveryGenuineSnapshot(t *testing.T) {
	t.Parallel()
	c := guesttest.StartCluster(t, 2, guestcluster.Options{ControllerArgs: []string{"-schedule-every", "0"}})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	ctx := context.Background()
	const name = "lied-to"
	id, target := publishedVolume(t, c, name)
	src, replica := n1.RootDataset+"/"+id, n2.RootDataset+"/"+id
	guesttest.Exec(t, n1, "seq 1 50000 > "+target+"/numbers && sync")
	if _, err := replicate(t, ctx, c, n1, n2, id); err != nil {
		t.Fatal(err)
	}
	base := strings.TrimSpace(guesttest.Run(t, "sh", "-c", "zfs list -H -t snapshot -o name -s createtxg -d 1 "+src+" | tail -1"))
	guesttest.Exec(t, n1, "echo genuine-later > "+target+"/later && sync")
	if _, err := replicate(t, ctx, c, n1, n2, id); err != nil {
		t.Fatal(err)
	}
	snapshots := func() string {
		return guesttest.Run(t, "zfs", "list", "-H", "-t", "snapshot", "-o", "name,guid", "-s", "createtxg", "-d", "1", replica)
	}
	genuine := snapshots()
	if n := len(strings.Split(strings.TrimSpace(genuine), "\n")); n < 2 {
		t.Fatalf("n2's replica holds %d snapshot(s) after two pushes, want the base and a later one:\n%s", n, genuine)
	}
	before := replicaChecksums(t, n2, id)

	// The liar holds a copy of the genuine data up to the base: its
	// stream is a real incremental from it; only the header lies.
	guesttest.Run(t, "zfs", "snapshot", src+"@lie")
	lie := zfsSend(t, "-i "+base+" "+src+"@lie")
	nodeFiles, err := c.CA.Issue("peer", tlsconfig.RoleNode)
	if err != nil {
		t.Fatal(err)
	}
	tell := func(when string) {
		t.Helper()
		h := &pb.ReceiveHeader{VolumeId: id, VolumeName: name, Kind: "incremental", Snapshot: "lie", SourceNodeId: "peer", Generation: 2, HistoryFrom: 1}
		err := sendStream(ctx, clientAs(t, nodeFiles, n2), h, lie)
		t.Logf("an incremental from %s claiming generation 2, %s: %v", base, when, err)
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("an incremental from an older snapshot claiming generation 2, %s: %v, want FailedPrecondition", when, err)
		}
		if now := snapshots(); now != genuine {
			t.Errorf("n2's replica holds, after the lie %s:\n%s\nit held:\n%s", when, now, genuine)
		}
		if gen := zfsGet(t, "zfs-nomad:generation", replica); gen != "1" {
			t.Errorf("n2's replica is of generation %s after the lie %s, want 1", gen, when)
		}
		if after := replicaChecksums(t, n2, id); after != before {
			t.Errorf("n2's replica changed after the lie %s:\n%s\nwas:\n%s", when, after, before)
		}
		if aside := guesttest.Run(t, "sh", "-c", "zfs list -H -o name -d 1 "+n2.RootDataset+" | grep -- "+id+"-aside- || true"); strings.TrimSpace(aside) != "" {
			t.Errorf("n2 set a copy aside after the lie %s: %s", when, aside)
		}
	}
	tell("with no generation above the replica's promised on n2")
	// A move of the volume would reserve generation 2 for its target;
	// here the target is the primary itself: a promise, but not to the
	// liar.
	p, err := controllerAgent(t, c, n2).Reserve(ctx, agentclient.Reservation{VolumeID: id, Generation: 2, HolderNodeID: n1.ID})
	if err != nil || !p.Granted {
		t.Fatalf("reserving generation 2 for %s on %s: %+v, %v", n1.ID, n2.ID, p, err)
	}
	tell("with generation 2 promised to " + n1.ID + " on n2")

	guesttest.Exec(t, n1, "echo after-the-lies >> "+target+"/later && sync")
	prog, err := replicate(t, ctx, c, n1, n2, id)
	if err != nil || prog.Kind != "incremental" {
		t.Errorf("the primary's push after the lies: %+v, %v; want an incremental", prog, err)
	}
}

// copyOf asks node n for its copy of the volume.
func copyOf(t *testing.T, c *guestcluster.Cluster, n *guestcluster.Node, id string) *pb.Copy {
	t.Helper()
	cp, err := agent(t, c, n).GetCopy(context.Background(), &pb.GetCopyRequest{VolumeId: id})
	if err != nil {
		t.Fatal(err)
	}
	return cp
}
