// Package replication tests node-to-node replication on real ZFS in the
// guest: full and incremental sends leave the replica with exactly the
// source's files; a receiver killed mid-stream resumes without starting
// over; a node refuses to overwrite a primary.
package replication

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/operator"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/protocol"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/worklease"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// Tests that bound a time (a rate, an idle timeout, a call's answer, a
// fence) run alone, first; the others call t.Parallel and run two at a
// time, each cluster in a slot of its own (guesttest.Options.Slots):
// their assertions are about what ends where, not when, and much of
// their time is waiting (a link kept down past the keepalive, schedules,
// retries) that a second cluster fills. A backup target runs in slot 0
// only: of the two tests that run one, the longer,
// TestBackupsToATarget, runs in parallel, waiting for slot 0 if need be,
// and the other alone.
func TestMain(m *testing.M) {
	os.Exit(guesttest.Main(m, guesttest.Options{
		Disks:    []string{"2G", "2G", "1G", "1G"},
		Slots:    2,
		Binaries: guesttest.DriverBinaries(),
		Memory:   "3G",
		Timeout:  25 * time.Minute,
	}))
}

var writer = guestcluster.MountWriter()

// publishedVolume creates a volume on n1 and mounts it there.
func publishedVolume(t *testing.T, c *guestcluster.Cluster, name string) (id, target string) {
	t.Helper()
	ctx := context.Background()
	n1 := c.Nodes[0]
	ctl := csi.NewControllerClient(guesttest.Dial(t, c.ControllerEndpoint))
	resp, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{writer},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}, Parameters: map[string]string{"node": n1.ID, "compression": "off"}})
	if err != nil {
		t.Fatal(err)
	}
	id = resp.GetVolume().GetVolumeId()
	if target, err = guesttest.Mount(ctx, t, n1, id, name, nil); err != nil {
		t.Fatal(err)
	}
	return id, target
}

// replicatedVolume starts two nodes with opts, publishes a volume named
// name on the first, writes 50000 numbers into it and replicates it to the
// second.
func replicatedVolume(t *testing.T, opts guestcluster.Options, name string) (c *guestcluster.Cluster, id, target string) {
	t.Helper()
	c = guesttest.StartCluster(t, 2, opts)
	n1, n2 := c.Nodes[0], c.Nodes[1]
	id, target = publishedVolume(t, c, name)
	guesttest.Exec(t, n1, "seq 1 50000 > "+target+"/numbers && sync")
	if _, err := replicate(t, context.Background(), c, n1, n2, id); err != nil {
		t.Fatal(err)
	}
	return c, id, target
}

// replicate asks n1's agent to push the volume to n2 and returns the last
// progress report.
func replicate(t *testing.T, ctx context.Context, c *guestcluster.Cluster, from, to *guestcluster.Node, id string) (agentclient.Progress, error) {
	t.Helper()
	return controllerAgent(t, c, from).Replicate(ctx, id, agentclient.Target{Addr: to.AgentAddress, NodeID: to.ID}, "test", nil)
}

// controllerAgent dials a node agent as the operator, through the
// controller's typed client.
func controllerAgent(t *testing.T, c *guestcluster.Cluster, n *guestcluster.Node) *agentclient.Client {
	t.Helper()
	return agentclient.New(guesttest.DialAgent(t, c, n))
}

// agent dials a node agent as the operator.
func agent(t *testing.T, c *guestcluster.Cluster, n *guestcluster.Node) pb.NodeAgentClient {
	t.Helper()
	return pb.NewNodeAgentClient(guesttest.DialAgent(t, c, n))
}

// checksums lists every file's SHA-256 under dir, in node n's namespaces.
func checksums(t *testing.T, n *guestcluster.Node, dir string) string {
	t.Helper()
	return guesttest.Exec(t, n, guesttest.Checksums(dir))
}

// replicaChecksums mounts the replica on n read-only and checksums it.
// A receive into the replica while it is read (the schedule keeps
// pushing) suspends the mounted file system, and a file opened across
// its resume fails with EIO: such a read is tried again.
func replicaChecksums(t *testing.T, n *guestcluster.Node, id string) string {
	t.Helper()
	dir := filepath.Join(n.Dir, "replica-check")
	ds := n.RootDataset + "/" + id
	guesttest.Exec(t, n, "mkdir -p "+dir+" && mount -t zfs -o ro "+ds+" "+dir)
	defer guesttest.Exec(t, n, "umount "+dir)
	var err error
	for range 5 {
		var out string
		if out, err = n.Exec(guesttest.Checksums(dir)); err == nil {
			return out
		}
		time.Sleep(time.Second)
	}
	t.Fatalf("checksumming the replica of %s on %s: %v", id, n.ID, err)
	return ""
}

func zfsGet(t *testing.T, prop, ds string) string {
	return strings.TrimSpace(guesttest.Run(t, "zfs", "get", "-H", "-o", "value", prop, ds))
}

func TestFullThenIncremental(t *testing.T) {
	t.Parallel()
	c := guesttest.StartCluster(t, 2, guestcluster.Options{})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	ctx := context.Background()
	id, target := publishedVolume(t, c, "data")
	guesttest.Exec(t, n1, "cd "+target+" && mkdir -p d/e && echo one > a && seq 1 100000 > d/e/numbers && "+guesttest.RandomFile("blob", 16)+" && sync")

	p, err := replicate(t, ctx, c, n1, n2, id)
	if err != nil {
		t.Fatal(err)
	}
	if p.Kind != "full" || !p.Done || p.Bytes < 16<<20 {
		t.Fatalf("first push: %+v", p)
	}
	replica := n2.RootDataset + "/" + id
	// The replica carries the primary's quota (1 GiB, refquota by
	// default): promoted, it is bounded from its first moment.
	for prop, want := range map[string]string{"zfs-nomad:role": "replica", "readonly": "on", "mountpoint": "legacy", "zfs-nomad:volume_id": id, "zfs-nomad:name": "data",
		"refquota": "1G", "zfs-nomad:history_from": "1"} {
		if got := zfsGet(t, prop, replica); got != want {
			t.Errorf("replica %s = %q, want %q", prop, got, want)
		}
	}
	if src, dst := checksums(t, n1, target), replicaChecksums(t, n2, id); src != dst {
		t.Fatalf("after the full send the replica differs:\nsource:\n%s\nreplica:\n%s", src, dst)
	}

	guesttest.Exec(t, n1, "cd "+target+" && echo two > a && rm d/e/numbers && echo new > d/new && sync")
	p, err = replicate(t, ctx, c, n1, n2, id)
	if err != nil {
		t.Fatal(err)
	}
	if p.Kind != "incremental" || p.Bytes > 4<<20 {
		t.Fatalf("second push: %+v; want a small incremental", p)
	}
	if src, dst := checksums(t, n1, target), replicaChecksums(t, n2, id); src != dst {
		t.Fatalf("after the incremental send the replica differs:\nsource:\n%s\nreplica:\n%s", src, dst)
	}
	// Exactly one snapshot per side carries the base hold: the newest
	// common one. Both sides move their holds after answering, so give
	// them a moment; a hold left on the old base would make this fail.
	newest := strings.TrimSpace(guesttest.Run(t, "sh", "-c", "zfs list -H -t snapshot -o name -s createtxg -d 1 "+replica+" | tail -1"))
	_, newest, _ = strings.Cut(newest, "@")
	for _, ds := range []string{n1.RootDataset + "/" + id, replica} {
		var held string
		for try := 0; try < 50; try++ {
			held = strings.TrimSpace(guesttest.Run(t, "sh", "-c", "zfs list -H -t snapshot -o name -d 1 "+ds+" | xargs zfs holds -H | awk '$2 ~ /^zfs-nomad-base/ {print $1}'"))
			if held == ds+"@"+newest {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if held != ds+"@"+newest {
			t.Errorf("%s: the base tag is held on %q, want %s@%s alone", ds, held, ds, newest)
		}
	}
	// The source's own volume on n1 is refused as a target.
	_, err = replicate(t, ctx, c, n1, n1, id)
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("pushing onto the primary: %v, want FailedPrecondition", err)
	}

	// Deleting the volume removes it and its replica everywhere, held
	// bases and all.
	unpublish(t, c, id, "data")
	if _, err := csi.NewControllerClient(guesttest.Dial(t, c.ControllerEndpoint)).DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		if left, err := guestcluster.DatasetsLeft(n.RootDataset); err != nil || len(left) > 0 {
			t.Errorf("%s holds datasets after the delete: %v %v", n.ID, left, err)
		}
	}
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// unpublish undoes publishedVolume.
func unpublish(t *testing.T, c *guestcluster.Cluster, id, name string) {
	t.Helper()
	n1 := c.Nodes[0]
	node := csi.NewNodeClient(guesttest.Dial(t, n1.CSIEndpoint))
	ctx := context.Background()
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: filepath.Join(n1.Dir, "target-"+name)}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: filepath.Join(n1.Dir, "staging-"+name)}); err != nil {
		t.Fatal(err)
	}
}

