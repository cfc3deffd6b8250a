package migration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster/clustertest"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/metrics"
)

// copyOf describes a node's copy for a test table.
type copyOf struct {
	node     string
	role     string
	gen      uint64
	snapAt   int64 // unix nanos of its newest snapshot
	fresh    bool  // its newest snapshot was taken just now instead
	mounted  bool
	movingTo string // a fenced primary's target
	params   map[string]string
	// lastSnapshot names its newest replication snapshot; on a primary,
	// written is what was written since each of its snapshots.
	lastSnapshot string
	written      map[string]uint64
}

// fakeCluster gives each of nodes a fake agent holding copies and
// promises (node -> "GEN HOLDER"); the nodes in down are peers that do
// not answer.
func fakeCluster(t *testing.T, nodes []string, down []string, copies []copyOf, promises map[string]string) (*Migrator, map[string]*clustertest.FakeAgent) {
	t.Helper()
	var fakes clustertest.Fakes
	agents := map[string]*clustertest.FakeAgent{}
	for _, id := range nodes {
		a := fakes.Add(agentclient.NodeInfo{NodeID: id})
		for _, c := range copies {
			if c.node == id {
				a.PutCopy(agentclient.Copy{VolumeID: testVolume, Role: c.role, Generation: c.gen, MovingTo: c.movingTo, Mounted: c.mounted,
					FencedUnixNano:       map[bool]int64{true: c.snapAt}[c.movingTo != ""],
					LastSnapshotUnixNano: map[bool]int64{false: c.snapAt, true: time.Now().UnixNano()}[c.fresh], Parameters: c.params,
					LastSnapshot: c.lastSnapshot, WrittenSince: c.written})
			}
		}
		if p, ok := promises[id]; ok {
			var gen uint64
			var holder string
			fmt.Sscanf(p, "%d %s", &gen, &holder)
			a.Promise(testVolume, gen, holder)
		}
		agents[id] = a
	}
	var extra []string
	for _, id := range down {
		extra = append(extra, id+":7670")
	}
	return New(fakes.Cluster(t, extra...), hclog.NewNullLogger()), agents
}

// changingCalls returns the calls of the agents that change something, as
// "Method@node", sorted.
func changingCalls(agents map[string]*clustertest.FakeAgent) []string {
	changing := []string{"Demote", "MoveFinal", "Promote", "Replicate", "Reserve", "Unfence"}
	var out []string
	for node, a := range agents {
		for _, call := range a.Calls() {
			method, _, _ := strings.Cut(call, " ")
			if slices.Contains(changing, method) {
				out = append(out, method+"@"+node)
			}
		}
	}
	slices.Sort(out)
	return out
}

var testVolume = contract.VolumeIDForName("publish")

