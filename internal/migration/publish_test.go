package migration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"

	"github.com/zfs-nomad/zfs-nomad/internal/cluster/clustertest"
	"github.com/zfs-nomad/zfs-nomad/internal/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/vocab"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// fakeAgents are node agents that keep one volume's copies and promises in
// memory and play by the agent protocol's rules (promises only upwards,
// promotion only with this node's promise, a push makes the target's copy
// a replica of the source's generation). They record the calls that change
// something, so a test sees what the controller decided.
type fakeAgents struct {
	mu    sync.Mutex
	nodes map[string]*fakeAgent // by node ID
	calls []string              // "Method@node", in order
	clock int64                 // unix nanos handed out to fences and snapshots
}

type fakeAgent struct {
	pb.UnimplementedNodeAgentServer
	all     *fakeAgents
	id      string
	copy    *pb.Copy // nil: holds none
	promise *pb.ReserveResponse
}

func (f *fakeAgents) record(method, node string) {
	f.calls = append(f.calls, method+"@"+node)
}

func (f *fakeAgents) tick() int64 {
	f.clock += int64(time.Second)
	return f.clock
}

func (a *fakeAgent) GetNode(context.Context, *pb.GetNodeRequest) (*pb.Node, error) {
	return &pb.Node{NodeId: a.id}, nil
}

func (a *fakeAgent) GetCopy(_ context.Context, req *pb.GetCopyRequest) (*pb.Copy, error) {
	a.all.mu.Lock()
	defer a.all.mu.Unlock()
	out := &pb.Copy{VolumeId: req.GetVolumeId(), NodeId: a.id}
	if a.copy != nil {
		out = proto.Clone(a.copy).(*pb.Copy)
		out.Exists, out.NodeId = true, a.id
	}
	out.PromisedGeneration, out.PromisedHolder = a.promise.GetPromisedGeneration(), a.promise.GetPromisedHolder()
	return out, nil
}

func (a *fakeAgent) Reserve(_ context.Context, req *pb.ReserveRequest) (*pb.ReserveResponse, error) {
	a.all.mu.Lock()
	defer a.all.mu.Unlock()
	a.all.record("Reserve", a.id)
	known := a.promise.GetPromisedGeneration()
	if a.promise.GetPromisedGeneration() == req.GetGeneration() && a.promise.GetPromisedHolder() == req.GetHolderNodeId() {
		return &pb.ReserveResponse{Granted: true}, nil
	}
	if a.copy != nil {
		known = max(known, a.copy.GetGeneration())
	}
	if req.GetGeneration() <= known {
		return &pb.ReserveResponse{PromisedGeneration: known, PromisedHolder: a.promise.GetPromisedHolder()}, nil
	}
	a.promise = &pb.ReserveResponse{PromisedGeneration: req.GetGeneration(), PromisedHolder: req.GetHolderNodeId()}
	return &pb.ReserveResponse{Granted: true}, nil
}

// fence is Fence's work (a move's final push does it first); the caller
// holds a.all.mu.
func (a *fakeAgent) fence(target string) (int64, error) {
	a.all.record("Fence", a.id)
	if a.copy.GetRole() != vocab.RolePrimary {
		return 0, errdefs.ToStatus(errdefs.Wrap(errdefs.ErrFailedPrecondition, "no primary on %s", a.id))
	}
	if a.copy.GetMovingTo() == "" {
		a.copy.MovingTo, a.copy.FencedUnixNano = target, a.all.tick()
	}
	return a.copy.GetFencedUnixNano(), nil
}

func (a *fakeAgent) Unfence(context.Context, *pb.UnfenceRequest) (*pb.Copy, error) {
	a.all.mu.Lock()
	defer a.all.mu.Unlock()
	a.all.record("Unfence", a.id)
	a.copy.MovingTo, a.copy.LeaseFenced = "", false
	return proto.Clone(a.copy).(*pb.Copy), nil
}

// Replicate pushes this node's copy to the target: a snapshot taken now,
// received as a replica of this copy's generation.
func (a *fakeAgent) Replicate(req *pb.ReplicateRequest, stream pb.NodeAgent_ReplicateServer) error {
	a.all.mu.Lock()
	var fencedAt int64
	if target := req.GetFenceForNodeId(); target != "" {
		at, err := a.fence(target)
		if err != nil {
			a.all.mu.Unlock()
			return err
		}
		fencedAt = at
	}
	a.all.record("Replicate", a.id)
	addr := req.GetTargetAddress()
	target := a.all.nodes[strings.TrimSuffix(addr[strings.LastIndex(addr, "/")+1:], ":7670")]
	at := a.all.tick()
	snap := fmt.Sprintf("%s@%s%d", req.GetVolumeId(), vocab.ReplicationSnapshotPrefix, at)
	target.copy = &pb.Copy{VolumeId: req.GetVolumeId(), Role: vocab.RoleReplica, Generation: a.copy.GetGeneration(),
		Parameters: a.copy.GetParameters(), LastSnapshot: snap, LastSnapshotUnixNano: at}
	a.all.mu.Unlock()
	return stream.Send(&pb.ReplicateProgress{Kind: "incremental", Snapshot: snap, Done: true, FencedUnixNano: fencedAt})
}

