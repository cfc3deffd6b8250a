package migration

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/cluster/clustertest"
	"github.com/zfs-nomad/zfs-nomad/internal/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/vocab"
)

// heldPushes makes the pushes of agent wait until release is closed (or
// their context ends), after reporting some progress; it counts them.
func heldPushes(agent *clustertest.FakeAgent, release chan struct{}) *atomic.Int32 {
	var pushes atomic.Int32
	agent.BeforePush = func(ctx context.Context, _ string, each func(agentclient.Progress)) error {
		pushes.Add(1)
		each(agentclient.Progress{Bytes: 1 << 30, TotalBytes: 3 << 30})
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return &pushes
}

// TestAMoveCatchesUpInTheBackground (issue 15): a publish on a node
// without a fresh replica starts a push of the primary there in the
// background and answers FailedPrecondition (Nomad retries it) saying how
// far it is, without fencing or promoting anything; retries meanwhile
// start no second push; the retry after it is done finishes the move.
func TestAMoveCatchesUpInTheBackground(t *testing.T) {
	var fakes clustertest.Fakes
	n1 := fakes.Add(agentclient.NodeInfo{NodeID: "n1"})
	n2 := fakes.Add(agentclient.NodeInfo{NodeID: "n2"})
	fakes.Add(agentclient.NodeInfo{NodeID: "n3"})
	id := n1.PutPrimary("big", 1)
	release := make(chan struct{})
	pushes := heldPushes(n1, release)
	m := New(fakes.Cluster(t), hclog.NewNullLogger())
	m.catchUpWait = 50 * time.Millisecond
	ctx := context.Background()

	for attempt := range 3 {
		_, err := m.Publish(ctx, id, "n2")
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "1.0 GiB of 3.0 GiB") {
			t.Fatalf("publish %d during the catch-up: %v, want FailedPrecondition with its progress", attempt, err)
		}
	}
	if got := pushes.Load(); got != 1 {
		t.Errorf("%d pushes during three publishes, want the one catch-up", got)
	}
	if c, _ := n1.Copy(id); c.Role != vocab.RolePrimary || c.MovingTo != "" {
		t.Errorf("n1's copy during the catch-up: %+v, want its unfenced primary", c)
	}

	close(release)
	var gen uint64
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if gen, err = m.Publish(ctx, id, "n2"); err == nil {
			break
		}
	}
	if err != nil || gen != 2 {
		t.Fatalf("publish after the catch-up: generation %d, %v; want 2", gen, err)
	}
	if c, _ := n2.Copy(id); c.Role != vocab.RolePrimary || c.Generation != 2 {
		t.Errorf("n2's copy after the move: %+v, want the primary of generation 2", c)
	}
}

// TestCatchUpsPerSourceAreBounded: a source node runs at most MaxCatchUps
// catch-ups at once; a move beyond them answers FailedPrecondition
// saying so, and starts once one is done.
func TestCatchUpsPerSourceAreBounded(t *testing.T) {
	var fakes clustertest.Fakes
	n1 := fakes.Add(agentclient.NodeInfo{NodeID: "n1"})
	fakes.Add(agentclient.NodeInfo{NodeID: "n2"})
	fakes.Add(agentclient.NodeInfo{NodeID: "n3"})
	first, second := n1.PutPrimary("first", 1), n1.PutPrimary("second", 1)
	release := make(chan struct{})
	heldPushes(n1, release)
	m := New(fakes.Cluster(t), hclog.NewNullLogger())
	m.catchUpWait = 50 * time.Millisecond
	m.MaxCatchUps = 1
	ctx := context.Background()

	if _, err := m.Publish(ctx, first, "n2"); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "in the background") {
		t.Fatalf("first move: %v, want its catch-up running", err)
	}
	if _, err := m.Publish(ctx, second, "n3"); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "at most 1 at once") {
		t.Fatalf("second move from the same node: %v, want it to wait for the first's catch-up", err)
	}
	close(release)
	for _, move := range []struct{ id, to string }{{first, "n2"}, {second, "n3"}} {
		var err error
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if _, err = m.Publish(ctx, move.id, move.to); err == nil {
				break
			}
		}
		if err != nil {
			t.Errorf("move of %s to %s after the first catch-up: %v", move.id, move.to, err)
		}
	}
}

// TestAFailedCatchUpIsRetried: a catch-up that fails is reported as
// retryable, and the next publish starts another.
func TestAFailedCatchUpIsRetried(t *testing.T) {
	var fakes clustertest.Fakes
	n1 := fakes.Add(agentclient.NodeInfo{NodeID: "n1"})
	fakes.Add(agentclient.NodeInfo{NodeID: "n2"})
	fakes.Add(agentclient.NodeInfo{NodeID: "n3"})
	id := n1.PutPrimary("flaky", 1)
	n1.RefuseTimes("Replicate", 1, errdefs.Wrap(errdefs.ErrUnavailable, "the stream broke"))
	m := New(fakes.Cluster(t), hclog.NewNullLogger())
	ctx := context.Background()

	if _, err := m.Publish(ctx, id, "n2"); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "the stream broke") {
		t.Fatalf("publish whose catch-up failed: %v, want FailedPrecondition saying why", err)
	}
	if gen, err := m.Publish(ctx, id, "n2"); err != nil || gen != 2 {
		t.Fatalf("the retry: generation %d, %v; want the move done at generation 2", gen, err)
	}
}