// TestPublishDecides: every branch of Publish against fake agents
// (clustertest.FakeAgent, in the agent client's plain types): the
// generation it answers, the error kind it refuses with, and the calls
// that changed something, in order.
func TestPublishDecides(t *testing.T) {
	three := []string{"n1", "n2", "n3"}
	auto := map[string]string{contract.ParamFailover: contract.FailoverAuto}
	pinned := map[string]string{contract.ParamPinned: "true"}
	tests := []struct {
		name     string
		nodes    []string
		down     []string
		copies   []copyOf
		promises map[string]string
		target   string
		gen      uint64
		err      error
		refuse   []string // "node Method": the node refuses every call of Method
		calls    []string // the changing calls, sorted (reservations run in parallel)
		say      string   // in the error
	}{
		{name: "already there", nodes: three, target: "n1", gen: 1,
			copies: []copyOf{{node: "n1", role: contract.RolePrimary, gen: 1}, {node: "n2", role: contract.RoleReplica, gen: 1, snapAt: 50}}},
		{name: "a move to a stale replica's node: caught up first", nodes: three, target: "n2", gen: 2,
			copies: []copyOf{{node: "n1", role: contract.RolePrimary, gen: 1}, {node: "n2", role: contract.RoleReplica, gen: 1, snapAt: 50}},
			calls:  []string{"Demote@n1", "MoveFinal@n1", "Promote@n2", "Replicate@n1", "Reserve@n1", "Reserve@n2", "Reserve@n3"}},
		{name: "a move to a fresh replica's node: no catch-up", nodes: three, target: "n2", gen: 2,
			copies: []copyOf{{node: "n1", role: contract.RolePrimary, gen: 1}, {node: "n2", role: contract.RoleReplica, gen: 1, fresh: true}},
			calls:  []string{"Demote@n1", "MoveFinal@n1", "Promote@n2", "Reserve@n1", "Reserve@n2", "Reserve@n3"}},
		{name: "a move to a node without a copy", nodes: three, target: "n3", gen: 2,
			copies: []copyOf{{node: "n1", role: contract.RolePrimary, gen: 1}},
			calls:  []string{"Demote@n1", "MoveFinal@n1", "Promote@n3", "Replicate@n1", "Reserve@n1", "Reserve@n2", "Reserve@n3"}},
		{name: "the source refuses the final push: nothing is promoted", nodes: three, target: "n2", err: errdefs.ErrFailedPrecondition, say: "fencing volume",
			copies: []copyOf{{node: "n1", role: contract.RolePrimary, gen: 1}}, refuse: []string{"n1 MoveFinal"},
			calls: []string{"MoveFinal@n1", "Replicate@n1", "Reserve@n1", "Reserve@n2", "Reserve@n3"}},
		{name: "the target refuses the promotion: the source is not demoted", nodes: three, target: "n2", err: errdefs.ErrFailedPrecondition, say: "promoting the copy on node n2",
			copies: []copyOf{{node: "n1", role: contract.RolePrimary, gen: 1}}, refuse: []string{"n2 Promote"},
			calls: []string{"MoveFinal@n1", "Promote@n2", "Replicate@n1", "Reserve@n1", "Reserve@n2", "Reserve@n3"}},
		{name: "still published on the source: caught up, not moved", nodes: three, target: "n2", err: errdefs.ErrFailedPrecondition, say: "still published on node n1",
			copies: []copyOf{{node: "n1", role: contract.RolePrimary, gen: 1, mounted: true}},
			calls:  []string{"Replicate@n1"}},
		{name: "a pinned volume does not move", nodes: three, target: "n2", err: errdefs.ErrFailedPrecondition, say: "pinned",
			copies: []copyOf{{node: "n1", role: contract.RolePrimary, gen: 1, params: pinned}}},
		{name: "an abandoned move: the fence is lifted", nodes: three, target: "n1", gen: 1,
			copies: []copyOf{{node: "n1", role: contract.RolePrimary, gen: 1, movingTo: "n2", snapAt: 10}},
			calls:  []string{"Unfence@n1"}},
		// The target answers without a primary, but its own record still
		// holds the promise: a move's final step may be promoting it. A
		// newer generation is reserved for n1 first, which voids it, then
		// the fence is lifted.
		{name: "an abandoned move whose target still holds its promise: superseded, then the fence is lifted", nodes: three, target: "n1", gen: 1,
			copies:   []copyOf{{node: "n1", role: contract.RolePrimary, gen: 1, movingTo: "n2", snapAt: 10}, {node: "n2", role: contract.RoleReplica, gen: 1, snapAt: 10}},
			promises: map[string]string{"n1": "2 n2", "n2": "2 n2", "n3": "2 n2"},
			calls:    []string{"Reserve@n1", "Reserve@n2", "Reserve@n3", "Unfence@n1"}},
		{name: "an abandoned move whose target cannot be asked to void its promise: the fence stays", nodes: three, target: "n1", err: errdefs.ErrUnavailable, say: "node n2 still holds the promise of generation 2",
			copies:   []copyOf{{node: "n1", role: contract.RolePrimary, gen: 1, movingTo: "n2", snapAt: 10}, {node: "n2", role: contract.RoleReplica, gen: 1, snapAt: 10}},
			promises: map[string]string{"n1": "2 n2", "n2": "2 n2", "n3": "2 n2"}, refuse: []string{"n2 Reserve"},
			calls: []string{"Reserve@n1", "Reserve@n2", "Reserve@n3"}},
		{name: "failover auto: the target's replica, as fresh as any", nodes: three, down: []string{"n4"}, target: "n3", gen: 2,
			copies: []copyOf{{node: "n2", role: contract.RoleReplica, gen: 1, snapAt: 50, params: auto}, {node: "n3", role: contract.RoleReplica, gen: 1, snapAt: 50, params: auto}},
			calls:  []string{"Promote@n3", "Reserve@n1", "Reserve@n2", "Reserve@n3"}},
		{name: "failover auto: the fresher replica, then a move", nodes: three, down: []string{"n4"}, target: "n2", gen: 3,
			copies: []copyOf{{node: "n2", role: contract.RoleReplica, gen: 1, snapAt: 40, params: auto}, {node: "n3", role: contract.RoleReplica, gen: 1, snapAt: 50, params: auto}},
			calls: []string{"Demote@n3", "MoveFinal@n3", "Promote@n2", "Promote@n3", "Replicate@n3",
				"Reserve@n1", "Reserve@n1", "Reserve@n2", "Reserve@n2", "Reserve@n3", "Reserve@n3"}},
		{name: "failover manual: the operator decides", nodes: three, down: []string{"n4"}, target: "n2", err: errdefs.ErrUnavailable, say: "zfs-controller promote",
			copies: []copyOf{{node: "n2", role: contract.RoleReplica, gen: 1, snapAt: 50}}},
		{name: "no majority answers", nodes: []string{"n1"}, down: []string{"n2", "n3"}, target: "n1", err: errdefs.ErrUnavailable, say: "majority",
			copies: []copyOf{{node: "n1", role: contract.RoleReplica, gen: 1, snapAt: 50, params: auto}}},
		{name: "the target does not answer", nodes: three, down: []string{"n4"}, target: "n4", err: errdefs.ErrUnavailable, say: "did not answer",
			copies: []copyOf{{node: "n1", role: contract.RolePrimary, gen: 1}}},
		{name: "a node nobody knows", nodes: three, target: "n9", err: errdefs.ErrNotFound,
			copies: []copyOf{{node: "n1", role: contract.RolePrimary, gen: 1}}},
		{name: "a newer generation promised to a silent node", nodes: three, down: []string{"n4"}, target: "n1", err: errdefs.ErrUnavailable, say: "promised to node n4",
			copies:   []copyOf{{node: "n1", role: contract.RolePrimary, gen: 1}},
			promises: map[string]string{"n2": "2 n4"}},
		{name: "two primaries of one generation", nodes: three, target: "n1", err: errdefs.ErrFailedPrecondition, say: "set one aside",
			copies: []copyOf{{node: "n1", role: contract.RolePrimary, gen: 2}, {node: "n2", role: contract.RolePrimary, gen: 2}}},
		{name: "a stale primary is set aside, the newest published", nodes: three, target: "n2", gen: 2,
			copies: []copyOf{{node: "n1", role: contract.RolePrimary, gen: 1}, {node: "n2", role: contract.RolePrimary, gen: 2}},
			calls:  []string{"Demote@n1"}},
		{name: "a volume nobody holds", nodes: three, target: "n1", err: errdefs.ErrNotFound},
		// A delete reserved the volume and has not finished: its retry
		// removes the copies, and nothing may be done with them meanwhile.
		{name: "a volume being deleted is not published where it is", nodes: three, target: "n1", err: errdefs.ErrAborted, say: "being deleted",
			copies:   []copyOf{{node: "n1", role: contract.RolePrimary, gen: 1}},
			promises: map[string]string{"n2": "2 " + contract.DeletionHolder}},
		{name: "a volume being deleted does not move", nodes: three, target: "n2", err: errdefs.ErrAborted, say: "retry the delete",
			copies:   []copyOf{{node: "n1", role: contract.RolePrimary, gen: 1}, {node: "n2", role: contract.RoleReplica, gen: 1, fresh: true}},
			promises: map[string]string{"n3": "2 " + contract.DeletionHolder}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m, agents := fakeCluster(t, tt.nodes, tt.down, tt.copies, tt.promises)
			for _, r := range tt.refuse {
				node, method, _ := strings.Cut(r, " ")
				agents[node].Refuse(method, errdefs.Wrap(errdefs.ErrFailedPrecondition, "refused by the test"))
			}
			gen, err := m.Publish(context.Background(), testVolume, tt.target)
			if tt.err != nil {
				if !errors.Is(err, tt.err) || !strings.Contains(err.Error(), tt.say) {
					t.Fatalf("Publish: %v, want %v saying %q", err, tt.err, tt.say)
				}
			} else if err != nil || gen != tt.gen {
				t.Fatalf("Publish: generation %d, %v; want %d", gen, err, tt.gen)
			}
			// The demotion after a move runs in the background.
			deadline := time.Now().Add(5 * time.Second)
			for {
				calls := changingCalls(agents)
				if slices.Equal(calls, tt.calls) || time.Now().After(deadline) {
					if !slices.Equal(calls, tt.calls) {
						t.Errorf("calls %q, want %q", calls, tt.calls)
					}
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

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

// TestAMoveCatchesUpInTheBackground: a publish on a node without a fresh
// replica starts a push of the primary there in the background and
// answers FailedPrecondition (Nomad retries it) saying how far it is,
// without fencing or promoting anything; retries meanwhile start no
// second push; the retry after it is done finishes the move.
func TestAMoveCatchesUpInTheBackground(t *testing.T) {
	fakes, n1, n2 := threeNodes()
	id := n1.PutPrimary("big", 1)
	release := make(chan struct{})
	pushes := heldPushes(n1, release)
	m := New(fakes.Cluster(t), hclog.NewNullLogger())
	m.CatchUpWait = time.Second
	registry := metrics.NewRegistry()
	m.Metrics = NewMetrics(registry)
	pending := func() bool { return finalStepPending(t, registry, id, "n2") }
	ctx := context.Background()

	var callsBefore int
	for attempt := range 3 {
		if attempt == 1 {
			callsBefore = len(n1.Calls())
		}
		began := time.Now()
		_, err := m.Publish(ctx, id, "n2")
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "1.0 GiB of 3.0 GiB") {
			t.Fatalf("publish %d during the catch-up: %v, want FailedPrecondition with its progress", attempt, err)
		}
		// The publish that starts the catch-up waits for it a while; a
		// retry that finds it running answers at once: Nomad sends the
		// plugin's controller calls one at a time, and a wait there
		// would hold every other volume's.
		if took := time.Since(began); attempt == 0 && took < m.CatchUpWait || attempt > 0 && took > m.CatchUpWait/2 {
			t.Errorf("publish %d during the catch-up answered after %v (the first waits %v, retries not)", attempt, took, m.CatchUpWait)
		}
	}
	if got := pushes.Load(); got != 1 {
		t.Errorf("%d pushes during three publishes, want the one catch-up", got)
	}
	// The retries answered from memory: Nomad's serialised calls wait for
	// them, and the nodes are busy with the moves.
	if calls := n1.Calls()[callsBefore:]; len(calls) != 0 {
		t.Errorf("the retries during the move called n1: %v, want no call", calls)
	}
	if got := n1.Purposes(); !slices.Equal(got, []string{"catch-up for the move to n2"}) {
		t.Errorf("the pushes told n1 they were for %q, want the catch-up for the move (zfs-controller status shows it)", got)
	}
	if c, _ := n1.Copy(id); c.Role != contract.RolePrimary || c.MovingTo != "" {
		t.Errorf("n1's copy during the catch-up: %+v, want its unfenced primary", c)
	}

	if pending() {
		t.Error("the move's final step shows pending while its catch-up runs")
	}
	// zfs-controller status shows the moves (Moves, served at MovesPath).
	if moves := m.Moves(); len(moves) != 1 || moves[0].VolumeID != id || moves[0].From != "n1" || moves[0].To != "n2" ||
		moves[0].Bytes != 1<<30 || !moves[0].CaughtUp.IsZero() {
		t.Errorf("the moves during the catch-up: %+v, want the one to n2 running, 1 GiB sent", moves)
	}
	n2Before := len(n2.Calls())
	close(release)
	// The source is unpublished: the final step runs in the background
	// right after the catch-up, before any retry. The job is done once it
	// records the move as ended (after the promotion and the source's
	// demotion), which is what is waited for.
	ended := func() bool {
		moves := m.Moves()
		return len(moves) != 1 || !moves[0].Moved.IsZero() || moves[0].Error != ""
	}
	for deadline := time.Now().Add(10 * time.Second); !ended() && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
	}
	if c, _ := n2.Copy(id); c.Role != contract.RolePrimary || c.Generation != 2 {
		t.Fatalf("n2's copy after the catch-up, before any retry: %+v, want the primary of generation 2", c)
	}
	if moves := m.Moves(); len(moves) != 1 || moves[0].Moved.IsZero() || !moves[0].FinalStep || moves[0].Error != "" {
		t.Errorf("the moves once moved: %+v, want the one to n2, moved", moves)
	}
	// The final step acts on the look that checked the source: one look
	// at every node, not two.
	if looks := countCalls(n2.Calls()[n2Before:], "GetCopy "+id); looks != 1 {
		t.Errorf("the final step asked n2 for its copy %d times, want once", looks)
	}
	began := time.Now()
	gen, err := m.Publish(ctx, id, "n2")
	if err != nil || gen != 2 || time.Since(began) > m.CatchUpWait/2 {
		t.Fatalf("the retry after the background move: generation %d, %v after %v; want 2 at once", gen, err, time.Since(began))
	}
	if pending() {
		t.Error("a move whose final step ran in the background showed pending")
	}
	if moves := m.Moves(); len(moves) != 0 {
		t.Errorf("the moves after the move: %+v, want none", moves)
	}
}

// TestTheFinalStepWaitsForTheSourceToBeUnpublished: a background move
// whose source is still published when its catch-up ends leaves the
// final step pending (in the metrics and Moves) until a publish comes
// with the source unpublished, which then runs it.
func TestTheFinalStepWaitsForTheSourceToBeUnpublished(t *testing.T) {
	fakes, n1, n2 := threeNodes()
	id := n1.PutPrimary("busy", 1)
	published, _ := n1.Copy(id)
	published.Mounted = true
	n1.PutCopy(published)
	m := New(fakes.Cluster(t), hclog.NewNullLogger())
	m.CatchUpWait = 2 * time.Second
	registry := metrics.NewRegistry()
	m.Metrics = NewMetrics(registry)
	pending := func() bool { return finalStepPending(t, registry, id, "n2") }
	ctx := context.Background()
	if _, err := m.Publish(ctx, id, "n2"); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "still published on node n1") {
		t.Fatalf("publish while the source is published: %v, want FailedPrecondition saying so", err)
	}
	// That call's catch-up ended within its wait, and left the final step.
	if c, _ := n2.Copy(id); c.Role != contract.RoleReplica {
		t.Fatalf("n2's copy after the catch-up: %+v, want a replica", c)
	}
	if c, _ := n1.Copy(id); c.MovingTo != "" {
		t.Fatalf("the published source was fenced: %+v", c)
	}
	// Caught up by a background move whose source was published: pending.
	if _, err := m.Publish(ctx, id, "n2"); err == nil {
		t.Fatal("a publish while the source is published moved the volume")
	}

	published.Mounted = false
	n1.PutCopy(published)
	gen, err := m.Publish(ctx, id, "n2")
	if err != nil || gen != 2 {
		t.Fatalf("publish once the source is unpublished: generation %d, %v; want 2 (the final step within the call's wait)", gen, err)
	}
	if pending() {
		t.Error("the final step still shows pending after the move")
	}
}

// TestCatchUpsPerSourceAreBounded: a source node runs at most MaxCatchUps
// catch-ups at once; a move beyond them answers FailedPrecondition
// saying so, and starts once one is done. A move whose target is fresh
// needs no catch-up and is not held behind them.
func TestCatchUpsPerSourceAreBounded(t *testing.T) {
	fakes, n1, n2 := threeNodes()
	first, second, third := n1.PutPrimary("first", 1), n1.PutPrimary("second", 1), n1.PutPrimary("third", 1)
	n2.PutCopy(agentclient.Copy{VolumeID: third, Name: "third", Role: contract.RoleReplica, Generation: 1, LastSnapshotUnixNano: time.Now().UnixNano()})
	release := make(chan struct{})
	heldPushes(n1, release)
	m := New(fakes.Cluster(t), hclog.NewNullLogger())
	m.CatchUpWait = 50 * time.Millisecond
	m.MaxCatchUps = 1
	ctx := context.Background()

	if _, err := m.Publish(ctx, first, "n2"); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "in the background") {
		t.Fatalf("first move: %v, want its catch-up running", err)
	}
	if _, err := m.Publish(ctx, second, "n3"); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "at most 1 at once") {
		t.Fatalf("second move from the same node: %v, want it to wait for the first's catch-up", err)
	}
	if _, err := m.Publish(ctx, third, "n2"); err != nil && !strings.Contains(err.Error(), "final step") {
		t.Fatalf("a move to a fresh replica beside the running catch-up: %v, want it moved or in its final step", err)
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
	fakes, n1, _ := threeNodes()
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

// finalStepPending tells whether the metrics show the final step of the
// move of volume id to target pending.
func finalStepPending(t *testing.T, registry *metrics.Registry, id, target string) bool {
	t.Helper()
	var b strings.Builder
	if _, err := registry.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	return strings.Contains(b.String(), fmt.Sprintf("zfs_nomad_move_final_step_pending{target=%q,volume_id=%q} 1", target, id))
}

// TestABusyPromotionIsRetried: a move whose target answers that its copy
// is busy (the tidy after the final receive still holds it) asks again,
// instead of failing with its source already fenced.
func TestABusyPromotionIsRetried(t *testing.T) {
	fakes, n1, n2 := threeNodes()
	id := n1.PutPrimary("v", 1)
	n2.RefuseTimes("Promote", 2, errdefs.Wrap(errdefs.ErrAborted, "operation in progress: promote of %s waited for tidy after a receive: retry", id))
	m := New(fakes.Cluster(t), hclog.NewNullLogger())
	m.CatchUpFresh = -1 // the move in this call
	gen, err := m.Publish(context.Background(), id, "n2")
	if err != nil || gen != 2 {
		t.Fatalf("publish with a busy target: generation %d, %v; want 2", gen, err)
	}
	if c, _ := n2.Copy(id); c.Role != contract.RolePrimary || c.Generation != 2 {
		t.Errorf("n2's copy: %+v, want the primary of generation 2", c)
	}
}

// threeNodes returns three fake nodes, n1 to n3, and the first two.
func threeNodes() (fakes *clustertest.Fakes, n1, n2 *clustertest.FakeAgent) {
	fakes = new(clustertest.Fakes)
	n1 = fakes.Add(agentclient.NodeInfo{NodeID: "n1"})
	n2 = fakes.Add(agentclient.NodeInfo{NodeID: "n2"})
	fakes.Add(agentclient.NodeInfo{NodeID: "n3"})
	return fakes, n1, n2
}

// TestAPublishIsGrantedAheadOfAMovesEnd: while a volume's background move
// to the node runs, its source unpublished, PublishAhead grants the
// publish at once with the source's generation (the node's stage waits
// past it) when the move is estimated to end within PublishAheadWithin,
// and refuses it with the move's progress otherwise; Publish never grants
// ahead, and once the move is done PublishAhead grants the new generation
// itself.
func TestAPublishIsGrantedAheadOfAMovesEnd(t *testing.T) {
	tests := []struct {
		name            string
		within          time.Duration
		sourcePublished bool
		wantAhead       bool
	}{
		// 1 GiB of 3 sent in 10 s: about 20 s left.
		{"ends within the bound", time.Minute, false, true},
		{"ends after the bound", 10 * time.Second, false, false},
		{"publishing ahead off", 0, false, false},
		{"source still published", time.Minute, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fakes, n1, n2 := threeNodes()
			id := n1.PutPrimary("big", 1)
			if tc.sourcePublished {
				c, _ := n1.Copy(id)
				c.Mounted = true
				n1.PutCopy(c)
			}
			release := make(chan struct{})
			heldPushes(n1, release)
			m := New(fakes.Cluster(t), hclog.NewNullLogger())
			m.CatchUpWait = time.Millisecond
			m.PublishAheadWithin = tc.within
			registry := metrics.NewRegistry()
			m.Metrics = NewMetrics(registry)
			ctx := context.Background()
			tenSecondsIntoACatchUp(t, m, id)
			if _, err := m.Publish(ctx, id, "n2"); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "about 20s left") {
				t.Errorf("Publish during the move: %v, want FailedPrecondition with the time left", err)
			}
			p, err := m.PublishAhead(ctx, id, "n2")
			switch {
			case tc.wantAhead && (err != nil || p != Publication{After: 1}):
				t.Errorf("PublishAhead 20 s before the move's end: %+v, %v; want granted after generation 1", p, err)
			case !tc.wantAhead && !errors.Is(err, errdefs.ErrFailedPrecondition):
				t.Errorf("PublishAhead: %+v, %v; want FailedPrecondition with the move's progress", p, err)
			}
			if c, _ := n2.Copy(id); c.Role == contract.RolePrimary {
				t.Errorf("n2's copy after a publish granted ahead, before the move's end: %+v, want no primary yet", c)
			}
			var b strings.Builder
			if _, err := registry.WriteTo(&b); err != nil {
				t.Fatal(err)
			}
			if counted := strings.Contains(b.String(), "zfs_nomad_publishes_ahead_total 1"); counted != tc.wantAhead {
				t.Errorf("zfs_nomad_publishes_ahead_total counted the grant: %v, want %v", counted, tc.wantAhead)
			}
			if moves := m.Moves(); len(moves) != 1 || moves[0].PublishedAhead.IsZero() == tc.wantAhead {
				t.Errorf("the move's status after the publish: %+v; want it published ahead: %v", moves, tc.wantAhead)
			}
			close(release)
			if tc.sourcePublished {
				return // the final step waits for the source's unpublish
			}
			// The move ends after the promotion: its job demotes the
			// source and times the step before it lets go of the move.
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if ms := m.Moves(); len(ms) == 1 && !ms[0].Moved.IsZero() {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the move did not end: %+v", m.Moves())
				}
			}
			if p, err := m.PublishAhead(ctx, id, "n2"); err != nil || p != (Publication{Generation: 2}) {
				t.Errorf("PublishAhead once moved: %+v, %v; want generation 2", p, err)
			}
			b.Reset()
			if _, err := registry.WriteTo(&b); err != nil {
				t.Fatal(err)
			}
			for _, step := range []string{"catch_up", "final"} {
				if want := `zfs_nomad_move_step_seconds_count{step="` + step + `"} 1`; !strings.Contains(b.String(), want) {
					t.Errorf("the move's steps were not timed: no %s in\n%s", want, b.String())
				}
			}
		})
	}
}

