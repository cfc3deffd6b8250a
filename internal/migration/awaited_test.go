package migration

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/vocab"
)

// TestAnAwaitedMoveIsFinishedByAnotherInstance: an instance grants a
// publish ahead of a move's end and dies in its catch-up; the node's
// stage waits. Another instance finishes the move once the stage has
// waited AdoptAwaitedAfter and no push of the volume runs: not before,
// and not while the first instance's push still runs.
func TestAnAwaitedMoveIsFinishedByAnotherInstance(t *testing.T) {
	tests := []struct {
		name      string
		waited    time.Duration
		firstDies bool // else its push still runs
		wantMoved bool
	}{
		{"the first instance died, the stage waited long enough", AdoptAwaitedAfter, true, true},
		{"the stage has not waited long enough", AdoptAwaitedAfter - time.Second, true, false},
		{"the first instance still pushes", time.Minute, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fakes, n1, n2 := threeNodes()
			id := n1.PutPrimary("big", 1)
			n1.BeforePush = func(ctx context.Context, _ string, each func(agentclient.Progress)) error {
				each(agentclient.Progress{Bytes: 1 << 30, TotalBytes: 3 << 30})
				<-ctx.Done() // a catch-up that runs until its instance dies
				return ctx.Err()
			}
			first := New(fakes.Cluster(t), hclog.NewNullLogger())
			first.CatchUpWait, first.PublishAheadWithin = time.Millisecond, time.Minute
			tenSecondsIntoACatchUp(t, first, id)
			if p, err := first.PublishAhead(context.Background(), id, "n2"); err != nil || p.After != 1 {
				t.Fatalf("PublishAhead: %+v, %v; want granted ahead", p, err)
			}
			n2.SetAwaited([]agentclient.AwaitedPromotion{{VolumeID: id, AfterGeneration: 1, Waiting: tt.waited}})
			if tt.firstDies {
				first.Stop()
			} else {
				defer first.Stop()
			}
			n1.BeforePush = nil // the next push goes through

			second := New(fakes.Cluster(t), hclog.NewNullLogger())
			second.CatchUpWait = time.Second
			second.FinishAwaitedMoves(context.Background())
			moved := false
			for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline) && !moved; time.Sleep(10 * time.Millisecond) {
				c, _ := n2.Copy(id)
				moved = c.Role == vocab.RolePrimary && c.Generation == 2
			}
			if moved != tt.wantMoved {
				c1, _ := n1.Copy(id)
				c2, _ := n2.Copy(id)
				t.Fatalf("moved %v, want %v: n1 %+v, n2 %+v", moved, tt.wantMoved, c1, c2)
			}
			second.Stop()
		})
	}
}