// An interrupted transfer resumes from the receiver's token without
// starting over, whatever interrupted it.
func TestResumeAfterInterruption(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// interrupt breaks the transfer; restore undoes what it did.
		interrupt, restore func(t *testing.T, n1, n2 *guestcluster.Node)
		// pruned: the snapshot the resume token names is destroyed on
		// the sender meanwhile; the push must send afresh, not wedge.
		pruned bool
	}{
		{"receiver killed",
			func(t *testing.T, n1, n2 *guestcluster.Node) { n2.Kill() },
			func(t *testing.T, n1, n2 *guestcluster.Node) { mustStart(t, n2) }, false},
		{"sender killed",
			func(t *testing.T, n1, n2 *guestcluster.Node) { n1.Kill() },
			func(t *testing.T, n1, n2 *guestcluster.Node) { mustStart(t, n1) }, false},
		{"link down then up",
			func(t *testing.T, n1, n2 *guestcluster.Node) {
				if err := n1.CutLink(); err != nil {
					t.Fatal(err)
				}
				// Longer than the keepalive detection (about 20 s) on both
				// sides. Waiting only until the receiver saved its resume
				// token was tried (2026-11-23): the resume right after the
				// link returned then failed once in two runs, zfs receive
				// saying "kernel modules must be upgraded to receive this
				// stream"; not understood yet.
				time.Sleep(30 * time.Second)
			},
			func(t *testing.T, n1, n2 *guestcluster.Node) {
				if err := n1.RestoreLink(); err != nil {
					t.Fatal(err)
				}
			}, false},
		{"receiver killed and the snapshot pruned on the sender",
			func(t *testing.T, n1, n2 *guestcluster.Node) { n2.Kill() },
			func(t *testing.T, n1, n2 *guestcluster.Node) { mustStart(t, n2) }, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each case has a cluster of its own
			c := guesttest.StartCluster(t, 2, guestcluster.Options{})
			n1, n2 := c.Nodes[0], c.Nodes[1]
			id, target := publishedVolume(t, c, "big")
			guesttest.Exec(t, n1, guesttest.RandomFile(target+"/big", 200)+" && sync")

			// Interrupt once a quarter of the stream has gone through.
			// Up to about 18 MiB of what was sent can be in flight (the
			// agent port's 16 MiB stream window and its buffers) and is
			// sent again: against 50 MiB sent that leaves the resume its
			// margin; an 80 MiB volume interrupted at 20 was tried, and
			// under load its resume sent 72 MiB.
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			stream, err := agent(t, c, n1).Replicate(ctx, &pb.ReplicateRequest{VolumeId: id, TargetAddress: n2.AgentAddress})
			if err != nil {
				t.Fatal(err)
			}
			var firstBytes int64
			for firstBytes < 50<<20 {
				p, err := stream.Recv()
				if err != nil {
					t.Fatalf("the stream ended before the interruption: %v", err)
				}
				firstBytes = p.GetBytes()
			}
			tc.interrupt(t, n1, n2)
			cancel() // our call to n1 is moot now (and hangs while the link is down)
			tc.restore(t, n1, n2)

			replica := n2.RootDataset + "/" + id
			deadline := time.Now().Add(60 * time.Second)
			for zfsGet(t, "receive_resume_token", replica) == "-" && time.Now().Before(deadline) {
				time.Sleep(500 * time.Millisecond) // zfs receive saves its state once it sees the end of its input
			}
			if zfsGet(t, "receive_resume_token", replica) == "-" {
				t.Fatal("no resume token on the interrupted replica")
			}
			if tc.pruned {
				src := n1.RootDataset + "/" + id
				snaps := strings.Fields(guesttest.Run(t, "zfs", "list", "-H", "-t", "snapshot", "-o", "name", "-d", "1", src))
				for _, s := range snaps {
					// The interrupted push's snapshot, held as the first
					// streamed to n2 (docs/replication.md): an operator
					// releases it to destroy it.
					guesttest.Run(t, "zfs", "release", "zfs-nomad-streamed-"+n2.ID, s)
					guesttest.Run(t, "zfs", "destroy", s)
				}
				p, err := replicate(t, context.Background(), c, n1, n2, id)
				if err != nil {
					t.Fatalf("a push after the token's snapshot was pruned: %v", err)
				}
				if p.Kind == "resume" {
					t.Errorf("resumed from a token whose snapshot is gone: %+v", p)
				}
				if src, dst := checksums(t, n1, target), replicaChecksums(t, n2, id); src != dst {
					t.Fatalf("after sending afresh the replica differs:\nsource:\n%s\nreplica:\n%s", src, dst)
				}
				return
			}
			// The push after the interruption, retried as the schedule
			// retries one while a returning link's first connects fail
			// (no route to host until the neighbour answers again).
			var p agentclient.Progress
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Second) {
				p, err = replicate(t, context.Background(), c, n1, n2, id)
				if !errors.Is(err, errdefs.ErrUnavailable) || time.Now().After(deadline) {
					break
				}
				t.Logf("the push after the interruption: %v; retrying", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d MiB sent before the interruption, %d MiB by the resumed push, of a 200 MiB volume", tc.name, firstBytes>>20, p.Bytes>>20)
			if p.Kind != "resume" || p.Bytes > 200<<20-firstBytes/2 {
				t.Errorf("resumed push: %+v; want kind resume, sending well under the whole 200 MiB again", p)
			}
			if src, dst := checksums(t, n1, target), replicaChecksums(t, n2, id); src != dst {
				t.Fatalf("after resuming the replica differs:\nsource:\n%s\nreplica:\n%s", src, dst)
			}
		})
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

func mustStart(t *testing.T, n *guestcluster.Node) {
	t.Helper()
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
}

func TestRefusesStrangersAndBadStreams(t *testing.T) {
	t.Parallel()
	c, id, target := replicatedVolume(t, guestcluster.Options{}, "guarded")
	n1, n2 := c.Nodes[0], c.Nodes[1]
	ctx := context.Background()
	before := replicaChecksums(t, n2, id)

	// No client certificate at all: the TLS handshake fails.
	plain := pb.NewReplicationClient(guesttest.Dial(t, n2.AgentAddress))
	if _, err := plain.ReplicaState(ctx, &pb.ReplicaStateRequest{VolumeId: id}); status.Code(err) != codes.Unavailable {
		t.Errorf("plaintext call: %v, want refused (Unavailable)", err)
	}
	// A certificate from another CA.
	otherCA, err := tlsconfig.NewCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	stranger, _ := otherCA.Issue("stranger", tlsconfig.RoleNode)
	if _, err := clientAs(t, stranger, n2).ReplicaState(ctx, &pb.ReplicaStateRequest{VolumeId: id}); err == nil {
		t.Error("a certificate from another CA was accepted")
	}
	// Right CA, wrong role: an operator may not feed streams, a node may not
	// order pushes.
	if _, err := clientAs(t, c.Operator, n2).ReplicaState(ctx, &pb.ReplicaStateRequest{VolumeId: id}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("operator calling Replication: %v, want PermissionDenied", err)
	}
	nodeFiles, _ := c.CA.Issue("peer", tlsconfig.RoleNode)
	conn := dialWith(t, nodeFiles, n1)
	if _, err := replicateOn(ctx, pb.NewNodeAgentClient(conn), id, n2.AgentAddress); status.Code(err) != codes.PermissionDenied {
		t.Errorf("node certificate ordering a push: %v, want PermissionDenied", err)
	}

	// A node of another agent protocol, or of a build without one: refused
	// before any handler runs, naming the node (package protocol).
	for _, sent := range []string{"", strconv.Itoa(protocol.Version + 1)} {
		conn := dialUnversioned(t, nodeFiles, n2)
		callCtx := ctx
		if sent != "" {
			callCtx = metadata.AppendToOutgoingContext(ctx, protocol.Header, sent)
		}
		_, err := pb.NewReplicationClient(conn).ReplicaState(callCtx, &pb.ReplicaStateRequest{VolumeId: id})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "node "+n2.ID+" accepts agent protocol") {
			t.Errorf("a call of agent protocol %q: %v, want FailedPrecondition naming node %s", sent, err, n2.ID)
		}
		err = sendStream(callCtx, pb.NewReplicationClient(conn), &pb.ReceiveHeader{VolumeId: id, Kind: "incremental", Snapshot: "x", SourceNodeId: "peer", Generation: 1}, nil)
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("a stream of agent protocol %q: %v, want FailedPrecondition", sent, err)
		}
	}

	// A corrupted and a truncated incremental stream are refused and the
	// replica keeps its data.
	peer := clientAs(t, nodeFiles, n2)
	guesttest.Exec(t, n1, "echo more >> "+target+"/numbers && sync")
	src := n1.RootDataset + "/" + id
	snaps := strings.Fields(guesttest.Run(t, "zfs", "list", "-H", "-t", "snapshot", "-o", "name", "-s", "createtxg", "-d", "1", src))
	base := snaps[len(snaps)-1]
	guesttest.Run(t, "zfs", "snapshot", src+"@manual")
	real := zfsSend(t, "-i "+base+" "+src+"@manual")
	// A node may not claim to be another: the header's source must be
	// the node its certificate names.
	err = sendStream(ctx, peer, &pb.ReceiveHeader{VolumeId: id, Kind: "incremental", Snapshot: "manual", SourceNodeId: n1.ID, Generation: 1}, real)
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("a stream claiming to come from %s, sent with the certificate of \"peer\": %v, want PermissionDenied", n1.ID, err)
	}
	// zfs send -p: the stream carries the source's properties, which a
	// lying peer would choose (a mountpoint over /etc, setuid, the
	// driver's own labels).
	withProps := zfsSend(t, "-p -i "+base+" "+src+"@manual")
	for name, tt := range map[string]struct {
		data    []byte
		want    codes.Code
		says    string
		partial bool // zfs receive saw some of it and may keep a resume token
	}{
		// Refused by the receiver from the stream's first record, before
		// zfs receive sees a byte (the receive started early for an
		// incremental is abandoned unfed: it must leave no trace).
		"not a stream":        {append([]byte("this is not a zfs stream"), make([]byte, 4096)...), codes.InvalidArgument, "not a zfs send stream", false},
		"carrying properties": {withProps, codes.InvalidArgument, "carries properties", false},
		// A valid first record: the rest reaches zfs receive, which must
		// refuse it.
		"corrupted": {append(real[:312:312], make([]byte, 4096)...), codes.Aborted, "receiving volume", true},
		"truncated": {real[:len(real)/2], codes.Aborted, "receiving volume", true},
	} {
		err := sendStream(ctx, peer, &pb.ReceiveHeader{VolumeId: id, Kind: "incremental", Snapshot: "manual", SourceNodeId: "peer", Generation: 1}, tt.data)
		if status.Code(err) != tt.want || !strings.Contains(err.Error(), tt.says) {
			t.Errorf("%s stream: %v, want %s saying %q", name, err, tt.want, tt.says)
		}
		if mp := zfsGet(t, "mountpoint", n2.RootDataset+"/"+id); mp != "legacy" {
			t.Errorf("after the %s stream the replica's mountpoint is %s", name, mp)
		}
		if zfsGet(t, "receive_resume_token", n2.RootDataset+"/"+id) != "-" {
			if !tt.partial {
				t.Errorf("after the %s stream, refused before zfs receive saw a byte, the replica holds a partial receive", name)
			}
			guesttest.Run(t, "zfs", "receive", "-A", n2.RootDataset+"/"+id) // the deliberate clean-up of a partial state
		}
		if after := replicaChecksums(t, n2, id); after != before {
			t.Errorf("after the %s stream the replica changed:\n%s\nwas:\n%s", name, after, before)
		}
	}
	// A generation near 2^64 would make the next promotion overflow, and
	// generation 0 is none at all.
	for _, gen := range []uint64{1<<64 - 1, 0} {
		err := sendStream(ctx, peer, &pb.ReceiveHeader{VolumeId: id, Kind: "incremental", Snapshot: "manual", SourceNodeId: "peer", Generation: gen}, real)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("a stream of generation %d: %v, want InvalidArgument", gen, err)
		}
	}
	if gen := zfsGet(t, "zfs-nomad:generation", n2.RootDataset+"/"+id); gen != "1" {
		t.Errorf("after the lying headers the replica's generation is %s, want 1", gen)
	}
	// A header naming something that is not a volume ID never reaches ZFS.
	err = sendStream(ctx, peer, &pb.ReceiveHeader{VolumeId: "../../etc", Kind: "full", Snapshot: "x"}, []byte("x"))
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("escaping volume ID: %v, want InvalidArgument", err)
	}
}

