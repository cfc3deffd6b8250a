package migration

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster/clustertest"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

func on(node, role string, gen uint64, lastSnap int64) copyOn {
	return copyOn{node: cluster.Node{Info: agentclient.NodeInfo{NodeID: node}},
		copy: agentclient.Copy{NodeID: node, Exists: true, Role: role, Generation: gen, LastSnapshotUnixNano: lastSnap}}
}

func withGUIDs(c copyOn, guids ...uint64) copyOn {
	c.copy.SnapshotGUIDs = guids
	return c
}

// TestFailoverNeverPicksAnUnpromisedReplica: a replica whose generation
// no node of a majority promised came from a peer's header alone (a
// planted replica): a failover promotes the highest generation a majority
// promised, not it.
func TestFailoverNeverPicksAnUnpromisedReplica(t *testing.T) {
	nodes := []cluster.Node{{Info: agentclient.NodeInfo{NodeID: "n1"}}, {Info: agentclient.NodeInfo{NodeID: "n2"}}, {Info: agentclient.NodeInfo{NodeID: "n3"}}}
	genuine, planted := on("n2", "replica", 3, 5), on("n3", "replica", 1<<40, 9)
	tests := []struct {
		name     string
		promises []promised
		nodes    []cluster.Node
		want     string
	}{
		{"a majority promised only the genuine generation", []promised{{3, "n1", "n1"}, {3, "n1", "n2"}}, nodes, "n2"},
		{"a majority promised the high one", []promised{{1 << 40, "n3", "n2"}}, nodes, "n3"},
		{"no majority answered: nothing is known", []promised{{3, "n1", "n1"}}, nodes[:1], "n3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := view{nodes: tt.nodes, copies: []copyOn{genuine, planted}, promises: tt.promises}
			if len(tt.nodes) < len(nodes) {
				v.unreachable = []string{"n2:1", "n3:1"}
			}
			r, ok := v.failoverReplica("n1")
			if !ok || r.nodeID() != tt.want {
				t.Errorf("failover promotes the replica on %q (%v), want %q", r.nodeID(), ok, tt.want)
			}
		})
	}
}

func TestViewPicksThePrimaryAndTheFreshestReplica(t *testing.T) {
	tests := []struct {
		name          string
		copies        []copyOn
		onNode        string
		primary       string // "" when none
		freshest      string // "" when none
		maxGeneration uint64
	}{
		{name: "nothing"},
		{name: "one primary", copies: []copyOn{on("n1", "primary", 1, 0), on("n2", "replica", 1, 5)}, primary: "n1", freshest: "n2", maxGeneration: 1},
		{name: "a move between promotion and demotion: the newer generation",
			copies: []copyOn{on("n1", "primary", 1, 9), on("n2", "primary", 2, 9)}, primary: "n2", maxGeneration: 2},
		{name: "failover: the newest snapshot wins",
			copies: []copyOn{on("n2", "replica", 1, 5), on("n3", "replica", 1, 7)}, freshest: "n3", maxGeneration: 1},
		{name: "a tie goes to the newer generation",
			copies: []copyOn{on("n2", "replica", 3, 7), on("n3", "replica", 2, 7)}, freshest: "n2", maxGeneration: 3},
		// The old primary's clock ran ahead: its snapshots' names are
		// later than the new primary's, but the newer generation wins.
		{name: "the generation decides before any clock",
			copies: []copyOn{on("n2", "replica", 2, 9_000), on("n3", "replica", 3, 5)}, freshest: "n3", maxGeneration: 3},
		// Within one generation the snapshots' lineage decides: n3 holds
		// n2's newest snapshot and one more, though the primary's clock
		// stepped back between them.
		{name: "lineage decides before the clock",
			copies: []copyOn{withGUIDs(on("n2", "replica", 2, 9_000), 1, 2, 3), withGUIDs(on("n3", "replica", 2, 5), 2, 3, 4)}, freshest: "n3", maxGeneration: 2},
		{name: "without overlap the names decide",
			copies: []copyOn{withGUIDs(on("n2", "replica", 2, 9_000), 1, 2), withGUIDs(on("n3", "replica", 2, 5), 7, 8)}, freshest: "n2", maxGeneration: 2},
		{name: "the operator's chosen node",
			copies: []copyOn{on("n2", "replica", 1, 5), on("n3", "replica", 1, 7)}, onNode: "n2", freshest: "n2", maxGeneration: 1},
		{name: "the operator's node holds none",
			copies: []copyOn{on("n3", "replica", 1, 7)}, onNode: "n2", maxGeneration: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := view{copies: tt.copies}
			p, ok := v.primary()
			if got := map[bool]string{true: p.nodeID()}[ok]; got != tt.primary {
				t.Errorf("primary on %q, want %q", got, tt.primary)
			}
			r, ok := v.freshestReplica(tt.onNode)
			if got := map[bool]string{true: r.nodeID()}[ok]; got != tt.freshest {
				t.Errorf("freshest replica on %q, want %q", got, tt.freshest)
			}
			if got := v.maxGeneration(); got != tt.maxGeneration {
				t.Errorf("max generation %d, want %d", got, tt.maxGeneration)
			}
		})
	}
}

