package cluster

import (
	"errors"
	"slices"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

func TestPlace(t *testing.T) {
	nodes := []Candidate{
		{NodeID: "a", Topology: map[string]string{"node": "a", "rack": "r1"}, Available: 10 << 30, MaxQuota: 4 << 30, Volumes: 5},
		{NodeID: "b", Topology: map[string]string{"node": "b", "rack": "r1"}, Available: 20 << 30, MaxQuota: 4 << 30, Volumes: 9},
		{NodeID: "c", Topology: map[string]string{"node": "c", "rack": "r2"}, Available: 1 << 30, MaxQuota: 8 << 30, Volumes: 0, MaxVolumes: 1},
	}
	tests := []struct {
		name string
		req  Requirement
		want []string
		err  error
	}{
		{"most free first", Requirement{Bytes: 1}, []string{"b", "a", "c"}, nil},
		{"fewest volumes first", Requirement{Bytes: 1, Policy: "fewest-volumes"}, []string{"c", "a", "b"}, nil},
		{"requisite rack", Requirement{Bytes: 1, Requisite: []map[string]string{{"rack": "r1"}}}, []string{"b", "a"}, nil},
		{"preferred first", Requirement{Bytes: 1, Requisite: []map[string]string{{"rack": "r1"}}, Preferred: []map[string]string{{"node": "a"}}}, []string{"a", "b"}, nil},
		{"pinned", Requirement{Bytes: 1, Node: "a"}, []string{"a"}, nil},
		{"capacity filters", Requirement{Bytes: 2 << 30}, []string{"b", "a"}, nil},
		{"above every ceiling", Requirement{Bytes: 9 << 30}, nil, errdefs.ErrOutOfRange},
		{"no room", Requirement{Bytes: 5 << 30, Node: "c"}, nil, errdefs.ErrResourceExhausted},
		{"no topology match", Requirement{Bytes: 1, Requisite: []map[string]string{{"rack": "r9"}}}, nil, errdefs.ErrResourceExhausted},
		{"pinned to unknown", Requirement{Bytes: 1, Node: "zz"}, nil, errdefs.ErrResourceExhausted},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Place(nodes, tc.req)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			var ids []string
			for _, c := range got {
				ids = append(ids, c.NodeID)
			}
			if len(ids) != len(tc.want) {
				t.Fatalf("got %v, want %v", ids, tc.want)
			}
			for i := range ids {
				if ids[i] != tc.want[i] {
					t.Fatalf("got %v, want %v", ids, tc.want)
				}
			}
		})
	}
}

// TestReplicaTargets: the one rule the schedule and the operator's backup
// place replicas by: holders first, in their order, then the nodes of the
// source's replication domain with most room; never the source.
func TestReplicaTargets(t *testing.T) {
	node := func(id, domain string, availGiB uint64) Node {
		return Node{Info: agentclient.NodeInfo{NodeID: id, AvailableBytes: availGiB << 30, MaxQuotaBytes: 8 << 30,
			Topology: map[string]string{config.TopologyNodeKey: id, config.TopologyDomainKey: domain}}}
	}
	src, a, b, c, far := node("src", "d1", 50), node("a", "d1", 1), node("b", "d1", 5), node("c", "d1", 3), node("far", "d2", 100)
	healthy := []Node{src, a, b, c, far}
	tests := []struct {
		name    string
		want    int
		holders []Node
		bytes   uint64
		out     []string
		err     error
	}{
		{"most room in the domain", 2, nil, 1, []string{"b", "c"}, nil},
		{"holders first, in their order", 2, []Node{a, c}, 1, []string{"a", "c"}, nil},
		{"a holder, then the most room", 2, []Node{a}, 1, []string{"a", "b"}, nil},
		{"never the source", 1, []Node{src}, 1, []string{"b"}, nil},
		{"a holder in another domain is kept", 1, []Node{far}, 1, []string{"far"}, nil},
		{"fewer than asked: the domain holds three others", 4, nil, 1, []string{"b", "c", "a"}, nil},
		{"no room for the volume", 1, nil, 6 << 30, nil, errdefs.ErrResourceExhausted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ReplicaTargets(src, tt.bytes, tt.want, tt.holders, healthy)
			var ids []string
			for _, n := range got {
				ids = append(ids, n.Info.NodeID)
			}
			if !slices.Equal(ids, tt.out) {
				t.Errorf("targets %q, want %q", ids, tt.out)
			}
			if tt.err != nil && !errors.Is(err, tt.err) {
				t.Errorf("error %v, want %v", err, tt.err)
			}
		})
	}
}