// TestBrokenReplaceKeepsTheReplica: a full stream of a newer generation
// that breaks midway leaves the existing replica as it was; a whole one
// takes its place, and the old replica is set aside, not destroyed.
func TestBrokenReplaceKeepsTheReplica(t *testing.T) {
	t.Parallel()
	c, id, _ := replicatedVolume(t, guestcluster.Options{}, "replaced")
	n1, n2 := c.Nodes[0], c.Nodes[1]
	ctx := context.Background()
	replica := n2.RootDataset + "/" + id
	before := replicaChecksums(t, n2, id)
	oldGUIDs := guesttest.Run(t, "zfs", "list", "-H", "-t", "snapshot", "-o", "guid", "-d", "1", replica)

	// A full stream of generation 2 with other data, as a new primary
	// promoted from another copy would send.
	other := n1.RootDataset + "/other"
	guesttest.Run(t, "zfs", "create", other)
	guesttest.Run(t, "sh", "-c", "zfs set mountpoint=none "+other+" && zfs snapshot "+other+"@zn-new")
	full := zfsSend(t, "-L -c "+other+"@zn-new")
	nodeFiles, _ := c.CA.Issue("peer", tlsconfig.RoleNode)
	peer := clientAs(t, nodeFiles, n2)
	h := &pb.ReceiveHeader{VolumeId: id, Kind: "full", Snapshot: "zn-new", SourceNodeId: "peer", Generation: 2}

	err := sendStream(ctx, peer, h, full[:len(full)/2])
	if status.Code(err) != codes.Aborted {
		t.Fatalf("a full stream broken midway: %v, want Aborted", err)
	}
	if gen := zfsGet(t, "zfs-nomad:generation", replica); gen != "1" {
		t.Errorf("after a broken replacement the replica is of generation %s, want 1", gen)
	}
	if after := replicaChecksums(t, n2, id); after != before {
		t.Errorf("after a broken replacement the replica changed:\n%s\nwas:\n%s", after, before)
	}
	if list := guesttest.Run(t, "zfs", "list", "-H", "-o", "name", "-r", n2.RootDataset); strings.Contains(list, "-incoming") {
		t.Errorf("the broken replacement was left behind:\n%s", list)
	}

	if err := sendStream(ctx, peer, h, full); err != nil {
		t.Fatalf("the whole full stream: %v", err)
	}
	if gen := zfsGet(t, "zfs-nomad:generation", replica); gen != "2" {
		t.Errorf("after the replacement the replica is of generation %s, want 2", gen)
	}
	aside := strings.Fields(guesttest.Run(t, "sh", "-c", "zfs list -H -o name -d 1 "+n2.RootDataset+" | grep -- "+id+"-aside- || true"))
	if len(aside) != 1 {
		t.Fatalf("set aside: %v, want the old replica", aside)
	}
	if role := zfsGet(t, "zfs-nomad:role", aside[0]); role != "set-aside" {
		t.Errorf("%s has role %s, want set-aside", aside[0], role)
	}
	if guids := guesttest.Run(t, "zfs", "list", "-H", "-t", "snapshot", "-o", "guid", "-d", "1", aside[0]); guids != oldGUIDs {
		t.Errorf("the copy set aside has snapshots %q, the old replica had %q", guids, oldGUIDs)
	}
}

