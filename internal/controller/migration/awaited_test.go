package migration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
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
			// A move is waited for up to 10 s (a loaded machine); none is
			// looked for during 3 s.
			moved, wait := false, 3*time.Second
			if tt.wantMoved {
				wait = 10 * time.Second
			}
			for deadline := time.Now().Add(wait); time.Now().Before(deadline) && !moved; time.Sleep(10 * time.Millisecond) {
				c, _ := n2.Copy(id)
				moved = c.Role == contract.RolePrimary && c.Generation == 2
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

// TestARetryOnAnotherInstanceFollowsTheRunningMove: one instance starts a
// volume's move and its catch-up runs; the CO's retry of the publish
// lands on another instance, whose own move finds the volume's push
// running on the source. It tells the first push's progress and estimate
// (not "nothing sent") and grants the publish ahead of the move's end on
// it; once the push ends, the volume arrives with one primary. Without
// following the running push, the second instance would report nothing
// sent and could not grant ahead.
func TestARetryOnAnotherInstanceFollowsTheRunningMove(t *testing.T) {
	fakes, n1, n2 := threeNodes()
	id := n1.PutPrimary("big", 1)
	release := make(chan struct{})
	pushes := heldPushes(n1, release) // 1 GiB of 3 sent, then held
	ctx := context.Background()

	first := New(fakes.Cluster(t), hclog.NewNullLogger())
	first.CatchUpWait = time.Millisecond
	defer first.Stop()
	if _, err := first.Publish(ctx, id, "n2"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("the publish that starts the move: %v, want FailedPrecondition (it runs in the background)", err)
	}
	for deadline := time.Now().Add(5 * time.Second); pushes.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first instance's catch-up did not start")
		}
	}

	second := New(fakes.Cluster(t), hclog.NewNullLogger())
	second.CatchUpWait, second.PublishAheadWithin = time.Millisecond, time.Minute
	// Ten seconds into the first push, as the second instance sees it:
	// 1 GiB of 3 in 10 s, about 20 s left.
	second.now = func() time.Time { return time.Now().Add(10 * time.Second) }
	defer second.Stop()
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_, err = second.Publish(ctx, id, "n2")
		if err != nil && strings.Contains(err.Error(), "by the push already running there") || time.Now().After(deadline) {
			break
		}
	}
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "1.0 GiB of 3.0 GiB, about 2") ||
		!strings.Contains(err.Error(), "catch-up for the move to n2") {
		t.Fatalf("the retry on the second instance: %v; want FailedPrecondition with the running push's progress and time left", err)
	}
	if p, err := second.PublishAhead(ctx, id, "n2"); err != nil || p != (Publication{After: 1}) {
		t.Fatalf("PublishAhead on the second instance 20 s before the move's end: %+v, %v; want granted after generation 1", p, err)
	}
	close(release)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if c, _ := n2.Copy(id); c.Role == contract.RolePrimary && c.Generation == 2 {
			break
		}
		if time.Now().After(deadline) {
			c, _ := n2.Copy(id)
			t.Fatalf("the volume did not arrive: n2 %+v; first's moves %+v, second's %+v", c, first.Moves(), second.Moves())
		}
	}
	if c, _ := n1.Copy(id); c.Role == contract.RolePrimary {
		t.Errorf("n1 still holds a primary after the move: %+v", c)
	}
}

// TestObserve: a move that waits for another push of its volume keeps
// waiting while that push progresses (runCatchUp gives up only after
// maxBusyWaits looks without progress).
func TestObserve(t *testing.T) {
	push := agentclient.Transfer{VolumeID: "v", Peer: "n2:7670", Bytes: 100, TotalBytes: 300, StartedUnix: 1_800_000_000, Purpose: "catch-up for the move to n2"}
	more := push
	more.Bytes = 200
	other := push
	other.StartedUnix, other.Purpose, other.Bytes = 1_800_000_050, "scheduled replication", 10
	tests := []struct {
		name           string
		seen           []agentclient.Transfer
		next           agentclient.Transfer
		wantProgressed bool
	}{
		{"the first look", nil, push, true},
		{"the same push sent more", []agentclient.Transfer{push}, more, true},
		{"the same push sent nothing more", []agentclient.Transfer{push, more}, more, false},
		{"another push", []agentclient.Transfer{push, more}, other, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &moveJob{}
			for _, s := range tc.seen {
				c.observe(s)
			}
			if got := c.observe(tc.next); got != tc.wantProgressed {
				t.Errorf("observe: progressed %v, want %v", got, tc.wantProgressed)
			}
			if c.bytes != tc.next.Bytes || c.total != tc.next.TotalBytes || c.via != tc.next.Purpose {
				t.Errorf("the move's progress after observing %+v: %d of %d via %q", tc.next, c.bytes, c.total, c.via)
			}
		})
	}
}