// tenSecondsIntoACatchUp starts the move of volume id to n2 on m, whose
// clock it takes over, and returns once the catch-up reported 1 GiB of
// 3 sent, the clock 10 s after its start: about 20 s left.
func tenSecondsIntoACatchUp(t *testing.T, m *Migrator, id string) {
	t.Helper()
	var clock atomic.Int64
	clock.Store(time.Unix(1_800_000_000, 0).UnixNano())
	m.now = func() time.Time { return time.Unix(0, clock.Load()) }
	if _, err := m.PublishAhead(context.Background(), id, "n2"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("the publish that starts the move: %v, want FailedPrecondition (nothing sent yet)", err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if moves := m.Moves(); len(moves) == 1 && moves[0].Bytes == 1<<30 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the catch-up reported no progress: %+v", m.Moves())
		}
	}
	clock.Add(int64(10 * time.Second))
}

// TestAheadOf: when a running move lets its publish be granted ahead.
func TestAheadOf(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	tests := []struct {
		name string
		c    *moveJob
		want bool
	}{
		{"half sent in 10 s, 10 s left", &moveJob{sourceGeneration: 3, sourceUnpublished: true, bytes: 5, total: 10}, true},
		{"a tenth in 10 s, 90 s left", &moveJob{sourceGeneration: 3, sourceUnpublished: true, bytes: 1, total: 10}, false},
		{"nothing sent yet: no estimate", &moveJob{sourceGeneration: 3, sourceUnpublished: true, total: 10}, false},
		{"no total: no estimate", &moveJob{sourceGeneration: 3, sourceUnpublished: true, bytes: 5}, false},
		{"in its final step", &moveJob{sourceGeneration: 3, sourceUnpublished: true, step: finalStep}, true},
		{"source published", &moveJob{sourceGeneration: 3, bytes: 5, total: 10}, false},
		{"no source generation", &moveJob{sourceUnpublished: true, step: finalStep}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.c.started = start
			after, ok := tc.c.aheadOf(start.Add(10*time.Second), 30*time.Second)
			if ok != tc.want || ok && after != 3 {
				t.Errorf("aheadOf: %d, %v; want %v", after, ok, tc.want)
			}
		})
	}
}

