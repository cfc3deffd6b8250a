package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster/clustertest"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/peers"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// agent answers GetNode, and GetCopy with the errors it is given, one per
// call, before its copy.
type agent struct {
	pb.UnimplementedNodeAgentServer
	id        string
	nodeErr   error
	copyErrs  []error
	copyCalls atomic.Int32
	unhealthy string // its health, when read
}

// GetNode reports its capacity (42 bytes) and health unless asked without.
func (a *agent) GetNode(_ context.Context, req *pb.GetNodeRequest) (*pb.Node, error) {
	if a.nodeErr != nil {
		return nil, a.nodeErr
	}
	n := &pb.Node{NodeId: a.id}
	if !req.GetWithoutCapacity() && !req.GetWithoutHealth() {
		n.AvailableBytes = 42
	}
	if !req.GetWithoutHealth() {
		n.UnhealthyReason = a.unhealthy
	}
	return n, nil
}

func (a *agent) GetCopy(_ context.Context, req *pb.GetCopyRequest) (*pb.Copy, error) {
	if n := int(a.copyCalls.Add(1)); n <= len(a.copyErrs) {
		return nil, a.copyErrs[n-1]
	}
	return &pb.Copy{VolumeId: req.GetVolumeId(), Exists: true, Generation: 7}, nil
}

// serve serves the agents in memory; extra names peers nobody serves.
func serve(t *testing.T, agents []*agent, extra ...string) *cluster.Cluster {
	t.Helper()
	var served clustertest.Agents
	for _, a := range agents {
		served.Serve(t, a.id+":7670", a)
	}
	return served.Cluster(t, extra...)
}

func TestAsk(t *testing.T) {
	unavailable := status.Error(codes.Unavailable, "connection reset")
	notFound := status.Error(codes.NotFound, "no copy")
	tests := []struct {
		name            string
		agents          []*agent
		extra           []string
		want            []string // "node: generation or error code"
		wantUnreachable int
	}{
		{
			name:   "every node answers both, sorted by node ID",
			agents: []*agent{{id: "n2"}, {id: "n1"}},
			want:   []string{"n1: 7", "n2: 7"},
		},
		{
			name:   "a node's refusal is its answer, not unreachability",
			agents: []*agent{{id: "n1", copyErrs: []error{notFound}}, {id: "n2"}},
			want:   []string{"n1: NotFound", "n2: 7"},
		},
		{
			name:   "a question lost to a connection failure is asked again once the node answered",
			agents: []*agent{{id: "n1", copyErrs: []error{unavailable}}},
			want:   []string{"n1: 7"},
		},
		{
			name:   "it is asked again only once",
			agents: []*agent{{id: "n1", copyErrs: []error{unavailable, unavailable}}},
			want:   []string{"n1: Unavailable"},
		},
		{
			name:            "a node that cannot say who it is is unreachable",
			agents:          []*agent{{id: "n1", nodeErr: status.Error(codes.Internal, "broken")}, {id: "n2"}},
			extra:           []string{"gone:7670"},
			want:            []string{"n2: 7"},
			wantUnreachable: 2,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := serve(t, tc.agents, tc.extra...)
			answers, unreachable, err := cluster.Ask(context.Background(), c, func(ctx context.Context, a cluster.Agent) (agentclient.Copy, error) {
				return a.GetCopy(ctx, "v")
			})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, a := range answers {
				if a.Node.Info.AvailableBytes != 0 {
					t.Errorf("Ask read %s's capacity; it asks without", a.Node.Info.NodeID)
				}
				if a.Err != nil {
					got = append(got, fmt.Sprintf("%s: %s", a.Node.Info.NodeID, status.Code(a.Err)))
				} else {
					got = append(got, fmt.Sprintf("%s: %d", a.Node.Info.NodeID, a.Object.Generation))
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) || len(unreachable) != tc.wantUnreachable {
				t.Errorf("answers %v, %d unreachable; want %v, %d", got, len(unreachable), tc.want, tc.wantUnreachable)
			}
		})
	}
}

// Nodes, which placement uses, reads the capacity.
func TestNodesReadCapacity(t *testing.T) {
	c := serve(t, []*agent{{id: "n1"}})
	nodes, _, err := c.Nodes(context.Background())
	if err != nil || len(nodes) != 1 || nodes[0].Info.AvailableBytes != 42 {
		t.Fatalf("Nodes = %v, %v; want n1 with its capacity", nodes, err)
	}
}