// zfsSend runs zfs send with args in the guest and returns the stream.
func zfsSend(t *testing.T, args string) []byte {
	t.Helper()
	out := guesttest.Run(t, "sh", "-c", "zfs send "+args+" | base64 -w0")
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(out))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// dialWith connects to n's agent port with the certificate f, as a build
// of this one's agent protocol.
func dialWith(t *testing.T, f tlsconfig.Files, n *guestcluster.Node) *grpc.ClientConn {
	t.Helper()
	return dialUnversioned(t, f, n, protocol.DialOptions()...)
}

// dialUnversioned is dialWith for a build without agent protocol versions.
func dialUnversioned(t *testing.T, f tlsconfig.Files, n *guestcluster.Node, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	m, err := tlsconfig.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(n.AgentAddress, append(opts, grpc.WithTransportCredentials(m.ClientCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func clientAs(t *testing.T, f tlsconfig.Files, n *guestcluster.Node) pb.ReplicationClient {
	return pb.NewReplicationClient(dialWith(t, f, n))
}

func replicateOn(ctx context.Context, a pb.NodeAgentClient, id, to string) (*pb.ReplicateProgress, error) {
	stream, err := a.Replicate(ctx, &pb.ReplicateRequest{VolumeId: id, TargetAddress: to})
	if err != nil {
		return nil, err
	}
	return stream.Recv()
}

func sendStream(ctx context.Context, peer pb.ReplicationClient, h *pb.ReceiveHeader, data []byte) error {
	stream, err := peer.Receive(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&pb.ReceiveMessage{Msg: &pb.ReceiveMessage_Header{Header: h}}); err != nil {
		_, rerr := stream.CloseAndRecv() // io.EOF: the server's answer is there
		return rerr
	}
	if err := stream.Send(&pb.ReceiveMessage{Msg: &pb.ReceiveMessage_Data{Data: data}}); err != nil {
		_, rerr := stream.CloseAndRecv()
		return rerr
	}
	_, err = stream.CloseAndRecv()
	return err
}

// The operator's commands: backup with live progress, then status with
// the replica and its lag.
// exitOf runs a command and returns its output and exit status.
func exitOf(name string, args ...string) (string, int) {
	out, err := exec.Command(name, args...).CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return string(out), exit.ExitCode()
	}
	if err != nil {
		return err.Error(), -1
	}
	return string(out), 0
}

// waitForWorkLease waits until the nodes grant a controller instance the
// work lease, as status reports it: until then status exits 5 (nothing
// runs the schedules), and a node grants it to nobody in its first
// worklease.Term.
func waitForWorkLease(t *testing.T, ctl string, args []string) {
	t.Helper()
	var out []byte
	for deadline := time.Now().Add(2*worklease.Term + 10*time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		out, _ = exec.Command(ctl, append([]string{"status", "-json"}, args...)...).Output()
		var report operator.Report
		if json.Unmarshal(out, &report) == nil {
			for _, c := range report.Controllers {
				if c.HoldsWorkLease {
					return
				}
			}
		}
	}
	t.Fatalf("no controller instance held the work lease within %s of the nodes' start; status -json said:\n%s", 2*worklease.Term+10*time.Second, out)
}

func TestBackupAndStatusCommands(t *testing.T) {
	t.Parallel()
	c := guesttest.StartCluster(t, 3, guestcluster.Options{})
	n1 := c.Nodes[0]
	id, target := publishedVolume(t, c, "orders")
	guesttest.Exec(t, n1, guesttest.RandomFile(target+"/data", 40)+" && sync")

	peers := c.AgentAddresses()
	ctl := filepath.Join(guesttest.BinDir(t), "zfs-controller")
	args := []string{"-peers", strings.Join(peers, ","), "-tls-ca", c.Operator.CA, "-tls-cert", c.Operator.Cert, "-tls-key", c.Operator.Key}

	out := guesttest.Run(t, ctl, append(append([]string{"backup"}, args...), "-to", "n3", id)...)
	t.Logf("backup:\n%s", out)
	if !strings.Contains(out, "from n1 to n3") || !strings.Contains(out, "done: full") || !strings.Contains(out, "MiB") {
		t.Errorf("backup output lacks the route, progress or completion:\n%s", out)
	}
	// Without -to, the node that already holds a replica is chosen again;
	// the volume named by the name it was created with.
	out = guesttest.Run(t, ctl, append(append([]string{"backup"}, args...), "orders")...)
	if !strings.Contains(out, "to n3") || !strings.Contains(out, "done: incremental") || !strings.Contains(out, "volume "+id+`: the volume named "orders"`) {
		t.Errorf("second backup, by name, did not resolve it or go incrementally to n3:\n%s", out)
	}
	waitForWorkLease(t, ctl, args)
	// The one instance holds it, and its gauges say so (the alert on a
	// cluster whose schedules run nowhere reads them).
	if m := scrape(t, c.ControllerMetrics); !strings.Contains(m, "\nzfs_nomad_work_lease_held 1\n") || strings.Contains(m, "\nzfs_nomad_work_lease_held_since_timestamp_seconds 0\n") {
		t.Errorf("the holder's metrics lack zfs_nomad_work_lease_held 1 and the holding's start:\n%s", m)
	}
	out = guesttest.Run(t, ctl, append([]string{"status"}, args...)...)
	t.Logf("status:\n%s", out)
	var primary, replica bool
	for _, line := range strings.Split(out, "\n") {
		primary = primary || strings.Contains(line, id) && strings.Contains(line, "n1") && strings.Contains(line, "primary")
		replica = replica || strings.Contains(line, id) && strings.Contains(line, "n3") && strings.Contains(line, "replica") && strings.Contains(line, "zn-")
	}
	if !primary || !replica {
		t.Errorf("status lacks the primary on n1 or the replica on n3:\n%s", out)
	}
	for _, n := range c.Nodes { // the node view: no lease (no peers), a week's certificate
		if !regexp.MustCompile(n.ID + ` +` + regexp.QuoteMeta(n.AgentAddress) + ` +ok +\S+ +2\.\d+\.\d+\S* +[0-9.]+ [KMG]iB +\d+ +none +[67]d left`).MatchString(out) {
			t.Errorf("status lacks the line of node %s:\n%s", n.ID, out)
		}
	}
	// stdout only: a script reads the report there, the logs go to stderr.
	jsonOut, err := exec.Command(ctl, append([]string{"status", "-json"}, args...)...).Output()
	var report operator.Report
	if err == nil {
		err = json.Unmarshal(jsonOut, &report)
	}
	if err != nil {
		t.Fatalf("status -json: %v\n%s", err, jsonOut)
	}
	roles := map[string]string{}
	for _, c := range report.Copies {
		if c.VolumeID == id {
			roles[c.Node] = c.Role
		}
	}
	if roles["n1"] != "primary" || roles["n3"] != "replica" || len(report.Unreachable) != 0 {
		t.Errorf("status -json: copies of %s %v, unreachable %v; want the primary on n1, the replica on n3, every node answering", id, roles, report.Unreachable)
	}
	if report.SchemaVersion != operator.SchemaVersion || len(report.Nodes) != 3 {
		t.Errorf("status -json: schema %d, %d nodes; want %d and 3", report.SchemaVersion, len(report.Nodes), operator.SchemaVersion)
	}
	for _, n := range report.Nodes {
		if !n.Reachable || !n.Healthy || n.OpenZFSVersion == "" || n.DriverVersion == "" || n.CertificateExpires == "" || n.Lease != "none" || n.AvailableBytes == 0 {
			t.Errorf("status -json: node %+v; want it reachable, healthy, with versions, room, no lease and its certificate's expiry", n)
		}
	}
	// Without an operator certificate the command is refused.
	nodeFiles, _ := c.CA.Issue("not-an-operator", tlsconfig.RoleNode)
	bad := []string{"-peers", strings.Join(peers, ","), "-tls-ca", nodeFiles.CA, "-tls-cert", nodeFiles.Cert, "-tls-key", nodeFiles.Key}
	if out, err := guestcluster.Run(ctl, append(append([]string{"backup"}, bad...), id)...); err == nil {
		t.Errorf("backup with a node certificate succeeded:\n%s", out)
	}

	// Deleting the volume while n3 is down is refused, naming n3: its
	// copy would outlive a delete that said it was gone. Nothing is
	// touched.
	n3 := c.Nodes[2]
	unpublish(t, c, id, "orders")
	n3.Kill()
	_, err = csi.NewControllerClient(guesttest.Dial(t, c.ControllerEndpoint)).DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: id})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), n3.AgentAddress) {
		t.Fatalf("delete with n3 down: %v, want Unavailable naming %s", err, n3.AgentAddress)
	}
	if got := zfsGet(t, "zfs-nomad:role", n1.RootDataset+"/"+id); got != "primary" {
		t.Fatalf("the primary on n1 after a refused delete: role %q", got)
	}
	// status exits 3 with a node down, saying why in a sentence.
	out, code := exitOf(ctl, append([]string{"status"}, args...)...)
	if code != operator.ExitDegraded || !strings.Contains(out, n3.AgentAddress+" (connection refused)") || strings.Contains(out, "desc =") {
		t.Errorf("status with n3 down: exit %d; want %d and one sentence on %s:\n%s", code, operator.ExitDegraded, n3.AgentAddress, out)
	}
	// An operator who gave n3 up deletes the primary by hand; n3 comes
	// back with its replica, which the operator removes, and must insist,
	// as it may be a last copy.
	if _, err := agent(t, c, n1).DeleteVolume(context.Background(), &pb.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
	mustStart(t, n3)
	left := n3.RootDataset + "/" + id
	if got := zfsGet(t, "zfs-nomad:role", left); got != "replica" {
		t.Fatalf("n3's replica after a delete it missed: role %q", got)
	}
	// With only the replica left, status exits 4: no healthy primary.
	out, code = exitOf(ctl, append([]string{"status"}, args...)...)
	if code != operator.ExitNoPrimary || !strings.Contains(out, "without a healthy primary: "+id) {
		t.Errorf("status with only a replica of %s: exit %d, want %d:\n%s", id, code, operator.ExitNoPrimary, out)
	}
	if out, err := guestcluster.Run(ctl, append(append([]string{"remove-replica"}, args...), "-node", "n3", id)...); err == nil || !strings.Contains(out, "may be its last copy") {
		t.Errorf("remove-replica without -force: %v\n%s", err, out)
	}
	out = guesttest.Run(t, ctl, append(append([]string{"remove-replica"}, args...), "-node", "n3", "-force", "orders")...)
	if !strings.Contains(out, "removed the replica") || !strings.Contains(out, `the volume named "orders"`) {
		t.Errorf("remove-replica -force, by name: %s", out)
	}
	if _, err := guestcluster.Run("zfs", "list", left); err == nil {
		t.Errorf("%s still exists", left)
	}
}

