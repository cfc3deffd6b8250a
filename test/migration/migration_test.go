// Package migration tests that a volume's data follows its workload, on
// real ZFS in the guest with three simulated nodes: planned moves with and
// without a replica, failover (auto and manual) with the lost primary
// fenced when it returns, and moves interrupted by killed processes.
package migration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/csiplugin"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// Tests that bound a time (a call's answer, a lease, a fence) run alone,
// first; the others call t.Parallel and run two at a time, each cluster
// in a slot of its own (guesttest.Options.Slots): most of their time is
// waiting (throttled streams, retries as Nomad makes them, the grants of
// a killed controller running out), which a second cluster fills.
func TestMain(m *testing.M) {
	os.Exit(guesttest.Main(m, guesttest.Options{
		// n4's and n5's for the one five-node test.
		Disks:    []string{"2G", "2G", "2G", "1G", "1G"},
		Slots:    2,
		Binaries: guesttest.DriverBinaries(),
		Memory:   "3G",
		Timeout:  40 * time.Minute, // its failover tests wait out leases, its snapshot tests move volumes: past 25 min
	}))
}

var writer = guestcluster.MountWriter()

// env is a three-node cluster and clients for it.
type env struct {
	t   *testing.T
	c   *guestcluster.Cluster
	ctx context.Context
	// secrets go with every create and stage, as Nomad sends a volume's
	// secrets block.
	secrets map[string]string
}

func start(t *testing.T) *env {
	// The pass over deleted snapshots every 10 s, not every minute: the
	// snapshot tests wait for it, and a shorter pass forgets the records
	// sooner, which makes a late copy's race with it more likely, not less.
	return startController(t, explicitPushes("-deletions-every", "10s"))
}

// startFlushing is start with the flush at unpublish on.
func startFlushing(t *testing.T) *env {
	return startController(t, []string{"-schedule-every", "0", "-deletions-every", "10s", "-flush-on-unpublish"})
}

func startController(t *testing.T, args []string) *env {
	c := guesttest.StartCluster(t, 3, guestcluster.Options{ControllerArgs: args})
	return &env{t: t, c: c, ctx: context.Background()}
}

// explicitPushes are the controller's arguments, then more, for tests
// that push replicas themselves, at chosen moments: no schedule, and no
// flush at unpublish (off by default, and off here whatever the default),
// which would push at the unpublishes (both push from the primary the
// tests' pushes push from; TestFailoverManual runs the flush).
func explicitPushes(more ...string) []string {
	return append([]string{"-schedule-every", "0", "-flush-on-unpublish=false"}, more...)
}

func (e *env) controller() csi.ControllerClient {
	return csi.NewControllerClient(guesttest.Dial(e.t, e.c.ControllerEndpoint))
}

func (e *env) node(id string) *guestcluster.Node {
	for _, n := range e.c.Nodes {
		if n.ID == id {
			return n
		}
	}
	e.t.Fatalf("no node %s", id)
	return nil
}

func (e *env) agent(nodeID string) pb.NodeAgentClient {
	return pb.NewNodeAgentClient(guesttest.DialAgent(e.t, e.c, e.node(nodeID)))
}

// create makes a volume on n1.
func (e *env) create(name string, params map[string]string) string {
	e.t.Helper()
	p := map[string]string{"node": "n1", "compression": "off"}
	for k, v := range params {
		p[k] = v
	}
	resp, err := e.controller().CreateVolume(e.ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{writer},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}, Parameters: p, Secrets: e.secrets})
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.GetVolume().GetVolumeId()
}

// createWritten makes a volume on n1, publishes it there and runs script
// in it: most tests start so. It returns the volume's ID and the path the
// workload sees.
func (e *env) createWritten(name string, params map[string]string, script string) (id, dir string) {
	e.t.Helper()
	id = e.create(name, params)
	dir = e.mustPublish(id, "n1")
	e.write("n1", dir, script)
	return id, dir
}

// publish does what Nomad does for a claim on nodeID: ControllerPublish
// (retried while a move's catch-up runs, guestcluster.Publish), then stage and
// publish with the publish context. It returns the path the
// workload sees.
func (e *env) publish(id, nodeID string) (string, error) {
	return e.publishWithin(e.ctx, id, nodeID)
}

// publishWithin is publish ending when ctx does.
func (e *env) publishWithin(ctx context.Context, id, nodeID string) (string, error) {
	req := &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeID, VolumeCapability: writer}
	resp, err := guestcluster.Publish(ctx, e.controller(), req, 3*time.Minute, func(err error) bool {
		if !guestcluster.CatchingUp(err) {
			return false
		}
		e.t.Logf("publish of %s on %s: %v; retrying", id, nodeID, err)
		return true
	})
	if err != nil {
		return "", err
	}
	return guesttest.MountWithSecrets(ctx, e.t, e.node(nodeID), id, id, resp.GetPublishContext(), e.secrets)
}

func (e *env) stage(id, nodeID string, publishContext map[string]string) (string, error) {
	return e.stageWithin(e.ctx, id, nodeID, publishContext)
}

// stageWithin is stage ending when ctx does.
func (e *env) stageWithin(ctx context.Context, id, nodeID string, publishContext map[string]string) (string, error) {
	return guesttest.Mount(ctx, e.t, e.node(nodeID), id, id, publishContext)
}

func (e *env) mustPublish(id, nodeID string) string {
	e.t.Helper()
	target, err := e.publish(id, nodeID)
	if err != nil {
		e.t.Fatalf("publishing %s on %s: %v", id, nodeID, err)
	}
	return target
}

// unpublish is the claim's end on nodeID: node unpublish and unstage, then
// ControllerUnpublish.
func (e *env) unpublish(id, nodeID string) {
	e.t.Helper()
	n := e.node(nodeID)
	node := csi.NewNodeClient(guesttest.Dial(e.t, n.CSIEndpoint))
	if _, err := node.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: filepath.Join(n.Dir, "target-"+id)}); err != nil {
		e.t.Fatal(err)
	}
	if _, err := node.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: filepath.Join(n.Dir, "staging-"+id)}); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.controller().ControllerUnpublishVolume(e.ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: nodeID}); err != nil {
		e.t.Fatal(err)
	}
}

