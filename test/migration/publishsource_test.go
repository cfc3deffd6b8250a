package migration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// TestPublishToTheSourceDuringTheFinalStep, on real ZFS with the shipped
// defaults (background moves, publish-ahead): while a move's final step
// runs in the background (n1's pushes capped, so the last increment takes
// seconds), Nomad places an allocation on the source:
// ControllerPublishVolume to n1 is refused, retryably, naming the move,
// and so is a stage there; at no moment do two copies take writes; the
// move ends with one primary on n2 and every file there, and a publish to
// n1 after it is decided as any move back is.
func TestPublishToTheSourceDuringTheFinalStep(t *testing.T) {
	e := start(t)
	e.throttle("n1", "4M") // the final increment of 48 MiB takes about 12 s
	id, dir := e.createWritten("source-published", nil, "echo one > a")
	// A fresh replica sends the move straight to its final step, which
	// then carries what is written after it.
	e.replicate(id, "n1", "n2")
	e.write("n1", dir, guesttest.RandomFile("blob", 48)+" && echo end > z")
	before := e.checksums("n1", dir)
	e.unpublish(id, "n1")

	moved := make(chan error, 1)
	var dir2 string
	go func() {
		var err error
		dir2, err = e.publish(id, "n2")
		moved <- err
	}()
	e.waitForTransfer(id, "n1")

	// Nomad places an allocation on the source meanwhile.
	began := time.Now()
	_, err := e.controller().ControllerPublishVolume(e.ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "n1", VolumeCapability: writer})
	took := time.Since(began)
	t.Logf("publish to the source during the final step: %v after %s", err, took.Round(time.Millisecond))
	wantCode(t, err, codes.FailedPrecondition, "is moving from node n1 to node n2 (final step running)")
	if took > 5*time.Second {
		t.Errorf("the refusal took %s: it should answer from memory, without waiting for the move", took)
	}
	// The node refuses too, whatever publish context it is given.
	_, err = e.stageAs(id, "n1", "again", map[string]string{"generation": "1"})
	wantCode(t, err, codes.FailedPrecondition, "is moving to node n2")
	if w := e.writablePrimaries(id); len(w) > 0 {
		t.Fatalf("during the final step the writable primaries are %v, want none (n1 fenced, n2 not promoted yet)", w)
	}
	if sent, ok := e.transferBytes(id, "n1"); !ok {
		t.Fatal("the final step's push ended before the publish to the source was tried: nothing was shown; send more or cap lower")
	} else {
		t.Logf("the final step had sent %d MiB of about 48 when the source's publish was refused", sent>>20)
	}

	// Nomad retries the source's claim while the move runs: every answer
	// is a refusal, and there is never more than one writable copy. The
	// retries stop well before the push ends (32 of 48 MiB): one that
	// came after the move ended, before n2's stage, would start a move
	// back, which is not what this test is about.
	refusals := 0
	for {
		if sent, ok := e.transferBytes(id, "n1"); !ok || sent > 32<<20 {
			break
		}
		_, err := e.controller().ControllerPublishVolume(e.ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "n1", VolumeCapability: writer})
		wantCode(t, err, codes.FailedPrecondition, "is moving from node n1 to node n2 (final step running)")
		refusals++
		if w := e.writablePrimaries(id); len(w) > 0 {
			t.Fatalf("during the final step the writable primaries are %v, want none", w)
		}
		time.Sleep(time.Second)
	}
	if err := <-moved; err != nil {
		t.Fatalf("the move to n2: %v", err)
	}
	t.Logf("the source's claim was refused %d more times while the move ran", refusals)
	if after := e.checksums("n2", dir2); after != before {
		t.Fatalf("files differ after the move:\nn1:\n%s\nn2:\n%s", before, after)
	}
	e.waitPrimaries(id, "n2(gen 2)")
	e.waitRole(id, "n1", "replica")
	if w := e.writablePrimaries(id); strings.Join(w, " ") != "n2" {
		t.Fatalf("after the move the writable primaries are %v, want n2 alone", w)
	}
	// Once the move has ended the source's claim is decided as a move
	// back: it waits for n2's allocation to end, after catching n1 up in
	// the background when n1's replica (the move's final snapshot) is
	// older than a minute (a slow machine's move).
	_, err = e.controller().ControllerPublishVolume(e.ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "n1", VolumeCapability: writer})
	if msg := status.Convert(err).Message(); status.Code(err) != codes.FailedPrecondition ||
		!strings.Contains(msg, "still published on node n2") && !strings.Contains(msg, "node n2 is sending it in the background") {
		t.Fatalf("the source's claim after the move: %v, want FailedPrecondition, a move back waiting for n2's allocation to end", err)
	}
	e.waitPrimaries(id, "n2(gen 2)")
	e.unpublish(id, "n2")
}

// transferBytes returns how much the node's running push of the volume
// has sent, and whether one runs.
func (e *env) transferBytes(id, nodeID string) (int64, bool) {
	e.t.Helper()
	st, err := e.agent(nodeID).Status(e.ctx, &pb.StatusRequest{})
	if err != nil {
		e.t.Fatalf("status of %s: %v", nodeID, err)
	}
	for _, tr := range st.GetTransfers() {
		if tr.GetVolumeId() == id {
			return tr.GetBytes(), true
		}
	}
	return 0, false
}