// The controller's schedule keeps the asked-for replicas on other nodes
// current, and old replication snapshots are pruned on both sides.
func TestScheduleKeepsReplicasCurrent(t *testing.T) {
	t.Parallel()
	c := guesttest.StartCluster(t, 3, guestcluster.Options{
		NodeArgs:       []string{"-min-replication-interval", "1s", "-replication-snapshots", "2"},
		ControllerArgs: []string{"-schedule-every", "1s"},
	})
	n1 := c.Nodes[0]
	ctx := context.Background()
	ctl := csi.NewControllerClient(guesttest.Dial(t, c.ControllerEndpoint))
	// Above the operator's limit is refused.
	_, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "greedy", VolumeCapabilities: []*csi.VolumeCapability{writer},
		Parameters: map[string]string{"replicas": "5"}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("5 replicas (max 2): %v, want InvalidArgument", err)
	}
	resp, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "kept", VolumeCapabilities: []*csi.VolumeCapability{writer},
		Parameters: map[string]string{"node": n1.ID, "replicas": "2", "replication_interval": "2s"}})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()

	// waitForReplicas waits until both other nodes hold a replica newer than since.
	waitForReplicas := func(since time.Time) {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for time.Now().Before(deadline) {
			fresh := 0
			for _, n := range c.Nodes[1:] {
				st, err := agent(t, c, n).Status(ctx, &pb.StatusRequest{})
				if err != nil {
					continue
				}
				for _, r := range st.GetReplicas() {
					if r.GetVolumeId() == id && !r.GetResumable() && time.Unix(r.GetLastSnapshotUnix(), 0).After(since) {
						fresh++
					}
				}
			}
			if fresh == 2 {
				return
			}
			time.Sleep(time.Second)
		}
		t.Fatalf("replicas of %s on n2 and n3 not newer than %s within 90s", id, since.Format(time.TimeOnly))
	}
	waitForReplicas(time.Time{})

	// Data written now reaches both replicas within a few intervals.
	target, err := guesttest.Mount(ctx, t, n1, id, "kept", nil)
	if err != nil {
		t.Fatal(err)
	}
	guesttest.Exec(t, n1, "seq 1 30000 > "+target+"/log && sync")
	written := time.Now().Add(time.Second) // snapshot times have one-second resolution
	time.Sleep(time.Until(written))
	waitForReplicas(written)
	for _, n := range c.Nodes[1:] {
		if src, dst := checksums(t, n1, target), replicaChecksums(t, n, id); src != dst {
			t.Errorf("replica on %s differs:\nsource:\n%s\nreplica:\n%s", n.ID, src, dst)
		}
	}
	// Metrics: lag per replica and pushes on the controller, bytes on the
	// node. The controller records a round's gauges and a push's count
	// once they end, which may be a moment after the replica is fresh: it
	// is scraped until they show, for two rounds at most.
	wantCtl := []string{
		`zfs_nomad_replica_lag_seconds{node="n2",volume_id="` + id + `"}`,
		`zfs_nomad_replica_lag_seconds{node="n3",volume_id="` + id + `"}`,
		`zfs_nomad_replicas_missing{volume_id="` + id + `"} 0`,
		`zfs_nomad_replication_interval_seconds{volume_id="` + id + `"} 2`,
		`zfs_nomad_scheduled_pushes_total{result="success"}`,
		`zfs_nomad_csi_call_seconds_count{code="OK",method="CreateVolume"} `,
	}
	ctlMetrics := scrape(t, c.ControllerMetrics)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && !containsAll(ctlMetrics, wantCtl); time.Sleep(time.Second) {
		ctlMetrics = scrape(t, c.ControllerMetrics)
	}
	for _, want := range wantCtl {
		if !strings.Contains(ctlMetrics, want) {
			t.Errorf("controller metrics lack %s after 30 s:\n%s", want, ctlMetrics)
		}
	}
	n1Metrics := scrape(t, n1.Metrics)
	for _, want := range []string{`zfs_nomad_replication_sent_bytes_total{peer_node="n2"}`, `zfs_nomad_replication_transfer_seconds_count{direction="out",kind="full",result="success"}`,
		"\nzfs_nomad_root_dataset_used_bytes ", "\nzfs_nomad_root_dataset_available_bytes ", "\nzfs_nomad_pool_size_bytes ", "\nzfs_nomad_pool_free_bytes ", `zfs_nomad_build_info{agent_protocol="1",openzfs_built_for="2.`, "\ngo_goroutines ",
		`zfs_nomad_agent_call_seconds_count{code="OK",method="GetNode"} `,
		`zfs_nomad_volume_quota_bytes{volume_id="` + id + `",volume_name="kept"} `, `zfs_nomad_volume_used_bytes{volume_id="` + id + `",volume_name="kept"} `} {
		if !strings.Contains(n1Metrics, want) {
			t.Errorf("node metrics lack %s:\n%s", want, n1Metrics)
		}
	}
	if m := scrape(t, c.Nodes[1].Metrics); strings.Contains(m, `zfs_nomad_volume_used_bytes{volume_id="`+id+`"`) {
		t.Errorf("n2, which holds only a replica of %s, exports its used bytes:\n%s", id, m)
	}

	// Retention: each side keeps at most 2 unheld replication snapshots
	// plus the held bases (one per peer on the source).
	// Pruning runs right after each push, so a node may briefly hold one
	// more: the bound must hold at some moment within a few rounds, and
	// the count must never run away.
	time.Sleep(5 * time.Second) // a few more rounds
	for _, n := range c.Nodes {
		var count int
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
			out := guesttest.Run(t, "sh", "-c", "zfs list -H -t snapshot -o name -d 1 "+n.RootDataset+"/"+id+" | grep -c @zn- || true")
			if count, _ = strconv.Atoi(strings.TrimSpace(out)); count <= 4 {
				break
			}
		}
		if count > 4 {
			t.Errorf("%s keeps %d replication snapshots; want at most 4", n.ID, count)
		}
	}
}

