package migration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/cluster/clustertest"
	"github.com/zfs-nomad/zfs-nomad/internal/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/vocab"
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
					LastSnapshotUnixNano: map[bool]int64{false: c.snapAt, true: time.Now().UnixNano()}[c.fresh], Parameters: c.params})
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

var testVolume = vocab.VolumeIDForName("publish")

// TestPublishDecides: every branch of Publish against fake agents
// (clustertest.FakeAgent, in the agent client's plain types): the
// generation it answers, the error kind it refuses with, and the calls
// that changed something, in order.
func TestPublishDecides(t *testing.T) {
	three := []string{"n1", "n2", "n3"}
	auto := map[string]string{vocab.ParamFailover: vocab.FailoverAuto}
	pinned := map[string]string{vocab.ParamPinned: "true"}
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
			copies: []copyOf{{node: "n1", role: vocab.RolePrimary, gen: 1}, {node: "n2", role: vocab.RoleReplica, gen: 1, snapAt: 50}}},
		{name: "a move to a stale replica's node: caught up first", nodes: three, target: "n2", gen: 2,
			copies: []copyOf{{node: "n1", role: vocab.RolePrimary, gen: 1}, {node: "n2", role: vocab.RoleReplica, gen: 1, snapAt: 50}},
			calls:  []string{"Demote@n1", "MoveFinal@n1", "Promote@n2", "Replicate@n1", "Reserve@n1", "Reserve@n2", "Reserve@n3"}},
		{name: "a move to a fresh replica's node: no catch-up", nodes: three, target: "n2", gen: 2,
			copies: []copyOf{{node: "n1", role: vocab.RolePrimary, gen: 1}, {node: "n2", role: vocab.RoleReplica, gen: 1, fresh: true}},
			calls:  []string{"Demote@n1", "MoveFinal@n1", "Promote@n2", "Reserve@n1", "Reserve@n2", "Reserve@n3"}},
		{name: "a move to a node without a copy", nodes: three, target: "n3", gen: 2,
			copies: []copyOf{{node: "n1", role: vocab.RolePrimary, gen: 1}},
			calls:  []string{"Demote@n1", "MoveFinal@n1", "Promote@n3", "Replicate@n1", "Reserve@n1", "Reserve@n2", "Reserve@n3"}},
		{name: "the source refuses the final push: nothing is promoted", nodes: three, target: "n2", err: errdefs.ErrFailedPrecondition, say: "fencing volume",
			copies: []copyOf{{node: "n1", role: vocab.RolePrimary, gen: 1}}, refuse: []string{"n1 MoveFinal"},
			calls: []string{"MoveFinal@n1", "Replicate@n1", "Reserve@n1", "Reserve@n2", "Reserve@n3"}},
		{name: "the target refuses the promotion: the source is not demoted", nodes: three, target: "n2", err: errdefs.ErrFailedPrecondition, say: "promoting the copy on node n2",
			copies: []copyOf{{node: "n1", role: vocab.RolePrimary, gen: 1}}, refuse: []string{"n2 Promote"},
			calls: []string{"MoveFinal@n1", "Promote@n2", "Replicate@n1", "Reserve@n1", "Reserve@n2", "Reserve@n3"}},
		{name: "still published on the source: caught up, not moved", nodes: three, target: "n2", err: errdefs.ErrFailedPrecondition, say: "still published on node n1",
			copies: []copyOf{{node: "n1", role: vocab.RolePrimary, gen: 1, mounted: true}},
			calls:  []string{"Replicate@n1"}},
		{name: "a pinned volume does not move", nodes: three, target: "n2", err: errdefs.ErrFailedPrecondition, say: "pinned",
			copies: []copyOf{{node: "n1", role: vocab.RolePrimary, gen: 1, params: pinned}}},
		{name: "an abandoned move: the fence is lifted", nodes: three, target: "n1", gen: 1,
			copies: []copyOf{{node: "n1", role: vocab.RolePrimary, gen: 1, movingTo: "n2", snapAt: 10}},
			calls:  []string{"Unfence@n1"}},
		{name: "failover auto: the target's replica, as fresh as any", nodes: three, down: []string{"n4"}, target: "n3", gen: 2,
			copies: []copyOf{{node: "n2", role: vocab.RoleReplica, gen: 1, snapAt: 50, params: auto}, {node: "n3", role: vocab.RoleReplica, gen: 1, snapAt: 50, params: auto}},
			calls:  []string{"Promote@n3", "Reserve@n1", "Reserve@n2", "Reserve@n3"}},
		{name: "failover auto: the fresher replica, then a move", nodes: three, down: []string{"n4"}, target: "n2", gen: 3,
			copies: []copyOf{{node: "n2", role: vocab.RoleReplica, gen: 1, snapAt: 40, params: auto}, {node: "n3", role: vocab.RoleReplica, gen: 1, snapAt: 50, params: auto}},
			calls: []string{"Demote@n3", "MoveFinal@n3", "Promote@n2", "Promote@n3", "Replicate@n3",
				"Reserve@n1", "Reserve@n1", "Reserve@n2", "Reserve@n2", "Reserve@n3", "Reserve@n3"}},
		{name: "failover manual: the operator decides", nodes: three, down: []string{"n4"}, target: "n2", err: errdefs.ErrUnavailable, say: "zfs-controller promote",
			copies: []copyOf{{node: "n2", role: vocab.RoleReplica, gen: 1, snapAt: 50}}},
		{name: "no majority answers", nodes: []string{"n1"}, down: []string{"n2", "n3"}, target: "n1", err: errdefs.ErrUnavailable, say: "majority",
			copies: []copyOf{{node: "n1", role: vocab.RoleReplica, gen: 1, snapAt: 50, params: auto}}},
		{name: "the target does not answer", nodes: three, down: []string{"n4"}, target: "n4", err: errdefs.ErrUnavailable, say: "did not answer",
			copies: []copyOf{{node: "n1", role: vocab.RolePrimary, gen: 1}}},
		{name: "a node nobody knows", nodes: three, target: "n9", err: errdefs.ErrNotFound,
			copies: []copyOf{{node: "n1", role: vocab.RolePrimary, gen: 1}}},
		{name: "a newer generation promised to a silent node", nodes: three, down: []string{"n4"}, target: "n1", err: errdefs.ErrUnavailable, say: "promised to node n4",
			copies:   []copyOf{{node: "n1", role: vocab.RolePrimary, gen: 1}},
			promises: map[string]string{"n2": "2 n4"}},
		{name: "two primaries of one generation", nodes: three, target: "n1", err: errdefs.ErrFailedPrecondition, say: "set one aside",
			copies: []copyOf{{node: "n1", role: vocab.RolePrimary, gen: 2}, {node: "n2", role: vocab.RolePrimary, gen: 2}}},
		{name: "a stale primary is set aside, the newest published", nodes: three, target: "n2", gen: 2,
			copies: []copyOf{{node: "n1", role: vocab.RolePrimary, gen: 1}, {node: "n2", role: vocab.RolePrimary, gen: 2}},
			calls:  []string{"Demote@n1"}},
		{name: "a volume nobody holds", nodes: three, target: "n1", err: errdefs.ErrNotFound},
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