// TestEachAsksAtOnce: a fan-out asks every node at the same time (each
// question here waits until all have been asked: asked one after another,
// the first would wait forever), and answers in the order of the nodes.
func TestEachAsksAtOnce(t *testing.T) {
	c := serve(t, []*agent{{id: "n1"}, {id: "n2"}, {id: "n3"}})
	nodes, _, err := c.Nodes(context.Background())
	if err != nil || len(nodes) != 3 {
		t.Fatalf("nodes %v, %v", nodes, err)
	}
	slices.Reverse(nodes)
	var asked sync.WaitGroup
	asked.Add(len(nodes))
	all := make(chan struct{})
	go func() { asked.Wait(); close(all) }()
	answers := cluster.Each(context.Background(), c, nodes, func(ctx context.Context, n cluster.Node) (string, error) {
		asked.Done()
		select {
		case <-all:
			return n.Info.NodeID, nil
		case <-ctx.Done():
			return "", fmt.Errorf("node %s was asked alone: %w", n.Info.NodeID, ctx.Err())
		}
	})
	var got []string
	for _, a := range answers {
		if a.Err != nil {
			t.Fatal(a.Err)
		}
		got = append(got, a.Object+"@"+a.Node.Info.NodeID)
	}
	if want := []string{"n3@n3", "n2@n2", "n1@n1"}; !slices.Equal(got, want) {
		t.Errorf("answers %q, want %q", got, want)
	}
}

// TestHoldingsPagesTheVolumes: Holdings lists a node's primaries in pages
// of HoldingPage, each call under its own deadline, and returns every
// primary once: one call for a thousand volumes outlasted the agent
// timeout in the guest (BenchmarkScale's round planned nothing).
func TestHoldingsPagesTheVolumes(t *testing.T) {
	for _, count := range []int{0, cluster.HoldingPage, cluster.HoldingPage + 1, 2*cluster.HoldingPage + 50} {
		t.Run(fmt.Sprint(count), func(t *testing.T) {
			var fakes clustertest.Fakes
			n1 := fakes.Add(agentclient.NodeInfo{NodeID: "n1", MaxVolumes: 10000})
			want := map[string]bool{}
			for i := range count {
				want[n1.PutPrimary(fmt.Sprintf("vol-%d", i), 1)] = true
			}
			c := fakes.Cluster(t)
			nodes, _, err := c.Nodes(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			answers := cluster.Holdings(context.Background(), c, nodes)
			if len(answers) != 1 || answers[0].Err != nil {
				t.Fatalf("answers %+v", answers)
			}
			got := map[string]bool{}
			for _, v := range answers[0].Object.Volumes {
				if got[v.VolumeID] {
					t.Errorf("%s listed twice", v.VolumeID)
				}
				got[v.VolumeID] = true
			}
			if len(got) != len(want) {
				t.Errorf("%d primaries listed, want %d", len(got), len(want))
			}
			calls := 0
			for _, call := range n1.Calls() {
				if call == "ListVolumes" {
					calls++
				}
			}
			if wantCalls := max(1, (count+cluster.HoldingPage-1)/cluster.HoldingPage); calls != wantCalls {
				t.Errorf("%d ListVolumes calls for %d primaries, want %d", calls, count, wantCalls)
			}
		})
	}
}

// slowStatus is a node whose Status, a listing of its root, takes longer
// than one agent timeout.
type slowStatus struct {
	*clustertest.FakeAgent
	took time.Duration
}

func (s slowStatus) Status(ctx context.Context) (agentclient.NodeStatus, error) {
	select {
	case <-time.After(s.took):
		return s.FakeAgent.Status(ctx)
	case <-ctx.Done():
		return agentclient.NodeStatus{}, ctx.Err()
	}
}

// TestHoldingsWaitsForASlowStatus: a node's Status lists its root and
// cannot be paged; at a thousand volumes under a slow pool it outlasted
// one agent timeout, and the schedule's full plan planned nothing. It
// gets several (CallListing); every paged call still gets one.
func TestHoldingsWaitsForASlowStatus(t *testing.T) {
	const timeout = 100 * time.Millisecond
	agent := slowStatus{clustertest.NewFakeAgent(agentclient.NodeInfo{NodeID: "n1", AvailableBytes: 1 << 30}), 3 * timeout}
	connect := func(string) (cluster.NodeAgent, error) { return agent, nil }
	c := cluster.NewWithAgents(peers.Static{"n1:7670"}, connect, timeout, hclog.NewNullLogger())
	t.Cleanup(c.Close)
	nodes, _, err := c.Nodes(context.Background())
	if err != nil || len(nodes) != 1 {
		t.Fatalf("nodes %v, %v", nodes, err)
	}
	answers := cluster.Holdings(context.Background(), c, nodes)
	if len(answers) != 1 || answers[0].Err != nil {
		t.Fatalf("Holdings of a node whose Status takes three agent timeouts: %+v", answers)
	}
}

// TestWaiting: the question of which stages wait reads no node's health
// or capacity: an unhealthy node answers it as any other.
func TestWaiting(t *testing.T) {
	c := serve(t, []*agent{{id: "n2", unhealthy: "pool tank is FAULTED"}, {id: "n1"}})
	nodes, err := cluster.Waiting(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, n := range nodes {
		got = append(got, fmt.Sprintf("%s %q %d", n.Info.NodeID, n.Info.UnhealthyReason, n.Info.AvailableBytes))
	}
	if want := []string{`n1 "" 0`, `n2 "" 0`}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	all, _, err := c.Nodes(context.Background())
	if err != nil || len(all) != 2 || all[1].Info.UnhealthyReason == "" || all[0].Info.AvailableBytes != 42 {
		t.Errorf("Nodes, with health and capacity: %+v, %v", all, err)
	}
}