// A node's replication bandwidth cap holds.
func TestBandwidthLimit(t *testing.T) {
	c := guesttest.StartCluster(t, 2, guestcluster.Options{NodeArgs: []string{"-replication-bandwidth", "8M"}})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	id, target := publishedVolume(t, c, "capped")
	guesttest.Exec(t, n1, guesttest.RandomFile(target+"/data", 24)+" && sync")
	start := time.Now()
	p, err := replicate(t, context.Background(), c, n1, n2, id)
	if err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	rate := float64(p.Bytes) / elapsed.Seconds() / (1 << 20)
	t.Logf("%d MiB in %s: %.1f MiB/s under a cap of 8 MiB/s", p.Bytes>>20, elapsed.Round(time.Millisecond), rate)
	if rate > 8.5 {
		t.Errorf("sent at %.1f MiB/s, above the 8 MiB/s cap", rate)
	}
}

// An encrypted volume is sent raw: the replica stays encrypted and its
// node needs no key; with the key it holds the source's files.
func TestEncryptedVolumeStaysEncrypted(t *testing.T) {
	t.Parallel()
	c := guesttest.StartCluster(t, 2, guestcluster.Options{EncryptedRoots: true})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	id, target := publishedVolume(t, c, "secret")
	guesttest.Exec(t, n1, "seq 1 20000 > "+target+"/ledger && sync")
	if enc := zfsGet(t, "encryption", n1.RootDataset+"/"+id); enc == "off" {
		t.Fatalf("the volume on an encrypted root is not encrypted")
	}
	// The receiving node does not have the key loaded for the replica.
	p, err := replicate(t, context.Background(), c, n1, n2, id)
	if err != nil {
		t.Fatal(err)
	}
	replica := n2.RootDataset + "/" + id
	if enc, ks := zfsGet(t, "encryption", replica), zfsGet(t, "keystatus", replica); enc == "off" || ks != "unavailable" {
		t.Fatalf("replica encryption=%s keystatus=%s after a %s send; want encrypted, key not loaded", enc, ks, p.Kind)
	}
	guesttest.Run(t, "zfs", "load-key", "-L", "file://"+guestcluster.KeyFile(c.Dir()), replica)
	if src, dst := checksums(t, n1, target), replicaChecksums(t, n2, id); src != dst {
		t.Fatalf("decrypted replica differs:\nsource:\n%s\nreplica:\n%s", src, dst)
	}
}