// TestAMoveGrantedAheadTriesAgainItself: a background move whose publish
// was granted ahead of its end gets no retry of the publish after a
// failure, so it tries again itself, resuming the push, and the volume
// arrives; a move not granted ahead fails and waits for the publish's
// retry.
func TestAMoveGrantedAheadTriesAgainItself(t *testing.T) {
	for _, granted := range []bool{true, false} {
		t.Run(fmt.Sprintf("granted ahead %v", granted), func(t *testing.T) {
			fakes, n1, n2 := threeNodes()
			id := n1.PutPrimary("big", 1)
			fail := make(chan struct{})
			var pushes atomic.Int32
			n1.BeforePush = func(ctx context.Context, _ string, each func(agentclient.Progress)) error {
				if pushes.Add(1) > 1 {
					return nil
				}
				each(agentclient.Progress{Bytes: 1 << 30, TotalBytes: 3 << 30})
				select {
				case <-fail:
					return errdefs.Wrap(errdefs.ErrUnavailable, "the stream broke")
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			m := New(fakes.Cluster(t), hclog.NewNullLogger())
			m.CatchUpWait, m.aheadRetryPause = time.Millisecond, time.Millisecond
			m.PublishAheadWithin = time.Minute
			ctx := context.Background()
			tenSecondsIntoACatchUp(t, m, id)
			if granted {
				if p, err := m.PublishAhead(ctx, id, "n2"); err != nil || p.After != 1 {
					t.Fatalf("PublishAhead 20 s before the move's end: %+v, %v; want granted", p, err)
				}
			}
			close(fail)
			var ended MoveStatus
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
				if moves := m.Moves(); len(moves) == 1 && (moves[0].Error != "" || !moves[0].Moved.IsZero()) {
					ended = moves[0]
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the move did not end: %+v", m.Moves())
				}
			}
			c, _ := n2.Copy(id)
			if arrived := c.Role == contract.RolePrimary && c.Generation == 2; arrived != granted || ended.Moved.IsZero() == granted {
				t.Errorf("after the catch-up broke: n2's copy %+v, the move %+v; want the volume moved: %v", c, ended, granted)
			}
			if !granted && !strings.Contains(ended.Error, "the stream broke") {
				t.Errorf("the move not granted ahead ended with %q, want the failure, for the publish's retry", ended.Error)
			}
		})
	}
}

// TestAPublishToTheSourceDuringTheFinalStepIsRefused: while a background
// move's final step runs (the source fenced, the target's generation
// reserved, its promotion under way), a publish to the move's source acts
// on no copy: it is refused, retryably, saying the move runs; a publish
// elsewhere is refused alike. The move then ends with exactly one
// primary, on its target. A publish to the source that lifted its fence
// (the target answers without a primary yet, so its reservation looks
// void) would answer generation 1 while the final step promotes the
// target to 2: two primaries.
func TestAPublishToTheSourceDuringTheFinalStepIsRefused(t *testing.T) {
	fakes, n1, n2 := threeNodes()
	id := n1.PutPrimary("v", 1)
	// The final step's promotion finds the target busy three times (a
	// second apart): the publishes below arrive meanwhile.
	n2.RefuseTimes("Promote", 3, errdefs.Wrap(errdefs.ErrAborted, "operation in progress: promote of %s waited for tidy after a receive: retry", id))
	m := New(fakes.Cluster(t), hclog.NewNullLogger())
	m.CatchUpWait = time.Millisecond
	ctx := context.Background()
	if _, err := m.Publish(ctx, id, "n2"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("the publish that starts the move: %v, want FailedPrecondition (it runs in the background)", err)
	}
	for deadline := time.Now().Add(5 * time.Second); !slices.Contains(n2.Calls(), "Promote "+id); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the final step did not reach the promotion: n2's calls %v", n2.Calls())
		}
	}
	for _, node := range []string{"n1", "n3"} {
		gen, err := m.Publish(ctx, id, node)
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "moving from node n1 to node n2 (final step running)") {
			t.Errorf("publish to %s during the move's final step: generation %d, %v; want FailedPrecondition saying the move runs (a publish to the source must not lift its fence while the target is being promoted)",
				node, gen, err)
		}
	}
	if c, _ := n1.Copy(id); c.MovingTo != "n2" {
		t.Errorf("n1's copy during the final step: %+v, want still fenced for n2", c)
	}
	var ended MoveStatus
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if moves := m.Moves(); len(moves) == 1 && (moves[0].Error != "" || !moves[0].Moved.IsZero()) {
			ended = moves[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the move did not end: %+v", m.Moves())
		}
	}
	if ended.Moved.IsZero() {
		t.Fatalf("the move failed: %s", ended.Error)
	}
	var primaries []string
	for _, a := range []*clustertest.FakeAgent{n1, n2} {
		if c, ok := a.Copy(id); ok && c.Role == contract.RolePrimary {
			primaries = append(primaries, fmt.Sprintf("%s at %d", c.NodeID, c.Generation))
		}
	}
	if !slices.Equal(primaries, []string{"n2 at 2"}) {
		t.Errorf("primaries after the move: %v, want only n2's, at generation 2", primaries)
	}
	if slices.Contains(n1.Calls(), "Unfence "+id) {
		t.Errorf("n1 was asked to lift its fence during the move: %v", n1.Calls())
	}
}