func (a *fakeAgent) Promote(_ context.Context, req *pb.PromoteRequest) (*pb.Copy, error) {
	a.all.mu.Lock()
	defer a.all.mu.Unlock()
	a.all.record("Promote", a.id)
	if a.promise.GetPromisedGeneration() != req.GetGeneration() || a.promise.GetPromisedHolder() != a.id {
		return nil, errdefs.ToStatus(errdefs.Wrap(errdefs.ErrFailedPrecondition, "generation %d not promised to %s", req.GetGeneration(), a.id))
	}
	if a.copy.GetRole() != vocab.RoleReplica || a.copy.GetLastSnapshotUnixNano() < req.GetNotBeforeUnixNano() {
		return nil, errdefs.ToStatus(errdefs.Wrap(errdefs.ErrFailedPrecondition, "no replica on %s fresh enough", a.id))
	}
	a.copy.Role, a.copy.Generation = vocab.RolePrimary, req.GetGeneration()
	out := proto.Clone(a.copy).(*pb.Copy)
	out.NodeId, out.Exists = a.id, true
	return out, nil
}

func (a *fakeAgent) Demote(_ context.Context, req *pb.DemoteRequest) (*pb.Copy, error) {
	a.all.mu.Lock()
	defer a.all.mu.Unlock()
	a.all.record("Demote", a.id)
	switch {
	case a.copy == nil || a.copy.GetRole() != vocab.RolePrimary:
	case a.copy.GetMovingTo() != "" && !req.GetAside():
		a.copy.Role, a.copy.Generation, a.copy.MovingTo = vocab.RoleReplica, req.GetGeneration(), ""
	default:
		a.copy = nil // set aside
	}
	return &pb.Copy{}, nil
}

// copyOf describes a node's copy for a test table.
type copyOf struct {
	node     string
	role     string
	gen      uint64
	snapAt   int64  // unix nanos of its newest snapshot
	movingTo string // a fenced primary's target
	params   map[string]string
}

// fakeCluster serves a fake agent for each of nodes, holding copies and
// promises (node -> "GEN HOLDER"); the nodes in down are peers that do
// not answer.
func fakeCluster(t *testing.T, nodes []string, down []string, copies []copyOf, promises map[string]string) (*Migrator, *fakeAgents) {
	t.Helper()
	all := &fakeAgents{nodes: map[string]*fakeAgent{}, clock: int64(100 * time.Second)}
	var served clustertest.Agents
	for _, id := range nodes {
		a := &fakeAgent{all: all, id: id}
		for _, c := range copies {
			if c.node == id {
				a.copy = &pb.Copy{VolumeId: testVolume, Role: c.role, Generation: c.gen, MovingTo: c.movingTo,
					FencedUnixNano:       map[bool]int64{true: c.snapAt}[c.movingTo != ""],
					LastSnapshotUnixNano: c.snapAt, Parameters: c.params}
			}
		}
		if p, ok := promises[id]; ok {
			var gen uint64
			var holder string
			fmt.Sscanf(p, "%d %s", &gen, &holder)
			a.promise = &pb.ReserveResponse{PromisedGeneration: gen, PromisedHolder: holder}
		}
		all.nodes[id] = a
		served.Serve(t, id+":7670", a)
	}
	var extra []string
	for _, id := range down {
		extra = append(extra, id+":7670")
	}
	return New(served.Cluster(t, extra...), hclog.NewNullLogger()), all
}

var testVolume = vocab.VolumeIDForName("publish")

// TestPublishDecides: every branch of Publish against fake agents: the
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
		calls    []string // the changing calls, sorted (reservations run in parallel)
		say      string   // in the error
	}{
		{name: "already there", nodes: three, target: "n1", gen: 1,
			copies: []copyOf{{node: "n1", role: vocab.RolePrimary, gen: 1}, {node: "n2", role: vocab.RoleReplica, gen: 1, snapAt: 50}}},
		{name: "a move to the replica's node", nodes: three, target: "n2", gen: 2,
			copies: []copyOf{{node: "n1", role: vocab.RolePrimary, gen: 1}, {node: "n2", role: vocab.RoleReplica, gen: 1, snapAt: 50}},
			calls:  []string{"Demote@n1", "Fence@n1", "Promote@n2", "Replicate@n1", "Reserve@n1", "Reserve@n2", "Reserve@n3"}},
		{name: "a move to a node without a copy", nodes: three, target: "n3", gen: 2,
			copies: []copyOf{{node: "n1", role: vocab.RolePrimary, gen: 1}},
			calls:  []string{"Demote@n1", "Fence@n1", "Promote@n3", "Replicate@n1", "Reserve@n1", "Reserve@n2", "Reserve@n3"}},
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
			calls: []string{"Demote@n3", "Fence@n3", "Promote@n2", "Promote@n3", "Replicate@n3",
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
			m, all := fakeCluster(t, tt.nodes, tt.down, tt.copies, tt.promises)
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
				all.mu.Lock()
				calls := slices.Clone(all.calls)
				all.mu.Unlock()
				slices.Sort(calls)
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
