package migration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
)

// moveRecoveryBound is how long after its controller dies a move ends,
// with the volume staged on its target (docs/migration.md, "A move whose
// controller dies"): the CO's retries come 2, 4, 8, 16, 32 and 60 s
// apart, and a publish granted ahead of the move's end is finished by
// the instance holding the work lease after the stage waited 20 s.
const moveRecoveryBound = 2 * time.Minute

// TestAMoveWhoseControllerDiesEnds: the controller is killed at several
// moments of the publish that starts a move, in the catch-up, in the
// final step's fence and send, and after the promotion, and started
// again, with the binary's default configuration (nodes without peers)
// and with peers and leases. The CO's retries, as Nomad sends them, and
// its stage, as Nomad tries it, end with the volume staged on the target
// with every file, within moveRecoveryBound of the kill, and the target
// the only primary.
//
// It bounds a time, yet runs beside another test in a slot: the moves
// end 5 to 18 s after the kill (2026-12-07), far inside the bound, which
// is the CO's retry schedule's, not the guest's speed.
func TestAMoveWhoseControllerDiesEnds(t *testing.T) {
	t.Parallel()
	t.Run("no peers", func(t *testing.T) {
		controllerDiesInMoves(start(t), false)
	})
	// With peers and leases a move's reservation asks a majority and the
	// nodes confirm their primaries: the moments around the reservation
	// and the promotion, where the two configurations differ.
	t.Run("peers", func(t *testing.T) {
		controllerDiesInMoves(startWithLease(t, failoverLease, "-lease-margin="+failoverMargin.String()), true)
	})
}

// controllerDiesInMoves kills e's controller at moments of moves from n1
// to n2, all of them or (finalOnly) those of the final step.
func controllerDiesInMoves(e *env, finalOnly bool) {
	t := e.t
	var began time.Time
	after := func(d time.Duration) func(string) bool {
		return func(string) bool { return time.Since(began) >= d }
	}
	for i, tt := range []struct {
		when string
		// final: the moment is in the move's final step.
		final bool
		// replicaFirst: the target holds a replica before the data is
		// written, so the move goes straight to its final step, whose
		// send carries the data (no catch-up, docs/migration.md).
		replicaFirst bool
		kill         func(id string) bool // polled every 50 ms from the publish on
	}{
		{"0.5 s into the publish (catch-up)", false, false, after(500 * time.Millisecond)},
		{"once the source is fenced for the move (final step)", true, false, func(id string) bool { return e.copyOn(id, "n1").MovingTo != "" }},
		{"in the final send, past 8 MiB", true, true, func(id string) bool { sent, _ := e.transferBytes(id, "n1"); return sent > 8<<20 }},
		{"once the target is promoted, before the source's demotion", true, false, func(id string) bool { return e.copyOn(id, "n2").Role == "primary" }},
	} {
		if finalOnly && !tt.final {
			continue
		}
		id, dir := e.createWritten(fmt.Sprintf("dies-%d", i), nil, "echo start > a")
		if tt.replicaFirst {
			e.replicate(id, "n1", "n2")
		}
		e.write("n1", dir, guesttest.RandomFile("blob", 40)+" && echo end > z")
		before := e.checksums("n1", dir)
		e.unpublish(id, "n1")

		req := &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "n2", VolumeCapability: writer}
		began = time.Now()
		go func() { _, _ = e.controller().ControllerPublishVolume(e.ctx, req) }() // its answer dies with the controller
		for !tt.kill(id) {
			if time.Since(began) > time.Minute {
				t.Fatalf("killed %s: the moment never came", tt.when)
			}
			time.Sleep(50 * time.Millisecond)
		}
		e.c.Controller.Kill()
		killed := time.Now()
		t.Logf("controller killed %s, %s after the publish", tt.when, killed.Sub(began).Round(100*time.Millisecond))
		if err := e.c.StartController(); err != nil {
			t.Fatal(err)
		}
		granted := e.publishAsNomad(req, moveRecoveryBound)
		target := e.stageAsNomad(id, "n2", granted)
		took := time.Since(killed)
		t.Logf("FIGURE a move whose controller was killed %s: staged on n2 %s after the kill", tt.when, took.Round(100*time.Millisecond))
		if took > moveRecoveryBound {
			t.Errorf("killed %s: staged %s after the kill, want within %s", tt.when, took.Round(time.Second), moveRecoveryBound)
		}
		if got := e.checksums("n2", target); got != before {
			t.Fatalf("killed %s: files differ after the move:\n%s\n%s", tt.when, before, got)
		}
		e.waitPrimaries(id, "n2(gen 2)")
		t.Logf("FIGURE n2 the only primary %s after the kill", time.Since(killed).Round(100*time.Millisecond))
		e.unpublish(id, "n2")
	}
}

// publishAsNomad calls ControllerPublishVolume as Nomad's claim does
// (claimWithRetry, Nomad 1.11.1): again after 2, 4, 8, 16 and 32 s and
// every minute after that while it fails, for up to within. It returns
// the publish context.
func (e *env) publishAsNomad(req *csi.ControllerPublishVolumeRequest, within time.Duration) map[string]string {
	e.t.Helper()
	deadline := time.Now().Add(within)
	wait := 2 * time.Second
	for {
		ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
		resp, err := e.controller().ControllerPublishVolume(ctx, req)
		cancel()
		if err == nil {
			return resp.GetPublishContext()
		}
		if c := status.Code(err); c == codes.InvalidArgument || c == codes.NotFound || time.Now().Add(wait).After(deadline) {
			e.t.Fatalf("publish of %s on %s: %v", req.VolumeId, req.NodeId, err)
		}
		e.t.Logf("publish of %s on %s: %v; retrying in %s as Nomad does", req.VolumeId, req.NodeId, err, wait)
		time.Sleep(wait)
		wait = min(2*wait, time.Minute)
	}
}