// promote runs the operator's zfs-controller promote of volume id's
// copy on nodeID, fails the test unless it says the node is the primary
// now, and returns its output.
func (e *env) promote(id, nodeID string) string {
	e.t.Helper()
	ctl := filepath.Join(guesttest.BinDir(e.t), "zfs-controller")
	out := guesttest.Run(e.t, ctl, "promote", "-peers", strings.Join(e.c.AgentAddresses(), ","), "-agent-timeout", "30s",
		"-tls-ca", e.c.Operator.CA, "-tls-cert", e.c.Operator.Cert, "-tls-key", e.c.Operator.Key, "-node", nodeID, id)
	e.t.Logf("promote:\n%s", out)
	if !strings.Contains(out, "node "+nodeID+" is the primary now") {
		e.t.Fatalf("promote: %s", out)
	}
	return out
}

// replicate pushes the volume from one node to another now, and returns
// the push's last progress report (its kind and bytes).
func (e *env) replicate(id, from, to string) *pb.ReplicateProgress {
	e.t.Helper()
	last, err := e.pushed(id, from, to)
	if err != nil {
		e.t.Fatalf("replicating %s from %s to %s: %v", id, from, to, err)
	}
	return last
}

// push is replicate for a goroutine: it answers the push's error.
func (e *env) push(id, from, to string) error {
	_, err := e.pushed(id, from, to)
	return err
}

func (e *env) pushed(id, from, to string) (*pb.ReplicateProgress, error) {
	stream, err := e.agent(from).Replicate(e.ctx, &pb.ReplicateRequest{VolumeId: id, TargetAddress: e.node(to).AgentAddress})
	if err != nil {
		return nil, err
	}
	var last *pb.ReplicateProgress
	for {
		prog, err := stream.Recv()
		if err == io.EOF {
			return last, nil
		} else if err != nil {
			return last, err
		}
		last = prog
	}
}

func (e *env) copyOn(id, nodeID string) *pb.Copy {
	e.t.Helper()
	c, err := e.agent(nodeID).GetCopy(e.ctx, &pb.GetCopyRequest{VolumeId: id})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// primaries lists the nodes holding the volume as primary, read from ZFS
// directly (agents may be down).
func (e *env) primaries(id string) []string {
	e.t.Helper()
	out := guesttest.Run(e.t, "sh", "-c", "zfs get -H -o name,property,value zfs-nomad:role,zfs-nomad:generation -t filesystem | grep '/"+id+"\t'")
	roles, gens := map[string]string{}, map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 3 {
			continue
		}
		node := e.nodeOf(f[0])
		if f[1] == "zfs-nomad:role" {
			roles[node] = f[2]
		} else {
			gens[node] = f[2]
		}
	}
	var primaries []string
	for _, n := range e.c.Nodes {
		if roles[n.ID] == "primary" {
			primaries = append(primaries, n.ID+"(gen "+gens[n.ID]+")")
		}
	}
	return primaries
}

// nodeOf is the ID of the node of e's cluster whose pool holds dataset,
// or "" (another slot's cluster, in a parallel test).
func (e *env) nodeOf(dataset string) string {
	pool, _, _ := strings.Cut(dataset, "/")
	for _, n := range e.c.Nodes {
		if n.Pool == pool {
			return n.ID
		}
	}
	return ""
}

// waitPrimaries waits until the volume's primaries are exactly want
// ("n2(gen 2)", in node order). ControllerPublishVolume answers once the
// target is the primary; the old copy is demoted right after, in the
// background, so a check made at once may still see it.
func (e *env) waitPrimaries(id string, want ...string) {
	e.t.Helper()
	var got []string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if got = e.primaries(id); slices.Equal(got, want) {
			return
		}
	}
	e.t.Fatalf("waited 30 s for the primaries of %s to be %v: last %v", id, want, got)
}

// waitRole waits until nodeID's copy of the volume has the role.
func (e *env) waitRole(id, nodeID, role string) *pb.Copy {
	e.t.Helper()
	var c *pb.Copy
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if c = e.copyOn(id, nodeID); c.GetRole() == role {
			return c
		}
	}
	e.t.Fatalf("waited 30 s for %s's copy of %s to be a %s: last %+v", nodeID, id, role, c)
	return nil
}

func (e *env) write(nodeID, dir, script string) {
	e.t.Helper()
	guesttest.Exec(e.t, e.node(nodeID), "cd "+dir+" && "+script+" && sync")
}

func (e *env) checksums(nodeID, dir string) string {
	e.t.Helper()
	return guesttest.Exec(e.t, e.node(nodeID), guesttest.Checksums(dir))
}

func wantCode(t *testing.T, err error, code codes.Code, mention string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), mention) {
		t.Fatalf("got %v, want %s mentioning %q", err, code, mention)
	}
}

