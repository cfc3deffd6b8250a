package migration

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster/clustertest"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// TestAFailoverCountsTheNodesTheControllerNoLongerLists: five nodes
// a-e; a holds the primary and still hears b and c, so it keeps its
// lease (three of five). The controller's peer list, rendered from
// service discovery, lost a and b: it names only c, d and e. c, beside
// a, does not answer the controller; d and e grant the failover. Two of
// the three listed would be a majority of the list, and the failover
// would meet a's lease nowhere: two writers. The nodes report that their
// leases count five (KnownNodes), so two answering are no majority and
// nothing is decided. The control: nodes that report only three grant
// the failover, and each reservation asks the node to attest every peer
// it knows beyond d and e (Failover, Answering), since the controller
// cannot name the others.
func TestAFailoverCountsTheNodesTheControllerNoLongerLists(t *testing.T) {
	auto := map[string]string{contract.ParamFailover: contract.FailoverAuto}
	tests := []struct {
		name       string
		knownNodes int
		want       error // nil: the failover is granted
	}{
		{"the nodes' leases count five", 5, errdefs.ErrUnavailable},
		{"the nodes know only the three listed (control)", 3, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var fakes clustertest.Fakes
			agents := map[string]*clustertest.FakeAgent{}
			for _, id := range []string{"c", "d", "e"} {
				agents[id] = fakes.Add(agentclient.NodeInfo{NodeID: id, KnownNodes: tt.knownNodes})
			}
			for _, id := range []string{"c", "d"} {
				agents[id].PutCopy(agentclient.Copy{VolumeID: testVolume, Role: contract.RoleReplica, Generation: 1, LastSnapshotUnixNano: 5, Parameters: auto})
			}
			for _, a := range agents {
				a.Promise(testVolume, 1, "a")
			}
			agents["c"].SetDown(true)
			m := New(fakes.Cluster(t), hclog.NewNullLogger())

			gen, err := m.Publish(context.Background(), testVolume, "d")
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("publish to d = generation %d, %v; want %v", gen, err, tt.want)
			}
			for _, id := range []string{"d", "e"} {
				rs := agents[id].Reservations()
				if tt.want != nil {
					// Two answering of five: no majority to decide from,
					// so nothing is reserved either.
					if len(rs) > 0 {
						t.Errorf("node %s was asked for reservations %+v with two of five nodes answering", id, rs)
					}
					continue
				}
				if len(rs) == 0 {
					t.Fatalf("node %s was asked for no reservation", id)
				}
				if r := rs[0]; !r.Failover || !slices.Equal(r.Answering, []string{"d", "e"}) {
					t.Errorf("node %s's reservation: failover %v, answering %v; want a failover naming d and e as answering", id, r.Failover, r.Answering)
				}
			}
		})
	}
}

// TestAVolumeNoListedNodeHoldsIsNotGoneWhileOthersAreUnheard: the
// controller lists d and e, both answering and holding nothing of the
// volume (only a promise), while the nodes' leases count three: the
// third, away from service discovery, may hold every copy. A publish
// must answer Unavailable, not that the volume does not exist; with the
// nodes counting only the two listed (control), NotFound.
func TestAVolumeNoListedNodeHoldsIsNotGoneWhileOthersAreUnheard(t *testing.T) {
	for _, tt := range []struct {
		name       string
		knownNodes int
		want       error
	}{
		{"the nodes' leases count three", 3, errdefs.ErrUnavailable},
		{"the nodes count the two listed (control)", 2, errdefs.ErrNotFound},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var fakes clustertest.Fakes
			for _, id := range []string{"d", "e"} {
				fakes.Add(agentclient.NodeInfo{NodeID: id, KnownNodes: tt.knownNodes}).Promise(testVolume, 1, "a")
			}
			m := New(fakes.Cluster(t), hclog.NewNullLogger())
			if _, err := m.Publish(context.Background(), testVolume, "d"); !errors.Is(err, tt.want) {
				t.Fatalf("publish to d: %v, want %v", err, tt.want)
			}
		})
	}
}

// TestSilentNodesAreNamedOrCounted: an error for a view without every
// node names the unreachable agents and counts the nodes only the leases
// know, and reads whole when either is missing.
func TestSilentNodesAreNamedOrCounted(t *testing.T) {
	answered := []cluster.Node{{Info: agentclient.NodeInfo{NodeID: "n2"}}}
	tests := []struct {
		name        string
		unreachable []string
		members     int
		want        string
	}{
		{"unreachable only", []string{"n1", "n3"}, 3, "unreachable agents n1, n3"},
		{"unlisted only", nil, 3, "2 node(s) the nodes' leases count that the controller's peer list no longer names"},
		{"both", []string{"n1"}, 3, "unreachable agents n1, and 1 node(s) the nodes' leases count that the controller's peer list no longer names"},
		{"neither", nil, 1, "none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := view{nodes: answered, unreachable: tt.unreachable, members: tt.members}
			if got := v.silent(); got != tt.want {
				t.Errorf("silent() = %q, want %q", got, tt.want)
			}
		})
	}
}