// TestFailoverPrefersTheTarget: a failover for a publish on a node
// promotes that node's replica when it is as fresh as any, never a staler
// one. Promoting another node's then moving it set the target's replica
// aside (the demo's clean-up found it).
func TestFailoverPrefersTheTarget(t *testing.T) {
	tests := []struct {
		name   string
		copies []copyOn
		target string
		want   string
	}{
		{"the target's replica is as fresh", []copyOn{withGUIDs(on("n2", "replica", 1, 7), 1, 2), withGUIDs(on("n3", "replica", 1, 7), 1, 2)}, "n3", "n3"},
		{"the target's is as fresh by the clock", []copyOn{on("n2", "replica", 1, 7), on("n3", "replica", 1, 7)}, "n3", "n3"},
		{"the target's is staler", []copyOn{withGUIDs(on("n2", "replica", 1, 7), 1, 2, 3), withGUIDs(on("n3", "replica", 1, 9), 1, 2)}, "n3", "n2"},
		{"the target's is of an older generation", []copyOn{on("n2", "replica", 2, 7), on("n3", "replica", 1, 7)}, "n3", "n2"},
		{"the target holds none", []copyOn{on("n2", "replica", 1, 7)}, "n1", "n2"},
		{"the freshest is the target's", []copyOn{on("n2", "replica", 1, 5), on("n3", "replica", 1, 7)}, "n3", "n3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, ok := (view{copies: tt.copies}).failoverReplica(tt.target)
			if got := map[bool]string{true: r.nodeID()}[ok]; got != tt.want {
				t.Errorf("failover promotes the replica on %q, want %q", got, tt.want)
			}
		})
	}
}

func TestConflictingPrimaries(t *testing.T) {
	tests := []struct {
		name   string
		copies []copyOn
		want   []string
	}{
		{"one primary", []copyOn{on("n1", "primary", 2, 0), on("n2", "replica", 2, 0)}, nil},
		{"an older primary is stale, not a conflict", []copyOn{on("n1", "primary", 1, 0), on("n2", "primary", 2, 0)}, nil},
		{"two primaries of the newest generation", []copyOn{on("n1", "primary", 1, 0), on("n2", "primary", 3, 0), on("n3", "primary", 3, 0)}, []string{"n2", "n3"}},
		{"equal replicas are no conflict", []copyOn{on("n1", "primary", 3, 0), on("n2", "replica", 3, 0), on("n3", "replica", 3, 0)}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := (view{copies: tt.copies}).conflict(); !slices.Equal(got, tt.want) {
				t.Errorf("conflict %v, want %v", got, tt.want)
			}
		})
	}
	// Publish and Settle refuse such a volume and say why.
	m := &Migrator{log: hclog.NewNullLogger()}
	v := view{copies: []copyOn{on("n2", "primary", 3, 0), on("n3", "primary", 3, 0)}}
	err := m.settle(context.Background(), "vol-x", v)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "n2, n3") {
		t.Errorf("settle with two primaries of one generation: %v, want FailedPrecondition naming both nodes", err)
	}
}