// A planned move brings every file to the new node, with and without a
// replica there beforehand; the old primary becomes a replica, and moving
// back sends only the increment.
func TestPlannedMove(t *testing.T) {
	t.Parallel()
	e := start(t)
	for _, withReplica := range []bool{false, true} {
		t.Run(fmt.Sprintf("replica=%v", withReplica), func(t *testing.T) {
			e.t = t
			id, dir := e.createWritten(fmt.Sprintf("move-%v", withReplica), nil, "mkdir -p d && echo one > a && seq 1 50000 > d/n && "+guesttest.RandomFile("blob", 24))
			if withReplica {
				e.replicate(id, "n1", "n2")
				e.write("n1", dir, "echo two > a && echo late > d/late")
				// n3's replica gets a snapshot n2's lacks; the move's
				// pushes to n2 bring it (docs/replication.md,
				// "Replicas share a base").
				e.replicate(id, "n1", "n3")
			}
			before := e.checksums("n1", dir)

			// Still published on n1: the move waits, and says why.
			_, err := e.publish(id, "n2")
			wantCode(t, err, codes.FailedPrecondition, "still published on node n1")

			e.unpublish(id, "n1")
			if withReplica {
				e.writtenSinceReplicas(id, "n1", "n2", "n3")
			}
			dir2 := e.mustPublish(id, "n2")
			if after := e.checksums("n2", dir2); after != before {
				t.Fatalf("files differ after the move:\nn1:\n%s\nn2:\n%s", before, after)
			}
			e.waitPrimaries(id, "n2(gen 2)")
			old := e.waitRole(id, "n1", "replica")
			if old.GetGeneration() != 2 || old.GetMovingTo() != "" {
				t.Fatalf("n1's copy after the move: %+v, want a replica at generation 2", old)
			}
			// The old node refuses to stage its copy, whatever it is told.
			_, err = e.stage(id, "n1", map[string]string{"generation": "1"})
			wantCode(t, err, codes.FailedPrecondition, "replica")

			if withReplica {
				// n3 continues from the base n2 now shares with it:
				// an increment, not its 24 MiB again.
				prog := e.rolledForward(id, "n2", "n3", 2)
				t.Logf("after the move, n3's first push from n2: %s, %d bytes", prog.GetKind(), prog.GetBytes())
				if prog.GetKind() != "incremental" || prog.GetBytes() > 4<<20 {
					t.Fatalf("after the move, n3's first push from n2 was %s, %d bytes; want a small increment", prog.GetKind(), prog.GetBytes())
				}
			}
			// Back to n1: an increment onto n1's copy, and a third generation.
			e.write("n2", dir2, "echo three > a && dd if=/dev/urandom of=d/more bs=1M count=2 2>/dev/null")
			before = e.checksums("n2", dir2)
			e.unpublish(id, "n2")
			dir1 := e.mustPublish(id, "n1")
			if after := e.checksums("n1", dir1); after != before {
				t.Fatalf("files differ after moving back:\nn2:\n%s\nn1:\n%s", before, after)
			}
			e.waitPrimaries(id, "n1(gen 3)")
			if withReplica {
				e.rolledForward(id, "n1", "n3", 3)
				// n2's copy, demoted by the move back, is now surplus:
				// n3 is as fresh (docs/replication.md, "Surplus copies").
				e.surplusGoes(id, "n2")
			}
			// Publishing where it is is a no-op with the same generation,
			// once the move's job has ended: until the source's demotion
			// returns, the move still runs and a publish is granted ahead
			// of its end (after_generation), which the stage passes at once.
			req := &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "n1", VolumeCapability: writer}
			resp, err := e.controller().ControllerPublishVolume(e.ctx, req)
			for deadline := time.Now().Add(10 * time.Second); err == nil && resp.GetPublishContext()[contract.PublishContextAfterGeneration] != "" && time.Now().Before(deadline); {
				time.Sleep(200 * time.Millisecond)
				resp, err = e.controller().ControllerPublishVolume(e.ctx, req)
			}
			if err != nil || resp.GetPublishContext()["generation"] != "3" {
				t.Fatalf("repeated publish: %v, %v", resp, err)
			}
			e.unpublish(id, "n1")
		})
	}
}

// writtenSinceReplicas checks that the unmounted primary on nodeID tells
// what was written since the snapshot each replica holds (ZFS's
// written@): since the first's, the writes after it; since the second's,
// its newest snapshot, nothing of those. A move decides from it whether
// its target needs a catch-up (docs/migration.md, "Catch-up"); a mounted
// primary's is not read, the move waiting for its unpublish anyway.
func (e *env) writtenSinceReplicas(id, nodeID, first, second string) {
	e.t.Helper()
	written := e.copyOn(id, nodeID).GetWrittenSince()
	older, newer := e.copyOn(id, first).GetLastSnapshot(), e.copyOn(id, second).GetLastSnapshot()
	sinceOlder, ok1 := written[older]
	sinceNewer, ok2 := written[newer]
	if !ok1 || !ok2 || sinceOlder == 0 || sinceOlder > 1<<20 || sinceNewer >= sinceOlder {
		e.t.Fatalf("%s's primary tells written since its snapshots %v; want since %s's %s a little (the writes after it), since %s's %s less",
			nodeID, written, first, older, second, newer)
	}
	e.t.Logf("written on %s since %s's snapshot: %d bytes; since %s's: %d", nodeID, first, sinceOlder, second, sinceNewer)
}

// rolledForward pushes the volume from its primary on from to the replica
// on to, which holds snapshots of an earlier generation that the primary
// lacks (planned moves since). The replica takes an incremental that rolls
// them back: it ends at the primary's generation, with the primary's
// newest snapshot, and nothing on to is set aside.
func (e *env) rolledForward(id, from, to string, generation uint64) *pb.ReplicateProgress {
	e.t.Helper()
	prog := e.replicate(id, from, to)
	if c := e.copyOn(id, to); c.GetRole() != "replica" || c.GetGeneration() != generation || c.GetLastSnapshot() != e.copyOn(id, from).GetLastSnapshot() {
		e.t.Fatalf("%s's copy after a push from %s: %+v, want a replica at generation %d with %s's newest snapshot", to, from, c, generation, from)
	}
	if aside := guesttest.Run(e.t, "sh", "-c", "zfs list -H -o name -r "+e.node(to).RootDataset+" | grep -- -aside- || true"); strings.TrimSpace(aside) != "" {
		e.t.Fatalf("a push after planned moves set a replica aside on %s:\n%s", to, aside)
	}
	return prog
}

// surplusGoes checks on real ZFS that node nodeID's copy of volume id,
// demoted by a move, carries the mark, and that the node deletes it as a
// surplus copy only as judged by its newest snapshot and only while it
// holds no snapshot but replication snapshots.
func (e *env) surplusGoes(id, nodeID string) {
	e.t.Helper()
	fs := e.node(nodeID).RootDataset + "/" + id
	if mark := strings.TrimSpace(guesttest.Run(e.t, "zfs", "get", "-H", "-o", "value", "zfs-nomad:demoted_at", fs)); mark == "-" || mark == "" {
		e.t.Fatalf("%s's copy, demoted by a move, carries no mark", nodeID)
	}
	newest := e.copyOn(id, nodeID).GetLastSnapshot()
	agent := e.agent(nodeID)
	remove := func(newest string) error {
		_, err := agent.DeleteReplica(e.ctx, &pb.DeleteReplicaRequest{VolumeId: id, SurplusNewest: newest})
		return err
	}
	wantCode(e.t, remove("zn-1"), codes.FailedPrecondition, "newest snapshot is no longer")
	guesttest.Run(e.t, "zfs", "snapshot", fs+"@by-hand")
	wantCode(e.t, remove("by-hand"), codes.FailedPrecondition, "not a replication snapshot")
	guesttest.Run(e.t, "zfs", "destroy", fs+"@by-hand")
	if err := remove(newest); err != nil {
		e.t.Fatalf("deleting %s's surplus copy: %v", nodeID, err)
	}
	if c := e.copyOn(id, nodeID); c.GetExists() {
		e.t.Fatalf("%s's surplus copy is still there: %+v", nodeID, c)
	}
}

// loseNode kills a node's agent and cuts its link: to the controller it is
// gone, while its mounts stay (the node itself did not crash).
func (e *env) loseNode(nodeID string) {
	e.t.Helper()
	n := e.node(nodeID)
	n.Kill()
	if err := n.CutLink(); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) returnNode(nodeID string) {
	e.t.Helper()
	n := e.node(nodeID)
	if err := n.RestoreLink(); err != nil {
		e.t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		e.t.Fatal(err)
	}
}