// TestAFinalStepThatCannotRunIsNotStartedAgainAndAgain: a move whose
// final step finds the source published again (an old claim restaged
// there while the catch-up ran) leaves the decision to the CO's retry.
// Found by the fault simulation once it ran background moves: the
// publish started a final step, which found nothing to do, started
// another at once, and so on until the call's deadline, spinning.
func TestAFinalStepThatCannotRunIsNotStartedAgainAndAgain(t *testing.T) {
	fakes, n1, _ := threeNodes()
	id := n1.PutPrimary("restaged", 1)
	n1.BeforePush = func(context.Context, string, func(agentclient.Progress)) error {
		c, _ := n1.Copy(id)
		c.Mounted = true // restaged on the source while its catch-up runs
		n1.PutCopy(c)
		return nil
	}
	m := New(fakes.Cluster(t), hclog.NewNullLogger())
	m.CatchUpWait = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()

	began := time.Now()
	_, err := m.Publish(ctx, id, "n2")
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("publish whose source was restaged during the catch-up: %v after %s, want FailedPrecondition at once", err, time.Since(began).Round(time.Millisecond))
	}
	finals := 0
	for _, call := range n1.Calls() {
		if strings.HasPrefix(call, "GetCopy") {
			finals++
		}
	}
	if finals > 3 {
		t.Errorf("the source was asked for its copy %d times in one publish: the final step was started again and again", finals)
	}
}