// TestDeleteRacesTidies deletes volumes the moment a push answers, and at
// delays that land during and after the sender's tidy and the
// receiver's (which waits a second after a receive). Nodes keep one
// replication snapshot besides the bases, so every tidy prunes: the
// delete meets snapshots that a tidy holds, releases and destroys under
// it. Every delete must answer OK and leave nothing of the volume on
// either node.
func TestDeleteRacesTidies(t *testing.T) {
	t.Parallel()
	c := guesttest.StartCluster(t, 2, guestcluster.Options{NodeArgs: []string{"-replication-snapshots", "1"}})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	ctx := context.Background()
	ctl := csi.NewControllerClient(guesttest.Dial(t, c.ControllerEndpoint))
	source := controllerAgent(t, c, n1)
	delays := []time.Duration{0, 0, 0, 50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 1100 * time.Millisecond}
	for i, delay := range delays {
		resp, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "race-" + strconv.Itoa(i), VolumeCapabilities: []*csi.VolumeCapability{writer},
			CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}, Parameters: map[string]string{"node": n1.ID}})
		if err != nil {
			t.Fatal(err)
		}
		id := resp.GetVolume().GetVolumeId()
		for range 3 {
			if _, err := replicate(t, ctx, c, n1, n2, id); err != nil {
				t.Fatalf("push of %s: %v", id, err)
			}
		}
		// The last push: the delete starts as soon as the push reports
		// it is done, when its tidy has just begun.
		deleted := make(chan error, 1)
		_, err = source.Replicate(ctx, id, agentclient.Target{Addr: n2.AgentAddress, NodeID: n2.ID}, "test", func(p agentclient.Progress) {
			if p.Done {
				go func() {
					time.Sleep(delay)
					_, err := ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
					deleted <- err
				}()
			}
		})
		if err != nil {
			t.Fatalf("push of %s: %v", id, err)
		}
		if err := <-deleted; err != nil {
			t.Errorf("delete %s after the last push answered: %v", delay, err)
			continue
		}
		for _, n := range []*guestcluster.Node{n1, n2} {
			ds := n.RootDataset + "/" + id
			if out, err := guestcluster.Run("zfs", "list", "-H", "-t", "all", "-r", "-o", "name", ds); err == nil {
				t.Errorf("delete %s after the last push answered OK, but %s still holds:\n%s", delay, n.ID, out)
			}
		}
	}
}

// TestReplicaAheadOfAMovedPrimary: n2's replica holds a snapshot after
// the newest one it shares with n1, taken by the primary of generation 1.
// n1's copy is made the primary of generation 2 without that snapshot, as
// a move or a failover leaves it, and n2 granted n1 generation 2 as the
// move's or failover's reservation does (or, in one case, missed it).
// When n1's history holds generation 1 (planned moves since) and n2
// granted it generation 2, n2 takes an incremental that rolls the
// snapshot back, and nothing is set aside. When n2 missed the
// reservation, its own promise record does not show the snapshot
// superseded: it refuses that incremental, and n1's next push sends in
// full, the old replica set aside whole. When n1's history does not hold
// generation 1 (a failover since), n2's replica may hold writes n1 lacks:
// n1 sends in full, and n2's old replica is set aside whole.
func TestReplicaAheadOfAMovedPrimary(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		historyFrom  string
		granted      bool // n2 granted n1 generation 2
		refusedFirst bool // the first push is refused (FailedPrecondition)
		wantKind     string
		wantAside    bool
	}{
		{"1", true, false, "incremental", false},
		{"1", false, true, "full", true},
		{"2", true, false, "full", true},
	} {
		t.Run(fmt.Sprintf("history from %s granted %v", tt.historyFrom, tt.granted), func(t *testing.T) {
			t.Parallel() // each case has a cluster of its own
			c := guesttest.StartCluster(t, 2, guestcluster.Options{})
			n1, n2 := c.Nodes[0], c.Nodes[1]
			ctx := context.Background()
			name := fmt.Sprintf("ahead-%s-%v", tt.historyFrom, tt.granted)
			id, target := publishedVolume(t, c, name)
			primary, replica := n1.RootDataset+"/"+id, n2.RootDataset+"/"+id
			guesttest.Exec(t, n1, "seq 1 50000 > "+target+"/shared && sync")
			if _, err := replicate(t, ctx, c, n1, n2, id); err != nil {
				t.Fatal(err)
			}
			shared := strings.TrimSpace(guesttest.Run(t, "sh", "-c", "zfs list -H -t snapshot -o name -d 1 "+primary+" | tail -1"))
			guesttest.Exec(t, n1, "echo only-in-the-later-snapshot > "+target+"/later && sync")
			if _, err := replicate(t, ctx, c, n1, n2, id); err != nil {
				t.Fatal(err)
			}
			aheadGUIDs := guesttest.Run(t, "zfs", "list", "-H", "-t", "snapshot", "-o", "guid", "-d", "1", replica)
			unpublish(t, c, id, name)
			// n1 becomes the primary of generation 2 at the shared
			// snapshot: the later one exists on n2 alone. The push's
			// tidy holds its new base a moment after it answered: the
			// release is retried until the rollback gets through.
			rollback := "for i in $(seq 1 40); do zfs holds -H $(zfs list -H -t snapshot -o name -d 1 " + primary + ") | while read s tag _; do zfs release $tag $s; done; " +
				"zfs rollback -r " + shared + " 2>/dev/null && exit 0; sleep 0.5; done; zfs rollback -r " + shared
			guesttest.Run(t, "sh", "-c", rollback)
			guesttest.Run(t, "zfs", "set", "zfs-nomad:generation=2", "zfs-nomad:history_from="+tt.historyFrom, primary)
			if tt.granted {
				// The reservation a move or failover makes before it
				// promotes n1.
				p, err := controllerAgent(t, c, n2).Reserve(ctx, agentclient.Reservation{VolumeID: id, Generation: 2, HolderNodeID: n1.ID})
				if err != nil || !p.Granted {
					t.Fatalf("reserving generation 2 for %s on %s: %+v, %v", n1.ID, n2.ID, p, err)
				}
			}

			if tt.refusedFirst {
				_, err := replicate(t, ctx, c, n1, n2, id)
				if status.Code(err) != codes.FailedPrecondition {
					t.Fatalf("the first push to a replica whose node missed the reservation: %v, want FailedPrecondition", err)
				}
				t.Logf("the first push: %v", err)
				if guids := guesttest.Run(t, "zfs", "list", "-H", "-t", "snapshot", "-o", "guid", "-d", "1", replica); guids != aheadGUIDs {
					t.Fatalf("the refused push changed the replica's snapshots to %q, it had %q", guids, aheadGUIDs)
				}
			}
			prog, err := replicate(t, ctx, c, n1, n2, id)
			if err != nil {
				t.Fatal(err)
			}
			if prog.Kind != tt.wantKind {
				t.Errorf("sent %s, want %s", prog.Kind, tt.wantKind)
			}
			if gen := zfsGet(t, "zfs-nomad:generation", replica); gen != "2" {
				t.Errorf("the replica is of generation %s after the push, want 2", gen)
			}
			if got := replicaChecksums(t, n2, id); strings.Contains(got, "later") {
				t.Errorf("the replica still has the file of the rolled-back snapshot:\n%s", got)
			}
			aside := strings.Fields(guesttest.Run(t, "sh", "-c", "zfs list -H -o name -d 1 "+n2.RootDataset+" | grep -- "+id+"-aside- || true"))
			if (len(aside) == 1) != tt.wantAside || len(aside) > 1 {
				t.Fatalf("set aside on n2: %v, want the old replica set aside: %v", aside, tt.wantAside)
			}
			if tt.wantAside {
				if guids := guesttest.Run(t, "zfs", "list", "-H", "-t", "snapshot", "-o", "guid", "-d", "1", aside[0]); guids != aheadGUIDs {
					t.Errorf("the copy set aside has snapshots %q, the replica had %q", guids, aheadGUIDs)
				}
			}
		})
	}
}