// The lease of the clusters whose tests fail a volume over automatically:
// nodes without peers keep no lease and grant no automatic failover, so
// those tests run nodes that keep leases. The margin is the smallest
// config accepts with this lease (config.MinLeaseMargin).
const failoverLease, failoverMargin = 8 * time.Second, 19 * time.Second

// startForFailover starts three nodes that keep leases of failoverLease,
// with no schedule.
func startForFailover(t *testing.T) *env {
	return startWithLease(t, failoverLease, "-lease-margin="+failoverMargin.String())
}

// publishAfterSilence publishes id on nodeID after a node was lost, as
// the CO retries: the nodes grant the failover only once the lost node
// has been silent for their lease and its margin (Unavailable until
// then).
func (e *env) publishAfterSilence(id, nodeID string) string {
	e.t.Helper()
	var dir string
	var err error
	for deadline := time.Now().Add(2 * (failoverLease + failoverMargin)); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if dir, err = e.publish(id, nodeID); err == nil {
			return dir
		}
		if status.Code(err) != codes.Unavailable {
			break
		}
	}
	e.t.Fatalf("publishing %s on %s after the lost node's silence: %v", id, nodeID, err)
	return ""
}

// TestPublishAfterSilentNodeLoss: a node that dies without closing its
// connections (its link goes before its processes) must not cost the next
// publish the controller's agent timeout: keepalive pings find the dead
// connection first, and calls to the node fail at once. The nodes keep
// no lease (no peers), so the answer is the refusal of the automatic
// failover, which must come as quickly.
func TestPublishAfterSilentNodeLoss(t *testing.T) {
	const agentTimeout = 30 * time.Second // the production default
	c := guesttest.StartCluster(t, 3, guestcluster.Options{ControllerArgs: explicitPushes("-agent-timeout", agentTimeout.String())})
	e := &env{t: t, c: c, ctx: context.Background()}
	// Published: the controller now holds a connection to every agent.
	id, _ := e.createWritten("silent", map[string]string{"failover": "auto"}, "echo replicated > a")
	e.replicate(id, "n1", "n2")
	e.unpublish(id, "n1")

	n1 := e.node("n1")
	if err := n1.CutLink(); err != nil {
		t.Fatal(err)
	}
	n1.Kill()
	// Nomad takes at least this long to free a lost node's claims.
	time.Sleep(20 * time.Second)
	began := time.Now()
	_, err := e.publish(id, "n2")
	took := time.Since(began)
	t.Logf("publish on n2 after n1 was lost silently: %s: %v", took.Round(100*time.Millisecond), err)
	wantCode(t, err, codes.Unavailable, "no peers configured")
	if took > agentTimeout*2/3 {
		t.Fatalf("publish after the silent loss of n1 took %s: the controller waited on the dead connection (agent timeout %s)", took, agentTimeout)
	}
}

// Failover with policy auto promotes the freshest replica; what was
// written after the last replication is not claimed; the lost primary,
// back again, is refused for staging and set aside, never destroyed. A
// CSI snapshot taken on n1 reaches n2 with the replica's push and
// survives the failover: it is listed once and restored on n2 with the
// data it was taken with, although its node of origin is gone.
func TestFailoverAuto(t *testing.T) {
	e := startForFailover(t)
	id, dir := e.createWritten("precious", map[string]string{"failover": "auto"}, "echo replicated > a && "+guesttest.RandomFile("blob", 8))
	e.replicate(id, "n1", "n3") // older replica
	e.write("n1", dir, "echo newer > b")
	taken := e.checksums("n1", dir)
	snap, err := e.controller().CreateSnapshot(e.ctx, &csi.CreateSnapshotRequest{SourceVolumeId: id, Name: "before-the-loss"})
	if err != nil {
		t.Fatal(err)
	}
	snapID := snap.GetSnapshot().GetSnapshotId()
	e.write("n1", dir, "echo after-the-snapshot > a")
	e.replicate(id, "n1", "n2") // the freshest
	replicated := e.checksums("n1", dir)
	e.write("n1", dir, "echo lost > c") // never replicated

	e.loseNode("n1")
	dir2 := e.publishAfterSilence(id, "n2")
	if got := e.checksums("n2", dir2); got != replicated {
		t.Fatalf("after failover n2 has:\n%s\nwant what was replicated:\n%s", got, replicated)
	}
	c := e.copyOn(id, "n2")
	if c.GetRole() != "primary" || c.GetGeneration() != 2 || c.GetFailoverFromSnapshot() == "" {
		t.Fatalf("promoted copy: %+v", c)
	}
	listed, err := e.controller().ListSnapshots(e.ctx, &csi.ListSnapshotsRequest{SnapshotId: snapID})
	if err != nil || len(listed.GetEntries()) != 1 {
		t.Fatalf("ListSnapshots with n1 lost: %v, %v; want %s once", listed, err, snapID)
	}
	restored := e.restoreHolds("restored-after-loss", snapID, nil, "n2", taken)
	metrics := scrape(t, e.c.ControllerMetrics)
	if !strings.Contains(metrics, `zfs_nomad_migrations_total{kind="failover",result="ok"} 1`) || !strings.Contains(metrics, "\nzfs_nomad_failover_rpo_seconds_count 1\n") ||
		!strings.Contains(metrics, "\nzfs_nomad_failover_promotion_seconds_count 1\n") {
		t.Errorf("metrics lack the failover:\n%s", metrics)
	}

	// n1 comes back with its copy still mounted (the workload there was
	// never stopped). Its first beats learn that generation 2 was
	// promised elsewhere: the copy turns read-only and is refused, and it
	// is not demoted while mounted.
	e.returnNode("n1")
	waitFor(t, 3*failoverLease, "n1's returning copy to turn read-only", func() bool { return e.tryWrite("n1", dir) != nil })
	for deadline := time.Now().Add(3 * failoverLease); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if _, err = e.stage(id, "n1", map[string]string{"generation": "1"}); status.Code(err) != codes.Unavailable {
			break
		}
	}
	wantCode(t, err, codes.FailedPrecondition, "generation 2 of volume "+id+" was promised to another node")
	// Nomad stops the lost allocation there; then the stale copy is set
	// aside by the next publish (or the schedule).
	e.unpublish(id, "n1")
	e.settled(id, "n2", "n2(gen 2)")
	if c := e.copyOn(id, "n1"); c.GetExists() {
		t.Fatalf("n1 still holds a copy under the volume's name: %+v", c)
	}
	aside := strings.TrimSpace(guesttest.Run(t, "sh", "-c", "zfs list -H -o name,zfs-nomad:role -r "+e.node("n1").RootDataset+" | grep aside"))
	if !strings.Contains(aside, id+"-aside-") || !strings.HasSuffix(aside, "set-aside") {
		t.Fatalf("n1's stale copy was not set aside: %q", aside)
	}
	// It holds what was written after the last replication, for the
	// operator to look at, and nothing keeps the operator from removing it.
	asideDS := strings.Fields(aside)[0]
	guesttest.Exec(t, e.node("n1"), "mkdir -p /tmp/aside && mount -t zfs -o ro "+asideDS+" /tmp/aside && cat /tmp/aside/c && umount /tmp/aside")
	guesttest.Run(t, "zfs", "destroy", "-r", asideDS)
	// The older replica on n3 continues from the base n2 shares with it
	// (n1's push to n2 brought n3's base, docs/replication.md "Replicas
	// share a base"): an increment, not the 8 MiB again, and n3 holds
	// nothing after that base, so nothing of it is set aside.
	prog := e.replicate(id, "n2", "n3")
	t.Logf("after the failover, n3's first push from n2: %s, %d bytes", prog.GetKind(), prog.GetBytes())
	if prog.GetKind() != "incremental" || prog.GetBytes() > 4<<20 {
		t.Fatalf("after the failover, n3's first push from n2 was %s, %d bytes; want a small increment", prog.GetKind(), prog.GetBytes())
	}
	if c := e.copyOn(id, "n3"); c.GetGeneration() != 2 || c.GetRole() != "replica" {
		t.Fatalf("n3 after a push from the new primary: %+v", c)
	}
	if aside := guesttest.Run(t, "sh", "-c", "zfs list -H -o name -r "+e.node("n3").RootDataset+" | grep -- -aside- || true"); strings.TrimSpace(aside) != "" {
		t.Fatalf("n3's replica was set aside, although it holds nothing the new primary lacks: %q", aside)
	}
	e.deleteVolume(restored)
}