// countCalls counts the calls named call among calls.
func countCalls(calls []string, call string) int {
	n := 0
	for _, c := range calls {
		if c == call {
			n++
		}
	}
	return n
}

// TestAMoveToAFreshReplicaLooksOnceBeforeItsFinalStep: a publish that
// finds the target's replica fresh starts the move's job at its final
// step, which acts on the look the publish just took instead of asking
// every node again; the publish then looks once more and finds the
// volume moved.
func TestAMoveToAFreshReplicaLooksOnceBeforeItsFinalStep(t *testing.T) {
	m, agents := fakeCluster(t, []string{"n1", "n2", "n3"}, nil,
		[]copyOf{{node: "n1", role: contract.RolePrimary, gen: 1}, {node: "n2", role: contract.RoleReplica, gen: 1, fresh: true}}, nil)
	m.CatchUpWait = 10 * time.Second
	gen, err := m.Publish(context.Background(), testVolume, "n2")
	if err != nil || gen != 2 {
		t.Fatalf("Publish: generation %d, %v; want 2", gen, err)
	}
	for node, a := range agents {
		if looks := countCalls(a.Calls(), "GetCopy "+testVolume); looks != 2 {
			t.Errorf("%s was asked for its copy %d times, want twice (the publish's look, its look after the move)", node, looks)
		}
	}
}

