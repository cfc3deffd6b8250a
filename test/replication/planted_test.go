package replication

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// TestPlantedGenerationIsRefused: issue 35, defect 4, on real ZFS. A peer
// with a valid node certificate sends streams of a living volume (its
// primary on n1 at generation 1, a genuine replica on n2) whose headers
// claim generation 2^48 (replication.MaxGeneration): a new replica on
// n3, an incremental onto n2's replica, a full stream replacing it.
// Each is refused; n2's replica keeps its generation and data and is
// not set aside; no copy anywhere claims the absurd generation; and a
// move of the volume still works, at generation 2 (a planted 2^48 would
// have made every later move use 2^48+1, which receivers refuse).
func TestPlantedGenerationIsRefused(t *testing.T) {
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

// copyOf asks node n for its copy of the volume.
func copyOf(t *testing.T, c *guestcluster.Cluster, n *guestcluster.Node, id string) *pb.Copy {
	t.Helper()
	cp, err := agent(t, c, n).GetCopy(context.Background(), &pb.GetCopyRequest{VolumeId: id})
	if err != nil {
		t.Fatal(err)
	}
	return cp
}