// TestStaleCopyWaitsForTheNewestsNode: after a failover, the old
// primary's node returns while the new primary's node is down. The old
// copy still says "primary, generation 1", and the replica on n3 is of
// generation 1 too; only n3's promise of generation 2 to n2 shows that a
// newer copy exists. The publish must wait for n2, not hand out the stale
// copy.
func TestStaleCopyWaitsForTheNewestsNode(t *testing.T) {
	e := startForFailover(t)
	id, _ := e.createWritten("promised", map[string]string{"failover": "auto"}, "echo replicated > a")
	// n2's replica last, so that it is the freshest: the failover
	// promotes it, and n3's replica stays at generation 1. (With n3's the
	// freshest, the failover promotes n3 and then moves the volume to n2,
	// and n3's demoted copy shows the newer generation by itself.)
	e.replicate(id, "n1", "n3")
	e.replicate(id, "n1", "n2")
	e.unpublish(id, "n1")

	e.loseNode("n1")
	dir2 := e.publishAfterSilence(id, "n2") // failover: generation 2, promised by n2 and n3
	if c := e.copyOn(id, "n3"); c.GetRole() != "replica" || c.GetGeneration() != 1 {
		t.Fatalf("n3's copy after the failover to n2: %+v, want a replica at generation 1 (only its promise tells of generation 2)", c)
	}
	e.write("n2", dir2, "echo only-on-n2 > b")
	newest := e.checksums("n2", dir2)
	e.unpublish(id, "n2")
	e.loseNode("n2")
	e.returnNode("n1")

	// As Nomad does, retry while the controller has not reconnected to
	// n1 yet.
	var err error
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Second) {
		if _, err = e.publish(id, "n1"); err == nil || !strings.Contains(err.Error(), "node n1 did not answer") {
			break
		}
	}
	wantCode(t, err, codes.Unavailable, "promised to node n2")
	if c := e.copyOn(id, "n1"); c.GetRole() != "primary" || c.GetGeneration() != 1 || c.GetMounted() {
		t.Fatalf("n1's stale copy changed or was mounted: %+v", c)
	}

	// Once n2 answers, the volume comes to n1 with n2's files.
	e.returnNode("n2")
	var dir3 string
	if err := whileUnavailable(func() (err error) { dir3, err = e.publish(id, "n1"); return err }); err != nil {
		t.Fatalf("publishing %s on n1 once n2 is back: %v", id, err)
	}
	if got := e.checksums("n1", dir3); got != newest {
		t.Fatalf("n1 has:\n%s\nwant n2's newest:\n%s", got, newest)
	}
}

// With the default policy, manual, publishing keeps failing with a clear
// message until the operator promotes a replica. The workload stopped
// before its node was lost: its last writes reached the replica with the
// unpublish's flush (docs/migration.md, "Flush at unpublish"), although
// nothing else pushed them (no schedule here), and the failover loses
// none of them.
func TestFailoverManual(t *testing.T) {
	t.Parallel()
	e := startFlushing(t)
	id, dir := e.createWritten("careful", nil, "echo hello > a")
	e.replicate(id, "n1", "n2")
	e.write("n1", dir, "echo stopped > b")
	replicated := e.copyOn(id, "n2").GetLastSnapshot()
	e.unpublish(id, "n1")
	waitFor(t, 30*time.Second, "the unpublish's flush to reach n2", func() bool { return e.copyOn(id, "n2").GetLastSnapshot() != replicated })
	e.loseNode("n1")

	for i := 0; i < 2; i++ {
		_, err := e.publish(id, "n3")
		wantCode(t, err, codes.Unavailable, "zfs-controller promote -node n2 "+id)
	}
	if out := e.promote(id, "n2"); !strings.Contains(out, "node n2 is the primary now (generation 2)") {
		t.Errorf("promote output: %s", out)
	}
	dir3 := e.mustPublish(id, "n3") // moves on from n2
	if got := guesttest.Exec(t, e.node("n3"), "cat "+dir3+"/a "+dir3+"/b"); got != "hello\nstopped\n" {
		t.Fatalf("n3 reads %q, want the file replicated by a push and the one by the flush", got)
	}
	// The lost node's copy is still a primary of generation 1 in its pool,
	// until the node returns and its workload is stopped: then it is set
	// aside.
	e.waitPrimaries(id, "n1(gen 1)", "n3(gen 3)")
	e.returnNode("n1")
	e.unpublish(id, "n1")
	e.settled(id, "n3", "n3(gen 3)")
}