// TestAMoveBackLooksOnceBeforeItsFinalStep: a move to a node the volume
// left since an earlier move brought it there (that move's publish
// granted ahead, so no publish answered from its job) acts on its look,
// as the first move there did, instead of looking again for the earlier
// job's sake; a look older than that job's promotion still looks again.
func TestAMoveBackLooksOnceBeforeItsFinalStep(t *testing.T) {
	for _, tc := range []struct {
		name       string
		primaryGen uint64 // the primary on n1 when the publish looks
		wantLooks  int
	}{
		{"moved on since the earlier job", 3, 2},
		{"a look from before the earlier job's promotion", 1, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, agents := fakeCluster(t, []string{"n1", "n2", "n3"}, nil,
				[]copyOf{{node: "n1", role: contract.RolePrimary, gen: tc.primaryGen}, {node: "n2", role: contract.RoleReplica, gen: tc.primaryGen, fresh: true}}, nil)
			m.CatchUpWait = 10 * time.Second
			t.Cleanup(m.Stop)
			nodes, _, err := m.cluster.Nodes(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			earlier := newMoveJob(copyOn{node: nodes[0], copy: agentclient.Copy{VolumeID: testVolume, Generation: 1}}, "n2", false, m.now())
			earlier.end(moved, nil, m.now())
			if err := m.jobs.add(earlier, 1); err != nil {
				t.Fatal(err)
			}
			if _, err := m.Publish(context.Background(), testVolume, "n2"); err != nil {
				t.Fatalf("Publish: %v", err)
			}
			for node, a := range agents {
				if looks := countCalls(a.Calls(), "GetCopy "+testVolume); looks != tc.wantLooks {
					t.Errorf("%s was asked for its copy %d times, want %d", node, looks, tc.wantLooks)
				}
			}
		})
	}
}

