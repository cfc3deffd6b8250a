package replication

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// TestStalledHeadersDelayNothing, on real ZFS: a peer with a valid node
// certificate opens receives on n1 and sends only a header, then nothing
// (docs/safety.md, "A receive and the lock"). A header for a primary,
// mounted or not, is refused at once; one for a replica, or for a volume
// n1 lacks, stalls, holding no lock. Meanwhile a stage, a fence, an
// unfence and deletes on n1 each answer within opBound (half of
// copylock.DefaultWait: none of them waited for a lock), and when n1's
// peers go, its self-fence makes the mounted primary read-only within
// L + L/4 + F of their loss ("Why the margin covers the self-fence")
// while the peer keeps sending headers for it.
func TestStalledHeadersDelayNothing(t *testing.T) {
	const lease, margin, opBound = 8 * time.Second, 19 * time.Second, 5 * time.Second
	c := guesttest.StartCluster(t, 3, guestcluster.Options{Lease: lease, NodeArgs: []string{"-lease-margin=" + margin.String()},
		ControllerArgs: []string{"-schedule-every", "0"}})
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	ctx := context.Background()
	mounted, target := publishedVolume(t, c, "mounted")
	idle := createOn(t, c, n1, "idle")
	replicated := createOn(t, c, n2, "replicated")
	if _, err := replicate(t, ctx, c, n2, n1, replicated); err != nil {
		t.Fatal(err)
	}
	nodeFiles, err := c.CA.Issue("peer", tlsconfig.RoleNode)
	if err != nil {
		t.Fatal(err)
	}
	peer := clientAs(t, nodeFiles, n1)
	header := func(id, kind string, generation uint64) *pb.ReceiveHeader {
		return &pb.ReceiveHeader{VolumeId: id, Kind: kind, Snapshot: "zn-stalled", SourceNodeId: "peer", Generation: generation}
	}

	// Into a primary: refused from the header, at once.
	for _, h := range []*pb.ReceiveHeader{header(mounted, "incremental", 1), header(mounted, "full", 2), header(idle, "full", 2)} {
		began := time.Now()
		select {
		case err := <-stall(t, peer, h):
			t.Logf("a stalled %s header for the primary %s: %v after %s", h.GetKind(), h.GetVolumeId(), err, time.Since(began).Round(time.Millisecond))
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "not as a replica") {
				t.Errorf("a %s header for the primary %s: %v, want FailedPrecondition (not a replica)", h.GetKind(), h.GetVolumeId(), err)
			}
		case <-time.After(opBound):
			t.Fatalf("a %s header for the primary %s, then nothing: no answer within %s, want a refusal at once", h.GetKind(), h.GetVolumeId(), opBound)
		}
	}
	// Into the replica, or a volume n1 lacks: the receive waits for the
	// first record, holding no lock.
	stalled := map[string]<-chan error{
		"incremental into the replica": stall(t, peer, header(replicated, "incremental", 1)),
		"full replacing the replica":   stall(t, peer, header(replicated, "full", 2)),
		"full of a new volume":         stall(t, peer, header("vol-0000000000000000beef", "full", 1)),
	}
	time.Sleep(time.Second) // the receiver reads the headers and the copies

	timed := func(what string, call func() error, want codes.Code, says string) {
		t.Helper()
		began := time.Now()
		err := call()
		took := time.Since(began)
		t.Logf("%s beside the stalled streams: %v after %s", what, err, took.Round(time.Millisecond))
		if status.Code(err) != want || !strings.Contains(status.Convert(err).Message(), says) {
			t.Errorf("%s: %v, want %s saying %q", what, err, want, says)
		}
		if took > opBound {
			t.Errorf("%s took %s beside the stalled streams, more than %s", what, took.Round(time.Millisecond), opBound)
		}
	}
	a := agent(t, c, n1)
	timed("staging the mounted primary again", func() error {
		_, err := guesttest.Mount(ctx, t, n1, mounted, "mounted", nil)
		return err
	}, codes.OK, "")
	timed("staging the replica", func() error {
		_, err := guesttest.Mount(ctx, t, n1, replicated, "replicated", nil)
		return err
	}, codes.FailedPrecondition, "replica")
	timed("fencing the mounted primary", func() error {
		_, err := a.Fence(ctx, &pb.FenceRequest{VolumeId: mounted, TargetNodeId: n2.ID})
		return err
	}, codes.FailedPrecondition, "still mounted")
	// A move reserves the target's generation, on the source too, before
	// it fences; a publish back supersedes it before it unfences.
	timed("reserving generation 2 of the idle primary for n2", func() error {
		_, err := a.Reserve(ctx, &pb.ReserveRequest{VolumeId: idle, Generation: 2, HolderNodeId: n2.ID})
		return err
	}, codes.OK, "")
	timed("fencing the idle primary", func() error {
		_, err := a.Fence(ctx, &pb.FenceRequest{VolumeId: idle, TargetNodeId: n2.ID})
		return err
	}, codes.OK, "")
	timed("reserving generation 3 of it for n1", func() error {
		_, err := a.Reserve(ctx, &pb.ReserveRequest{VolumeId: idle, Generation: 3, HolderNodeId: n1.ID})
		return err
	}, codes.OK, "")
	timed("unfencing it", func() error {
		_, err := a.Unfence(ctx, &pb.UnfenceRequest{VolumeId: idle, Generation: 1})
		return err
	}, codes.OK, "")
	timed("deleting the idle primary", func() error {
		_, err := a.DeleteVolume(ctx, &pb.DeleteVolumeRequest{VolumeId: idle})
		return err
	}, codes.OK, "")
	timed("deleting the replica", func() error {
		_, err := a.DeleteReplica(ctx, &pb.DeleteReplicaRequest{VolumeId: replicated})
		return err
	}, codes.OK, "")
	for what, answer := range stalled {
		select {
		case err := <-answer:
			t.Errorf("the stalled stream (%s) ended before the idle timeout: %v; nothing stalled beside the calls above", what, err)
		default:
		}
	}

	// n1's peers go; the peer keeps sending headers for the mounted
	// primary (each refused) while n1's lease runs out.
	probe := func() error {
		_, err := n1.Exec("echo x > " + target + "/probe")
		return err
	}
	if err := probe(); err != nil {
		t.Fatalf("the mounted primary takes no write before n1's peers go: %v", err)
	}
	liarCtx, stopLiar := context.WithCancel(ctx)
	liarDone := make(chan struct{})
	go func() {
		defer close(liarDone)
		for liarCtx.Err() == nil {
			<-stallWith(liarCtx, peer, header(mounted, "incremental", 1))
			time.Sleep(100 * time.Millisecond)
		}
	}()
	defer func() { stopLiar(); <-liarDone }()
	n2.Kill()
	n3.Kill()
	gone := time.Now()
	bound := lease + lease/4 + config.FenceAllowance
	for probe() == nil {
		if time.Since(gone) > 2*bound {
			t.Fatalf("the mounted primary on n1 still took writes %s after its peers went (bound %s)", time.Since(gone).Round(time.Millisecond), bound)
		}
		time.Sleep(100 * time.Millisecond)
	}
	fenced := time.Since(gone)
	t.Logf("lease %s: the mounted primary was read-only %.1f s after n1's peers went, the peer sending headers for it (bound L + L/4 + F = %s)", lease, fenced.Seconds(), bound)
	if out, _ := n1.Exec("echo x > " + target + "/after 2>&1"); !strings.Contains(out, "Read-only file system") {
		t.Errorf("a write after the self-fence failed with %q, want EROFS", out)
	}
	if fenced > bound {
		t.Errorf("the self-fence came %s after n1's peers went, more than L + L/4 + F = %s", fenced.Round(time.Millisecond), bound)
	}
}