// TestSettleSetsAsideWhatTheNewPrimaryMayLack: an older primary fenced
// for a move to the current primary's node becomes a replica only when
// the current primary's history holds its generation (the move's final
// snapshot promoted it). When a failover promoted the target instead, the
// fenced source may hold writes after the target's newest snapshot (its
// final push never arrived): as a replica of the new generation it would
// refuse every push, those writes in no copy an operator is told of. It
// is set aside, as any other stale primary.
func TestSettleSetsAsideWhatTheNewPrimaryMayLack(t *testing.T) {
	tests := []struct {
		name        string
		movingTo    string // the stale primary's fence
		historyFrom uint64 // the current primary's
		aside       bool
	}{
		{"the move's target, promoted by the move", "n2", 1, false},
		{"the move's target, promoted by a failover", "n2", 2, true},
		{"the move's target, from an older node", "n2", 0, false},
		{"a lost primary come back", "", 1, true},
		{"fenced for a move elsewhere", "n3", 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stale := clustertest.NewFakeAgent(agentclient.NodeInfo{NodeID: "n1"})
			stale.PutCopy(agentclient.Copy{VolumeID: "vol-x", NodeID: "n1", Exists: true, Role: contract.RolePrimary, Generation: 1, MovingTo: tt.movingTo})
			old := on("n1", contract.RolePrimary, 1, 0)
			old.node.Agent, old.copy.MovingTo = stale, tt.movingTo
			current := on("n2", contract.RolePrimary, 2, 0)
			current.copy.HistoryFrom = tt.historyFrom
			m := &Migrator{log: hclog.NewNullLogger(), now: time.Now}
			if err := m.settle(context.Background(), "vol-x", view{copies: []copyOn{old, current}, background: true}); err != nil {
				t.Fatal(err)
			}
			if got := slices.Contains(stale.SetAside(), "vol-x"); got != tt.aside {
				t.Errorf("set aside: %v, want %v", got, tt.aside)
			}
		})
	}
}

func TestNextGeneration(t *testing.T) {
	tests := []struct {
		name     string
		copies   []copyOn
		promises []promised
		holder   string
		want     uint64
	}{
		{"above every copy", []copyOn{on("n1", "primary", 2, 0), on("n2", "replica", 2, 0)}, nil, "n2", 3},
		{"above every promise", []copyOn{on("n1", "primary", 2, 0)}, []promised{{generation: 4, holder: "n3"}}, "n2", 5},
		{"a retry finishes the promotion promised to the same node", []copyOn{on("n1", "primary", 1, 0), on("n2", "replica", 1, 0)},
			[]promised{{generation: 2, holder: "n2"}, {generation: 2, holder: "n2"}}, "n2", 2},
		{"a promise the holder's copy already has is spent", []copyOn{on("n2", "primary", 2, 0)}, []promised{{generation: 2, holder: "n2"}}, "n2", 3},
	}
	for _, tt := range tests {
		if got := (view{copies: tt.copies, promises: tt.promises}).nextGeneration(tt.holder); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
}

// TestPromisedAway: a promise above the copy's generation to another node
// stands in the way of lifting the copy's fence until the holder's own
// record promises a generation at least as high to another node (after
// which it can never be promoted with it); the holder answering without a
// primary is no proof.
func TestPromisedAway(t *testing.T) {
	p := on("n1", "primary", 1, 0)
	tests := []struct {
		name     string
		promises []promised
		away     bool
	}{
		{"nothing promised", nil, false},
		{"the holder's record still holds it: its promotion may be under way",
			[]promised{{2, "n2", "n1"}, {2, "n2", "n2"}, {2, "n2", "n3"}}, true},
		{"the holder's record holds none yet: a reservation may still reach it",
			[]promised{{2, "n2", "n1"}, {2, "n2", "n3"}}, true},
		{"the holder promised a newer generation to the copy's node: void",
			[]promised{{2, "n2", "n1"}, {3, "n1", "n2"}, {2, "n2", "n3"}}, false},
		{"the holder promised the same generation to a third node: void for the holder, the third stands",
			[]promised{{2, "n3", "n2"}, {2, "n3", "n1"}}, true},
		{"a promise to the copy's own node is no other primary",
			[]promised{{3, "n1", "n1"}, {3, "n1", "n2"}}, false},
		{"a promise not above the copy's generation", []promised{{1, "n2", "n2"}}, false},
	}
	for _, tt := range tests {
		if _, away := (view{promises: tt.promises}).promisedAway(p); away != tt.away {
			t.Errorf("%s: promised away %v, want %v", tt.name, away, tt.away)
		}
	}
}