// settled publishes the volume on nodeID, as Nomad retries a claim, until
// the primaries are exactly want: a returning node's connection may take a
// few seconds to come back (TCP retransmits its SYN).
func (e *env) settled(id, nodeID, want string) {
	e.t.Helper()
	var got []string
	for deadline := time.Now().Add(45 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Second) {
		if _, err := e.controller().ControllerPublishVolume(e.ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeID, VolumeCapability: writer}); err != nil && !guestcluster.CatchingUp(err) {
			e.t.Fatal(err)
		}
		if got = e.primaries(id); strings.Join(got, " ") == want {
			return
		}
	}
	e.t.Fatalf("primaries: %v, want [%s]", got, want)
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// A move interrupted by a killed sender or receiver is finished by the
// next publish: exactly one primary, every file there. A killed
// controller: TestAMoveWhoseControllerDiesEnds.
func TestInterruptedMoves(t *testing.T) {
	t.Parallel()
	e := start(t)
	tests := []struct {
		name string
		kill func()
		// revive undoes kill before the retry.
		revive func()
	}{
		{"sender", func() { e.node("n1").Kill() }, func() { e.returnNodeProcess("n1") }},
		{"receiver", func() { e.node("n2").Kill() }, func() { e.returnNodeProcess("n2") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e.t = t
			id := e.create("interrupted-"+tt.name, nil)
			dir := e.mustPublish(id, "n1")
			// A fresh replica on n2 sends the move straight to its final
			// step (no catch-up, docs/migration.md), which then carries
			// the 96 MiB written after it: the kill hits the final send.
			e.replicate(id, "n1", "n2")
			e.write("n1", dir, guesttest.RandomFile("blob", 96)+" && echo end > z")
			before := e.checksums("n1", dir)
			e.unpublish(id, "n1")

			errc := make(chan error, 1)
			publishCtx, cancelPublish := context.WithCancel(e.ctx)
			defer cancelPublish()
			go func() { _, err := e.publishWithin(publishCtx, id, "n2"); errc <- err }()
			e.waitForTransfer(id, "n1")
			tt.kill()
			// Published ahead of the move's end, the stage on n2 waits for
			// a promotion the kill stopped, up to two minutes before it
			// answers Unavailable (node/csiserver.promotedAfter); the retry below
			// is what Nomad would do meanwhile. What fails at once fails.
			time.AfterFunc(2*time.Second, cancelPublish)
			err := <-errc
			t.Logf("publish interrupted by killing the %s: %v", tt.name, err)
			if got := e.primaries(id); len(got) != 1 {
				t.Fatalf("after the kill the primaries are %v, want one", got)
			}
			tt.revive()
			var dir2 string
			for attempt := 0; ; attempt++ { // as Nomad retries
				dir2, err = e.publish(id, "n2")
				if err == nil || attempt == 5 {
					break
				}
				t.Logf("retry %d: %v", attempt, err)
				time.Sleep(2 * time.Second)
			}
			if err != nil {
				t.Fatal(err)
			}
			if after := e.checksums("n2", dir2); after != before {
				t.Fatalf("files differ after the interrupted move:\n%s\n%s", before, after)
			}
			e.waitPrimaries(id, "n2(gen 2)")
			e.unpublish(id, "n2")
		})
	}
}

// TestCatchUpBlocksNoOtherVolume: a move whose target lacks the data
// answers within seconds, FailedPrecondition, while the data streams in
// the background; meanwhile a create and a publish of another volume
// complete before the catch-up does; the publish retried after the
// catch-up finishes the move with every file there.
//
// "Before the catch-up does" is the test, not a time bound: a catch-up
// that held the controller would hold the other volume's calls until its
// end, and the move's next publish would then find it done. (A bound of
// four times the calls' usual time failed at random: under emulation the
// stream's own CPU slows every call beside it.)
func TestCatchUpBlocksNoOtherVolume(t *testing.T) {
	e := start(t)
	e.throttle("n1", "3M") // 48 MiB at 3 MiB/s: about sixteen seconds of catch-up
	id, dir := e.createWritten("bulk", nil, guesttest.RandomFile("blob", 48)+" && echo end > z")
	before := e.checksums("n1", dir)
	e.unpublish(id, "n1")

	began := time.Now()
	_, err := e.controller().ControllerPublishVolume(e.ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "n2", VolumeCapability: writer})
	answered := time.Since(began)
	if !guestcluster.CatchingUp(err) || answered > 15*time.Second {
		t.Fatalf("publish of a 48 MiB volume on a node without it: %v after %s, want FailedPrecondition (catching up) within seconds", err, answered)
	}
	t.Logf("the move's first publish answered after %s: %v", answered.Round(time.Millisecond), err)
	began = time.Now()
	other := e.create("meanwhile", nil)
	if _, err := e.controller().ControllerPublishVolume(e.ctx, &csi.ControllerPublishVolumeRequest{VolumeId: other, NodeId: "n1", VolumeCapability: writer}); err != nil {
		t.Fatalf("publishing another volume beside the catch-up: %v", err)
	}
	t.Logf("create and publish of another volume beside the catch-up: %s", time.Since(began).Round(time.Millisecond))
	// Still moving: refused with the progress, or, near the end, granted
	// ahead of it (docs/migration.md, "Publishing ahead of a move's end").
	resp, err := e.controller().ControllerPublishVolume(e.ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "n2", VolumeCapability: writer})
	if _, ahead := resp.GetPublishContext()[contract.PublishContextAfterGeneration]; !guestcluster.CatchingUp(err) && !ahead {
		t.Fatalf("the catch-up ended before another volume's create and publish did (%v, %v): either the catch-up holds the controller, or it was too short to try anything beside it (send more)", resp, err)
	}

	dir2 := e.mustPublish(id, "n2") // retried until the catch-up is done
	if after := e.checksums("n2", dir2); after != before {
		t.Fatalf("files differ after the move:\n%s\n%s", before, after)
	}
	e.waitPrimaries(id, "n2(gen 2)")
	e.unpublish(id, "n2")
}

// throttle restarts the node with its pushes limited to rate
// (-replication-bandwidth), and without the limit when the test ends.
func (e *env) throttle(nodeID, rate string) {
	e.t.Helper()
	if err := e.node(nodeID).RestartWith("-replication-bandwidth=" + rate); err != nil {
		e.t.Fatal(err)
	}
	e.awaitControllerReaches(nodeID)
	e.t.Cleanup(func() {
		if err := e.node(nodeID).RestartWith("-replication-bandwidth=0"); err != nil {
			e.t.Error(err)
		}
	})
}