// createOn creates a volume on node n and returns its ID.
func createOn(t *testing.T, c *guestcluster.Cluster, n *guestcluster.Node, name string) string {
	t.Helper()
	ctl := csi.NewControllerClient(guesttest.Dial(t, c.ControllerEndpoint))
	resp, err := ctl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{writer},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}, Parameters: map[string]string{"node": n.ID, "compression": "off"}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetVolume().GetVolumeId()
}

// stall opens a receive on peer's node, sends only h and then nothing,
// keeping the stream open until the test ends. The channel gets the
// receiver's answer, if it ever comes.
func stall(t *testing.T, peer pb.ReplicationClient, h *pb.ReceiveHeader) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return stallWith(ctx, peer, h)
}

// stallWith is stall until ctx ends.
func stallWith(ctx context.Context, peer pb.ReplicationClient, h *pb.ReceiveHeader) <-chan error {
	answer := make(chan error, 1)
	stream, err := peer.Receive(ctx)
	if err == nil {
		err = stream.Send(&pb.ReceiveMessage{Msg: &pb.ReceiveMessage_Header{Header: h}})
	}
	if err != nil {
		answer <- err
		return answer
	}
	go func() { answer <- stream.RecvMsg(&pb.ReceiveResult{}) }()
	return answer
}