// TestWhichReplicasSkipTheCatchUp: a move skips its catch-up when the
// target's replica is young, or when the unpublished primary had little
// written since the snapshot the replica holds, newer snapshots (another
// replica's, a backup's) or not; never for a replica of another
// generation or with a receive to resume.
func TestWhichReplicasSkipTheCatchUp(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	old := now.Add(-10 * time.Minute).UnixNano()
	primary := agentclient.Copy{Role: contract.RolePrimary, Generation: 3, LastSnapshot: "repl-2", LastSnapshotUnixNano: old,
		WrittenSince: map[string]uint64{"repl-1": 17 << 10, "repl-2": 0}}
	replica := agentclient.Copy{Role: contract.RoleReplica, Generation: 3, LastSnapshot: "repl-1", LastSnapshotUnixNano: old}
	tests := []struct {
		name      string
		primary   func(*agentclient.Copy)
		replica   func(*agentclient.Copy)
		wantFresh bool
	}{
		{"old replica, little written since its snapshot", nil, nil, true},
		{"as much written as the bound", func(p *agentclient.Copy) { p.WrittenSince = map[string]uint64{"repl-1": DefaultCatchUpFreshBytes} }, nil, true},
		{"more written than the bound", func(p *agentclient.Copy) { p.WrittenSince = map[string]uint64{"repl-1": DefaultCatchUpFreshBytes + 1} }, nil, false},
		{"primary from a node that does not report what was written", func(p *agentclient.Copy) { p.WrittenSince = nil }, nil, false},
		{"primary without the replica's snapshot", nil, func(r *agentclient.Copy) { r.LastSnapshot = "repl-0" }, false},
		{"primary still published", func(p *agentclient.Copy) { p.Mounted = true }, nil, false},
		{"replica of an older generation", nil, func(r *agentclient.Copy) { r.Generation = 2 }, false},
		{"replica with a receive to resume", nil, func(r *agentclient.Copy) { r.Resumable = true }, false},
		{"young replica, much written", func(p *agentclient.Copy) { p.WrittenSince = map[string]uint64{"repl-1": 1 << 40} },
			func(r *agentclient.Copy) { r.LastSnapshotUnixNano = now.Add(-time.Second).UnixNano() }, true},
		{"young replica, primary published", func(p *agentclient.Copy) { p.Mounted = true },
			func(r *agentclient.Copy) { r.LastSnapshotUnixNano = now.Add(-time.Second).UnixNano() }, true},
		{"a primary on the target", nil, func(r *agentclient.Copy) { r.Role = contract.RolePrimary }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, r := primary, replica
			if tt.primary != nil {
				tt.primary(&p)
			}
			if tt.replica != nil {
				tt.replica(&r)
			}
			m := &Migrator{now: func() time.Time { return now }}
			source := copyOn{node: cluster.Node{Info: agentclient.NodeInfo{NodeID: "n1"}}, copy: p}
			target := copyOn{node: cluster.Node{Info: agentclient.NodeInfo{NodeID: "n2"}}, copy: r}
			v := view{copies: []copyOn{source, target}}
			if got := m.targetFresh(source, target.node, v); got != tt.wantFresh {
				t.Errorf("targetFresh = %v, want %v", got, tt.wantFresh)
			}
		})
	}
}

// TestAMoveToAnIdleReplicaSkipsItsCatchUp: a replica last pushed long
// ago, the unpublished primary having had little written since its
// snapshot (a backup took a newer one), is brought up to date by the
// final step alone: the first publish starts the move at its final
// step, with no catch-up.
func TestAMoveToAnIdleReplicaSkipsItsCatchUp(t *testing.T) {
	longAgo := time.Now().Add(-time.Hour).UnixNano()
	for _, tt := range []struct {
		name        string
		written     uint64
		wantCatchUp bool
	}{
		{"little written", 1 << 20, false},
		{"much written", DefaultCatchUpFreshBytes + 1, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, agents := fakeCluster(t, []string{"n1", "n2", "n3"}, nil, []copyOf{
				{node: "n1", role: contract.RolePrimary, gen: 1, snapAt: longAgo, lastSnapshot: "s2", written: map[string]uint64{"s1": tt.written, "s2": 0}},
				{node: "n2", role: contract.RoleReplica, gen: 1, snapAt: longAgo, lastSnapshot: "s1"},
			}, nil)
			m.CatchUpWait = 10 * time.Second
			gen, err := m.Publish(context.Background(), testVolume, "n2")
			if err != nil || gen != 2 {
				t.Fatalf("Publish: generation %d, %v; want 2", gen, err)
			}
			caughtUp := slices.Contains(agents["n1"].Purposes(), "catch-up for the move to n2")
			if caughtUp != tt.wantCatchUp {
				t.Errorf("n1 pushed for: %q; want a catch-up: %v", agents["n1"].Purposes(), tt.wantCatchUp)
			}
		})
	}
}
