package migration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
)

// TestAMoveGrantedAheadOutlivesItsController: a controller grants a
// publish ahead of its move's end and dies in the catch-up. No publish
// retry comes (the CO considers the volume published); the node's stage
// waits for its copy's promotion. The next controller instance, once it
// holds the work lease and the stage has waited long enough, finishes the
// move (the catch-up resumes what arrived), and the stage mounts the
// volume with every file.
func TestAMoveGrantedAheadOutlivesItsController(t *testing.T) {
	t.Parallel()
	e := start(t)
	// 48 MiB at 3 MiB/s: a catch-up of 16 s, granted ahead at the first
	// retry (within the shipped two minutes) and killed well before its
	// end. The stage is mounted about 40 s after the kill however long
	// the catch-up: the dead instance's grants run out, then the stage
	// waits AdoptAwaitedAfter.
	e.throttle("n1", "3M")
	id, dir := e.createWritten("granted", nil, guesttest.RandomFile("blob", 48)+" && echo end > z")
	before := e.checksums("n1", dir)
	e.unpublish(id, "n1")

	var granted map[string]string
	for deadline := time.Now().Add(2 * time.Minute); granted == nil; time.Sleep(time.Second) {
		resp, err := e.controller().ControllerPublishVolume(e.ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "n2", VolumeCapability: writer})
		switch {
		case resp.GetPublishContext()[contract.PublishContextAfterGeneration] != "":
			granted = resp.GetPublishContext()
		case err == nil:
			t.Fatalf("the move ended before a publish was granted ahead of it (%v): throttle it more", resp.GetPublishContext())
		case !guestcluster.CatchingUp(err) || time.Now().After(deadline):
			t.Fatalf("publish on n2: %v", err)
		}
	}
	t.Logf("published ahead of the move's end: %v", granted)

	e.c.Controller.Kill()
	killed := time.Now()
	if err := e.c.StartController(); err != nil {
		t.Fatal(err)
	}
	target := e.stageAsNomad(id, "n2", granted)
	t.Logf("FIGURE a move granted ahead, its controller killed in the catch-up: staged on n2 %s after the kill", time.Since(killed).Round(100*time.Millisecond))
	if after := e.checksums("n2", target); after != before {
		t.Fatalf("files differ after the move:\n%s\n%s", before, after)
	}
	e.waitPrimaries(id, "n2(gen 2)")
}

// TestARetryOnAnotherInstanceFollowsTheMove: with two controller
// instances, the publish that starts a move lands on one and the CO's
// retries on the other. The other's own move job finds the volume's push
// running on the source: its refusals tell that push's progress, it
// grants the publish (ahead of the move's end, from that push's estimate,
// or once the volume moved), and the node's stage mounts the volume with
// every file.
func TestARetryOnAnotherInstanceFollowsTheMove(t *testing.T) {
	t.Parallel()
	e := start(t)
	// 64 MiB at 2 MiB/s: about 32 s. The second instance grants ahead
	// only within the last 20 s (the shipped two minutes would grant at
	// its first estimate), so its refusals in the first 12 s show what it
	// reports of the running push.
	e.throttle("n1", "2M")
	id, dir := e.createWritten("followed", nil, guesttest.RandomFile("blob", 64)+" && echo end > z")
	before := e.checksums("n1", dir)
	e.unpublish(id, "n1")
	_, endpoint, err := e.c.StartControllerInstance(2, "-move-publish-ahead", "20s")
	if err != nil {
		t.Fatal(err)
	}
	second := csi.NewControllerClient(guesttest.Dial(t, endpoint))
	publish := &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "n2", VolumeCapability: writer}
	if _, err := e.controller().ControllerPublishVolume(e.ctx, publish); !guestcluster.CatchingUp(err) {
		t.Fatalf("the publish that starts the move, on the first instance: %v; want it catching up in the background", err)
	}

	// Nomad's retries, until the publish is granted: ahead of the move's
	// end, or (when the move ended between two retries) after it.
	var followed string
	var published map[string]string
	for deadline := time.Now().Add(2 * time.Minute); published == nil; time.Sleep(time.Second) {
		resp, err := second.ControllerPublishVolume(e.ctx, publish)
		switch {
		case err == nil:
			published = resp.GetPublishContext()
		case !guestcluster.CatchingUp(err) || time.Now().After(deadline):
			t.Fatalf("the retry on the second instance: %v", err)
		case strings.Contains(err.Error(), "by the push already running there"):
			followed = status.Convert(err).Message()
		}
	}
	if followed == "" {
		t.Fatal("the second instance never told the running push's progress before it published the volume")
	}
	t.Logf("the second instance, before its grant: %s", followed)
	t.Logf("published by the second instance: %v", published)

	target := e.stageAsNomad(id, "n2", published)
	if after := e.checksums("n2", target); after != before {
		t.Fatalf("files differ after the move:\n%s\n%s", before, after)
	}
	e.waitPrimaries(id, "n2(gen 2)")
}

// stageAsNomad stages volume id on nodeID with the publish context as
// Nomad does: two minutes a try, Unavailable retried, three tries. It
// returns the staging path.
func (e *env) stageAsNomad(id, nodeID string, publishContext map[string]string) string {
	e.t.Helper()
	for try := 1; ; try++ {
		ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
		target, err := e.stageWithin(ctx, id, nodeID, publishContext)
		cancel()
		if err == nil {
			return target
		}
		if status.Code(err) != codes.Unavailable || try == 3 {
			e.t.Fatalf("stage %d on %s: %v", try, nodeID, err)
		}
		e.t.Logf("stage %d: %v; retrying as Nomad does", try, err)
	}
}