func (e *env) returnNodeProcess(nodeID string) {
	e.t.Helper()
	if err := e.node(nodeID).Start(); err != nil {
		e.t.Fatal(err)
	}
	e.awaitControllerReaches(nodeID)
}

// awaitControllerReaches waits until the controller reaches nodeID's
// agent again (its capacity counts) after the node's process restarted.
// The controller's calls during the restart put the node in an outage,
// and it sees the node back within about half a second of its answering
// (cluster's outages); a call before that finds the node down, which a
// test of something else must not meet.
func (e *env) awaitControllerReaches(nodeID string) {
	e.t.Helper()
	req := &csi.GetCapacityRequest{Parameters: map[string]string{contract.ParamNode: nodeID}}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := e.controller().GetCapacity(e.ctx, req)
		if err == nil && resp.GetAvailableCapacity() > 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("the controller did not reach node %s within 30 s of its restart: %v, %v", nodeID, resp, err)
		}
	}
}

// waitForTransfer waits until the node sends the volume.
func (e *env) waitForTransfer(id, nodeID string) {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		st, err := e.agent(nodeID).Status(e.ctx, &pb.StatusRequest{})
		if err == nil {
			for _, tr := range st.GetTransfers() {
				if tr.GetVolumeId() == id && tr.GetBytes() > 8<<20 {
					return
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	e.t.Fatalf("node %s reported no transfer of volume %s past 8 MiB within 60 s: the move's final send never started", nodeID, id)
}

// TestDeleteWithANodeDown: with a node that holds a replica down,
// DeleteVolume touches nothing and answers Unavailable naming it (the CO
// retries); once it is back, the delete removes every copy and answers
// OK, and a retry answers OK again.
func TestDeleteWithANodeDown(t *testing.T) {
	t.Parallel()
	e := start(t)
	id, _ := e.createWritten("doomed", nil, "echo keep-until-deleted > a")
	e.replicate(id, "n1", "n2")
	e.unpublish(id, "n1")

	e.loseNode("n2")
	deleteVolume := func() error {
		_, err := e.controller().DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: id})
		return err
	}
	wantCode(t, whileNodeDown(deleteVolume), codes.Unavailable, e.node("n2").AgentAddress)
	if c := e.copyOn(id, "n1"); c.GetRole() != "primary" {
		t.Fatalf("n1's primary after the refused delete: %+v", c)
	}

	e.returnNode("n2")
	if err := onceNodeBack(deleteVolume); err != nil {
		t.Fatalf("delete with every node back: %v", err)
	}
	if left := guesttest.Run(t, "sh", "-c", "zfs list -H -o name -t all | grep -- "+id+" || true"); strings.TrimSpace(left) != "" {
		t.Fatalf("copies left after the delete:\n%s", left)
	}
	if _, err := e.controller().DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Errorf("a repeated delete: %v, want OK", err)
	}
}

// whileNodeDown calls call, for up to 30 s, until it answers Unavailable,
// and returns its last answer: until the controller notices a node is
// gone, a call may fail differently; the verdict that counts is the one
// naming the node.
func whileNodeDown(call func() error) error {
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		if err = call(); status.Code(err) == codes.Unavailable {
			break
		}
	}
	return err
}

// onceNodeBack calls call, for up to a minute, until it succeeds, and
// returns its last answer: a node just back takes a moment to answer.
// whileUnavailable calls call again, every half second for up to a
// minute, while it fails Unavailable: the controller reaches a node back
// from an outage at its next redial (cluster.outages), and a CO retries
// such a call.
func whileUnavailable(call func() error) error {
	err := call()
	for deadline := time.Now().Add(time.Minute); status.Code(err) == codes.Unavailable && time.Now().Before(deadline); err = call() {
		time.Sleep(500 * time.Millisecond)
	}
	return err
}

func onceNodeBack(call func() error) error {
	var err error
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Second) {
		if err = call(); err == nil {
			break
		}
	}
	return err
}

// TestPartitionedPrimaryTurnsReadOnly (G1): a primary whose node is cut
// off from its peers stops taking writes within about a lease (writes
// fail with EROFS instead of diverging), and takes them again once its
// link is back and a majority confirms that no newer copy was promoted.
// The times are logged: L, the time to the read-only switch, the time to
// writable again.
func TestPartitionedPrimaryTurnsReadOnly(t *testing.T) {
	const lease = 8 * time.Second
	e := startWithLease(t, lease)
	id, dir := e.createWritten("partitioned", nil, "echo before > a")
	n1 := e.node("n1")
	probe := func() error { return e.tryWrite("n1", dir) }
	cut := e.cutOffWhenLeased("n1", lease, probe)
	waitFor(t, 3*lease, "writes on n1 to fail after its link was cut", func() bool { return probe() != nil })
	fenced := time.Since(cut)
	// The node's health check (what Nomad's service check asks) says it
	// cannot serve its volumes, and why.
	if got := health(t, n1); !strings.Contains(got, " 503 ") || !strings.Contains(got, "lease: no lease") {
		t.Errorf("the cut-off node's %s answered:\n%s\nwant 503 naming its lease", csiplugin.HealthPath, got)
	}
	if out, _ := n1.Exec("cd " + dir + " && echo x > q 2>&1"); !strings.Contains(out, "Read-only file system") {
		t.Errorf("a write on the cut-off node failed with %q, want EROFS", out)
	}
	_, err := e.stage(id, "n1", map[string]string{"generation": "1"})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("staging on the cut-off node: %v, want Unavailable", err)
	}

	if err := n1.RestoreLink(); err != nil {
		t.Fatal(err)
	}
	restored := time.Now()
	waitFor(t, 3*lease, "writes on n1 to succeed after its link came back", func() bool { return probe() == nil })
	lifted := time.Since(restored)
	if got := health(t, n1); !strings.Contains(got, " 200 ") {
		t.Errorf("the node's %s once its link is back and it writes again:\n%s\nwant 200", csiplugin.HealthPath, got)
	}
	t.Logf("lease %s: read-only %.1f s after the link was cut, writable %.1f s after it came back", lease, fenced.Seconds(), lifted.Seconds())
	if fenced > lease+lease/2 {
		t.Errorf("the read-only switch took %s, want at most 1.5 leases (%s)", fenced, lease+lease/2)
	}
	if got := guesttest.Exec(t, n1, "cat "+dir+"/a"); strings.TrimSpace(got) != "before" {
		t.Errorf("the file written before the cut reads %q", got)
	}
	e.unpublish(id, "n1")
}

