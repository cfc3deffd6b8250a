package migration

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster/clustertest"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/metrics"
)

// TestAnUnpublishFlushesToEveryReplica: Flush pushes the unpublished
// primary to each replica of its generation, and to nothing when the
// volume is published again, its primary is elsewhere, or no majority
// answers.
func TestAnUnpublishFlushesToEveryReplica(t *testing.T) {
	const flushPurpose = "flush after the unpublish"
	tests := []struct {
		name   string
		nodes  []string
		down   []string
		copies []copyOf
		from   string
		want   []string // the nodes n1 pushed to
	}{
		{name: "two replicas", nodes: []string{"n1", "n2", "n3"}, from: "n1",
			copies: []copyOf{{node: "n1", role: "primary", gen: 2}, {node: "n2", role: "replica", gen: 2}, {node: "n3", role: "replica", gen: 2}},
			want:   []string{"n2", "n3"}},
		{name: "a replica of an older generation is left to the schedule", nodes: []string{"n1", "n2", "n3"}, from: "n1",
			copies: []copyOf{{node: "n1", role: "primary", gen: 2}, {node: "n2", role: "replica", gen: 2}, {node: "n3", role: "replica", gen: 1}},
			want:   []string{"n2"}},
		{name: "published again", nodes: []string{"n1", "n2", "n3"}, from: "n1",
			copies: []copyOf{{node: "n1", role: "primary", gen: 2, mounted: true}, {node: "n2", role: "replica", gen: 2}}},
		{name: "unpublished from a node that holds a replica", nodes: []string{"n1", "n2", "n3"}, from: "n2",
			copies: []copyOf{{node: "n1", role: "primary", gen: 2}, {node: "n2", role: "replica", gen: 2}}},
		{name: "no replica", nodes: []string{"n1", "n2", "n3"}, from: "n1",
			copies: []copyOf{{node: "n1", role: "primary", gen: 2}}},
		{name: "no majority answers", nodes: []string{"n1", "n2"}, down: []string{"n4", "n5"}, from: "n1",
			copies: []copyOf{{node: "n1", role: "primary", gen: 2}, {node: "n2", role: "replica", gen: 2}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, agents := fakeCluster(t, tt.nodes, tt.down, tt.copies, nil)
			m.Flush(testVolume, tt.from)
			m.WaitFlushes()
			var got []string
			for _, to := range agents["n1"].PushedTo() {
				got = append(got, to.NodeID)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("n1 pushed to %v, want %v", got, tt.want)
			}
			for _, p := range agents["n1"].Purposes() {
				if p != flushPurpose {
					t.Errorf("a push told n1 it was for %q, want %q (zfs-controller status shows it)", p, flushPurpose)
				}
			}
			changing := slices.DeleteFunc(changingCalls(agents), func(c string) bool { return c == "Replicate@n1" })
			if len(changing) != 0 {
				t.Errorf("the flush called %v, want no change but the pushes", changing)
			}
		})
	}
}

// heldFirstPush holds agent's first push until release is closed or its
// context ends; it reports whether that push was cancelled.
func heldFirstPush(agent *clustertest.FakeAgent, release chan struct{}) (held chan struct{}, cancelled *atomic.Bool) {
	var pushes atomic.Int32
	cancelled = new(atomic.Bool)
	held = make(chan struct{})
	agent.BeforePush = func(ctx context.Context, _ string, _ func(agentclient.Progress)) error {
		if pushes.Add(1) > 1 {
			return nil
		}
		close(held)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			cancelled.Store(true)
			return ctx.Err()
		}
	}
	return held, cancelled
}

// TestAMoveGoesBeforeAFlush: a move of a volume whose flush runs waits
// for the flush's push when it goes to the move's target (that push
// sends what the move would), and cancels it when it goes elsewhere;
// either way the move ends with the target's primary. A move straight to
// its final step (a fresh replica) looks and reserves while the flush's
// push goes on, and waits for it only at its fence: here the flush's
// push is held until the move's reservation reaches n3.
func TestAMoveGoesBeforeAFlush(t *testing.T) {
	for _, tt := range []struct {
		name, target string
		fresh        bool // n2's replica is fresh: the move skips its catch-up
		cancelled    bool
		counted      string // the flush's push in zfs_nomad_unpublish_flushes_total
	}{
		{name: "to the replica the flush pushes to", target: "n2", counted: `result="ok"`},
		{name: "to the fresh replica the flush pushes to", target: "n2", fresh: true, counted: `result="ok"`},
		{name: "to another node", target: "n3", cancelled: true, counted: `result="cancelled"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fakes := new(clustertest.Fakes)
			agents := map[string]*clustertest.FakeAgent{}
			for _, node := range []string{"n1", "n2", "n3"} {
				agents[node] = fakes.Add(agentclient.NodeInfo{NodeID: node})
			}
			n1, n2 := agents["n1"], agents["n2"]
			id := n1.PutPrimary("flushed", 1)
			n2.PutReplica("flushed", 1)
			if tt.fresh {
				c, _ := n2.Copy(id)
				c.LastSnapshot, c.LastSnapshotUnixNano = "zn-1", time.Now().UnixNano()
				n2.PutCopy(c)
			}
			release := make(chan struct{})
			held, cancelled := heldFirstPush(n1, release)
			m := New(fakes.Cluster(t), hclog.NewNullLogger())
			registry := metrics.NewRegistry()
			m.Metrics = NewMetrics(registry)
			m.CatchUpWait = 10 * time.Millisecond
			m.Flush(id, "n1")
			<-held
			switch {
			case tt.fresh:
				agents["n3"].BeforeCall("Reserve", func() { close(release) })
			case tt.target == "n2":
				time.AfterFunc(200*time.Millisecond, func() { close(release) })
			}
			gen := publishUntilMoved(t, m, id, tt.target)
			if gen != 2 {
				t.Fatalf("the publish on %s answered generation %d, want 2", tt.target, gen)
			}
			m.WaitFlushes()
			if cancelled.Load() != tt.cancelled {
				t.Errorf("the flush's push to n2 cancelled: %v, want %v", cancelled.Load(), tt.cancelled)
			}
			if c, _ := agents[tt.target].Copy(id); c.Role != contract.RolePrimary || c.Generation != 2 {
				t.Errorf("%s's copy: %+v, want the primary of generation 2", tt.target, c)
			}
			var b strings.Builder
			if _, err := registry.WriteTo(&b); err != nil {
				t.Fatal(err)
			}
			if want := "zfs_nomad_unpublish_flushes_total{" + tt.counted + "} 1\n"; !strings.Contains(b.String(), want) {
				t.Errorf("the metrics lack %q:\n%s", want, b.String())
			}
		})
	}
}

// publishUntilMoved retries the publish of id on node as Nomad does, but
// every 20 ms, until it answers a generation.
func publishUntilMoved(t *testing.T, m *Migrator, id, node string) uint64 {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		gen, err := m.Publish(context.Background(), id, node)
		if err == nil {
			return gen
		}
		if !errors.Is(err, errdefs.ErrFailedPrecondition) && !errors.Is(err, errdefs.ErrAborted) {
			t.Fatalf("publish on %s: %v", node, err)
		}
	}
	t.Fatalf("publish on %s did not succeed within 10 s", node)
	return 0
}