// stageAs stages and publishes the volume on nodeID in directories named
// after name, with publishContext.
func (e *env) stageAs(id, nodeID, name string, publishContext map[string]string) (string, error) {
	return guesttest.Mount(context.Background(), e.t, e.node(nodeID), id, name, publishContext)
}

// writablePrimaries lists the nodes whose copy of the volume is a primary
// that takes writes (role primary, readonly off), read from ZFS directly.
func (e *env) writablePrimaries(id string) []string {
	e.t.Helper()
	out := guesttest.Run(e.t, "sh", "-c", "zfs get -H -o name,property,value zfs-nomad:role,readonly -t filesystem | grep '/"+id+"\t' || true")
	roles, readonly := map[string]string{}, map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 3 {
			continue
		}
		node := e.nodeOf(f[0])
		if f[1] == "readonly" {
			readonly[node] = f[2]
		} else {
			roles[node] = f[2]
		}
	}
	var writable []string
	for _, n := range e.c.Nodes {
		if roles[n.ID] == "primary" && readonly[n.ID] == "off" {
			writable = append(writable, n.ID)
		}
	}
	return writable
}

// TestASecondInstancesPublishToTheSourceKeepsOnePrimary: the shipped
// controller job runs two instances, and the CO's publish back to a
// move's source may reach the one that does not run the move. While the
// first instance's final step pushes in the background (the source
// fenced, the target's generation reserved on a majority with the
// source's grant), Nomad places the allocation back on the source and
// its claim reaches the second instance. Whatever that instance answers,
// at no moment do two copies take writes, and the volume ends with one
// primary: the source, staged with every file, if the second instance's
// publish was granted (it superseded the move's promise, and the
// target's promotion is refused), or the target, if it was refused
// until the move ended.
func TestASecondInstancesPublishToTheSourceKeepsOnePrimary(t *testing.T) {
	e := start(t)
	e.throttle("n1", "4M") // the final increment of 32 MiB takes about 8 s
	id, dir := e.createWritten("two-instances", nil, "echo one > a")
	e.replicate(id, "n1", "n2") // a fresh replica: the move goes straight to its final step
	e.write("n1", dir, guesttest.RandomFile("blob", 32)+" && echo end > z")
	before := e.checksums("n1", dir)
	e.unpublish(id, "n1")
	_, endpoint, err := e.c.StartControllerInstance(2)
	if err != nil {
		t.Fatal(err)
	}
	second := csi.NewControllerClient(guesttest.Dial(t, endpoint))

	// The claim on n2 starts the move on the first instance, which runs
	// its final step in the background (granted ahead of its end, with
	// the shipped settings, or refused while it runs); the CO then gives
	// that claim up (the allocation goes back to n1).
	_, err = e.controller().ControllerPublishVolume(e.ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "n2", VolumeCapability: writer})
	if err != nil && !guestcluster.CatchingUp(err) {
		t.Fatalf("the publish that starts the move: %v; want it granted ahead or running in the background", err)
	}
	e.waitForTransfer(id, "n1")
	if c := e.copyOn(id, "n1"); c.GetMovingTo() != "n2" {
		t.Fatalf("n1's copy while its final push runs: %+v, want fenced for n2", c)
	}

	// The claim on n1 reaches the second instance, retried as Nomad
	// does, until it is granted or the move's push has ended.
	var granted *csi.ControllerPublishVolumeResponse
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
		resp, err := second.ControllerPublishVolume(e.ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "n1", VolumeCapability: writer})
		t.Logf("the second instance's publish on the source: %v", err)
		if w := e.writablePrimaries(id); len(w) > 1 {
			t.Fatalf("two writable primaries while both instances act: %v", w)
		}
		if err == nil {
			granted = resp
			break
		}
		if _, moving := e.transferBytes(id, "n1"); !moving || time.Now().After(deadline) {
			break
		}
	}
	if granted == nil {
		// Refused until the move's push ended: the move promotes n2.
		e.waitPrimaries(id, "n2(gen 2)")
		if w := e.writablePrimaries(id); strings.Join(w, " ") != "n2" {
			t.Fatalf("writable primaries after the move: %v, want n2 alone", w)
		}
		return
	}
	// Granted: the CO stages the volume on n1 at once, and the first
	// instance's final step must not promote n2 beside it.
	dir1, err := e.stage(id, "n1", granted.GetPublishContext())
	if err != nil {
		t.Fatalf("staging the source with the second instance's publish context: %v", err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		if w := e.writablePrimaries(id); len(w) > 1 {
			t.Fatalf("two writable primaries after the second instance's grant: %v", w)
		}
		if _, moving := e.transferBytes(id, "n1"); !moving || time.Now().After(deadline) {
			break
		}
	}
	time.Sleep(2 * time.Second) // the final step's promotion, had it one
	if got := e.primaries(id); strings.Join(got, " ") != "n1(gen 1)" {
		t.Fatalf("primaries after the second instance granted n1: %v, want n1's alone", got)
	}
	if after := e.checksums("n1", dir1); after != before {
		t.Fatalf("files differ on the source:\n%s\n%s", before, after)
	}
	if err := e.tryWrite("n1", dir1); err != nil {
		t.Fatalf("the staged source takes no write: %v", err)
	}
}