// health asks node n's health endpoint from inside its namespaces (its
// link may be down) and returns the HTTP answer, status line first.
func health(t *testing.T, n *guestcluster.Node) string {
	t.Helper()
	host, _, _ := strings.Cut(strings.TrimPrefix(n.Metrics, "http://"), "/")
	// nc ends at its input's end: the sleep keeps it open for the answer.
	out, err := n.Exec("(printf 'GET " + csiplugin.HealthPath + " HTTP/1.0\\r\\n\\r\\n'; sleep 3) | nc " + strings.Replace(host, ":", " ", 1))
	if err != nil {
		t.Fatalf("asking %s's %s: %v\n%s", n.ID, csiplugin.HealthPath, err, out)
	}
	return out
}

// startWithLease starts three nodes that keep leases of length lease
// (each other's peers), with extra zfs-node flags, and no schedule.
func startWithLease(t *testing.T, lease time.Duration, nodeArgs ...string) *env {
	c := guesttest.StartCluster(t, 3, guestcluster.Options{ControllerArgs: explicitPushes(), Lease: lease, NodeArgs: nodeArgs})
	return &env{t: t, c: c, ctx: context.Background()}
}

// tryWrite writes and syncs a file in dir on nodeID; a read-only copy
// makes it fail.
func (e *env) tryWrite(nodeID, dir string) error {
	_, err := e.node(nodeID).Exec("cd " + dir + " && echo probe > p && sync")
	return err
}

// cutOffWhenLeased waits until probe's write on nodeID succeeds, the lease
// held (the first beats after start), then cuts the node's link; it
// returns when the link went.
func (e *env) cutOffWhenLeased(nodeID string, lease time.Duration, probe func() error) time.Time {
	e.t.Helper()
	waitFor(e.t, 3*lease, "a write on "+nodeID+" with its peers answering", func() bool { return probe() == nil })
	if err := e.node(nodeID).CutLink(); err != nil {
		e.t.Fatal(err)
	}
	return time.Now()
}

// waitFor polls cond every 200 ms for up to d; the failure names what it
// waited for.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("waited %s for %s", d, what)
}

// TestFailoverWaitsForTheLease (G1): the primary's node is cut off with
// its workload still running. Auto failover is refused (Unavailable, the
// CO retries) until a majority attests that node's silence for the lease
// and its margin, by which time it has made its copy read-only: at no
// moment can both copies take writes. When its link returns, the old copy
// stays read-only: a majority promised a newer generation.
func TestFailoverWaitsForTheLease(t *testing.T) {
	// The smallest margin config accepts with this lease (config.MinLeaseMargin).
	const lease, margin = 8 * time.Second, 19 * time.Second
	e := startWithLease(t, lease, "-lease-margin="+margin.String())
	id, dir := e.createWritten("leased", map[string]string{"failover": "auto"}, "echo replicated > a")
	e.failoverWaitsForTheLease(id, dir, "n1", "n2", lease, margin)
}

// TestFailoverCountsTheWitnesses is TestFailoverWaitsForTheLease with a
// witness set (docs/safety.md, "Witnesses"): four nodes, n1, n2 and n4
// the witnesses, the primary on n3, which pings only them, and its
// replica on n1. n2 is cut off first: n1 and n4 are a majority of the
// witnesses but half of the nodes, so counted over every node nothing
// would be failed over, nor would n1 hold its lease. Then n3 is cut
// off: it loses its lease and is failed over to n1 once n1 and n4
// attest its silence by its node identity, never before it is
// read-only. Outside make test (OUTSIDE_MAKE_TEST): the simulation, the
// explorer and the lease's tests check the rule; this proves the real
// binaries' wiring (the flag, the digest in pings over mutual TLS, the
// controller counting what GetNode reports).
func TestFailoverCountsTheWitnesses(t *testing.T) {
	const lease, margin = 8 * time.Second, 19 * time.Second
	c := guesttest.StartCluster(t, 4, guestcluster.Options{ControllerArgs: explicitPushes(), Lease: lease, Witnesses: []int{1, 2, 4},
		NodeArgs: []string{"-lease-margin=" + margin.String()}})
	e := &env{t: t, c: c, ctx: context.Background()}
	id := e.create("witnessed", map[string]string{"failover": "auto", "node": "n3"})
	dir := e.mustPublish(id, "n3")
	e.write("n3", dir, "echo replicated > a")
	if err := e.node("n2").CutLink(); err != nil {
		t.Fatal(err)
	}
	e.failoverWaitsForTheLease(id, dir, "n3", "n1", lease, margin)
}

// failoverWaitsForTheLease replicates volume id, published at dir on
// primary, to replica; cuts primary off; and checks that the failover to
// replica comes only after primary's copy turned read-only, with what
// was replicated, and that the old copy stays read-only once its link
// is back.
func (e *env) failoverWaitsForTheLease(id, dir, primary, replica string, lease, margin time.Duration) {
	t := e.t
	t.Helper()
	e.replicate(id, primary, replica)
	replicated := e.checksums(primary, dir)
	node := e.node(primary)
	probe := func() error { return e.tryWrite(primary, dir) }
	cut := e.cutOffWhenLeased(primary, lease, probe)
	readOnly := make(chan time.Duration, 1)
	go func() {
		for time.Since(cut) < 5*lease {
			if probe() != nil {
				readOnly <- time.Since(cut)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		readOnly <- -1
	}()
	var dir2 string
	var err error
	for time.Since(cut) < 5*lease {
		if dir2, err = e.publish(id, replica); err == nil {
			break
		}
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("publish on %s while %s is cut off: %v, want Unavailable until the failover", replica, primary, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("no failover %s after %s was cut off: %v", 5*lease, primary, err)
	}
	failedOver := time.Since(cut)
	fenced := <-readOnly
	t.Logf("lease %s, margin %s: %s read-only %.1f s after its link was cut, failover to %s %.1f s after", lease, margin, primary, fenced.Seconds(), replica, failedOver.Seconds())
	if fenced < 0 || fenced >= failedOver {
		t.Fatalf("%s turned read-only after %s, the failover came after %s: both could take writes", primary, fenced, failedOver)
	}
	if got := e.checksums(replica, dir2); got != replicated {
		t.Errorf("after the failover %s has:\n%s\nwant what was replicated:\n%s", replica, got, replicated)
	}

	if err := node.RestoreLink(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(lease); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if probe() == nil {
			t.Fatalf("%s's stale copy took writes again after its link came back", primary)
		}
	}
}