// TestStalledSenderIsCutOff: a peer with a valid node certificate sends a
// header and half a stream, then nothing, keeping the connection open.
// The receive ends after the idle timeout (5 s here,
// receive_idle_timeout), the replica keeps its data, and the volume's
// receive lock is free again: the primary's next push succeeds.
func TestStalledSenderIsCutOff(t *testing.T) {
	const idle = 5 * time.Second
	c, id, target := replicatedVolume(t, guestcluster.Options{NodeArgs: []string{"-receive-idle-timeout=" + idle.String()}}, "stalled")
	n1, n2 := c.Nodes[0], c.Nodes[1]
	ctx := context.Background()
	before := replicaChecksums(t, n2, id)

	src := n1.RootDataset + "/" + id
	base := strings.TrimSpace(guesttest.Run(t, "sh", "-c", "zfs list -H -t snapshot -o name -s createtxg -d 1 "+src+" | tail -1"))
	guesttest.Exec(t, n1, "dd if=/dev/urandom of="+target+"/blob bs=1M count=4 2>/dev/null && sync")
	guesttest.Run(t, "zfs", "snapshot", src+"@stalled")
	data := zfsSend(t, "-i "+base+" "+src+"@stalled")
	nodeFiles, _ := c.CA.Issue("peer", tlsconfig.RoleNode)
	stream, err := clientAs(t, nodeFiles, n2).Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := &pb.ReceiveHeader{VolumeId: id, Kind: "incremental", Snapshot: "stalled", SourceNodeId: "peer", Generation: 1}
	if err := stream.Send(&pb.ReceiveMessage{Msg: &pb.ReceiveMessage_Header{Header: h}}); err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.ReceiveMessage{Msg: &pb.ReceiveMessage_Data{Data: data[:len(data)/2]}}); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	err = stream.RecvMsg(&pb.ReceiveResult{}) // the send side stays open: the peer stalls
	took := time.Since(started)
	if err == nil || !strings.Contains(err.Error(), "idle timeout") {
		t.Fatalf("a stalled stream ended with %v, want the idle timeout", err)
	}
	if took < idle-time.Second || took > 4*idle {
		t.Errorf("the stalled receive ended after %s, want about the idle timeout (%s)", took.Round(time.Millisecond), idle)
	}
	t.Logf("a stalled stream was cut off after %s (idle timeout %s)", took.Round(time.Millisecond), idle)
	if after := replicaChecksums(t, n2, id); after != before {
		t.Errorf("after the stalled stream the replica changed:\n%s\nwas:\n%s", after, before)
	}
	// The lock is free, and the partial receive the stall left is the
	// primary's to resume or replace.
	if _, err := replicate(t, ctx, c, n1, n2, id); err != nil {
		t.Fatalf("the push after the stalled stream: %v", err)
	}
	if src, dst := checksums(t, n1, target), replicaChecksums(t, n2, id); src != dst {
		t.Errorf("after the next push the replica differs:\nsource:\n%s\nreplica:\n%s", src, dst)
	}
}

// TestCertificatesRotateWithoutARestart: a node's renewed certificate is
// put in use when its files change and on SIGHUP, with no restart: new
// connections are served with it and replication goes on. Another node's
// certificate written over it is refused, naming the file, and the node
// keeps the one in use.
func TestCertificatesRotateWithoutARestart(t *testing.T) {
	t.Parallel()
	c, id, target := replicatedVolume(t, guestcluster.Options{}, "rotated")
	n1, n2 := c.Nodes[0], c.Nodes[1]
	const expiryMetric = "zfs_nomad_tls_certificate_expiry_timestamp_seconds"
	expiry := func() string {
		v, err := n2.Metric(expiryMetric)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// servedSerial is the serial of the certificate n2 serves a new
	// connection with.
	servedSerial := func() string {
		var p peer.Peer
		if _, err := agent(t, c, n2).GetNode(context.Background(), &pb.GetNodeRequest{WithoutCapacity: true}, grpc.Peer(&p)); err != nil {
			t.Fatal(err)
		}
		return p.AuthInfo.(credentials.TLSInfo).State.PeerCertificates[0].SerialNumber.String()
	}
	fileSerial := func() string {
		block, _ := pem.Decode([]byte(guesttest.Run(t, "cat", n2.TLS.Cert)))
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return cert.SerialNumber.String()
	}
	wantServed := func(how string) {
		t.Helper()
		want := fileSerial()
		deadline := time.Now().Add(30 * time.Second)
		for servedSerial() != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: n2 still serves new connections with another certificate than its files' (serial %s) after 30 s", how, want)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}

	// A renewal lands in the files (zfs-controller tls cert, a template).
	before := expiry()
	if _, err := c.CA.Issue(n2.ID, tlsconfig.RoleNode); err != nil {
		t.Fatal(err)
	}
	wantServed("after the files changed")
	if expiry() == before {
		t.Errorf("%s is still %s after the reload", expiryMetric, before)
	}
	guesttest.Exec(t, n1, "echo after-rotation >> "+target+"/numbers && sync")
	if _, err := replicate(t, context.Background(), c, n1, n2, id); err != nil {
		t.Fatalf("replicating to n2 after its certificate was rotated: %v", err)
	}

	// SIGHUP reloads at once, without waiting for the next look.
	if comm := strings.TrimSpace(guesttest.Run(t, "cat", fmt.Sprintf("/proc/%d/comm", n2.Process.Pid()))); comm != "zfs-node" {
		t.Fatalf("n2's process is %q, not zfs-node: cannot signal it", comm)
	}
	if _, err := c.CA.Issue(n2.ID, tlsconfig.RoleNode); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(n2.Process.Pid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	wantServed("after SIGHUP")

	// Another node's certificate is refused; the one in use stays.
	inUse := servedSerial()
	other, err := c.CA.Issue("not-n2", tlsconfig.RoleNode)
	if err != nil {
		t.Fatal(err)
	}
	guesttest.Run(t, "cp", other.Cert, n2.TLS.Cert)
	guesttest.Run(t, "cp", other.Key, n2.TLS.Key)
	if err := syscall.Kill(n2.Process.Pid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	refused := func() bool {
		log := guesttest.Run(t, "cat", n2.Process.Log)
		return strings.Contains(log, "certificate in use is kept") && strings.Contains(log, "not-n2")
	}
	for !refused() {
		if time.Now().After(deadline) {
			t.Fatal("n2 logged no refusal of a certificate naming not-n2 within 30 s")
		}
		time.Sleep(500 * time.Millisecond)
	}
	if got := servedSerial(); got != inUse {
		t.Errorf("after the refusal n2 serves serial %s, want the one in use, %s", got, inUse)
	}
	if _, err := replicate(t, context.Background(), c, n1, n2, id); err != nil {
		t.Fatalf("replicating to n2 after a refused certificate: %v", err)
	}
}
