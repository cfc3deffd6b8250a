package scheduler

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/zfs-nomad/zfs-nomad/internal/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/cluster/clustertest"
	"github.com/zfs-nomad/zfs-nomad/internal/config"
	"github.com/zfs-nomad/zfs-nomad/internal/vocab"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// agent answers what the scheduler asks a node: who it is, its primaries
// and its replicas.
type agent struct {
	pb.UnimplementedNodeAgentServer
	node     *pb.Node
	volumes  []*pb.Volume
	replicas []*pb.Replica
}

func (a *agent) GetNode(context.Context, *pb.GetNodeRequest) (*pb.Node, error) { return a.node, nil }

func (a *agent) ListVolumes(context.Context, *pb.ListVolumesRequest) (*pb.ListVolumesResponse, error) {
	return &pb.ListVolumesResponse{Volumes: a.volumes}, nil
}

func (a *agent) Status(context.Context, *pb.StatusRequest) (*pb.NodeStatus, error) {
	return &pb.NodeStatus{Replicas: a.replicas}, nil
}

// startAgents serves each agent in memory and returns a cluster of them.
func startAgents(t *testing.T, agents []*agent) *cluster.Cluster {
	t.Helper()
	var served clustertest.Agents
	for _, a := range agents {
		served.Serve(t, a.node.GetNodeId()+":7670", a)
	}
	return served.Cluster(t)
}

func node(id, domain string, availableGiB uint64) *pb.Node {
	return &pb.Node{NodeId: id, AvailableBytes: availableGiB << 30, MaxQuotaBytes: 8 << 30,
		Topology: map[string]string{config.TopologyNodeKey: id, config.TopologyDomainKey: domain}}
}

func vol(id string, replicas int, interval string) *pb.Volume {
	return &pb.Volume{VolumeId: id, UsedBytes: 1 << 20, Parameters: map[string]string{
		vocab.ParamReplicas: fmt.Sprint(replicas), vocab.ParamReplicationInterval: interval}}
}

var now = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func replicaOf(id string, age time.Duration) *pb.Replica {
	return &pb.Replica{VolumeId: id, LastSnapshotUnix: now.Add(-age).Unix()}
}

func TestPlan(t *testing.T) {
	tests := []struct {
		name        string
		agents      []*agent
		wantPushes  []string // "volume source->target: reason"
		wantSettled []string
	}{
		{
			name: "a new replica goes to the node with most room in the source's domain",
			agents: []*agent{
				{node: node("n1", "a", 10), volumes: []*pb.Volume{vol("v", 1, "1m")}},
				{node: node("n2", "a", 5)},
				{node: node("n3", "a", 8)},
				{node: node("n4", "b", 50)},
			},
			wantPushes: []string{"v n1->n3: no replica yet"},
		},
		{
			name: "an existing replica is kept, and pushed to only when older than the interval",
			agents: []*agent{
				{node: node("n1", "a", 10), volumes: []*pb.Volume{vol("fresh", 1, "1m"), vol("stale", 1, "1m")}},
				{node: node("n2", "a", 1), replicas: []*pb.Replica{replicaOf("fresh", 30*time.Second), replicaOf("stale", 2*time.Minute)}},
				{node: node("n3", "a", 9)},
			},
			wantPushes: []string{"stale n1->n2: replica older than the interval"},
		},
		{
			name: "an interrupted transfer is resumed at once",
			agents: []*agent{
				{node: node("n1", "a", 10), volumes: []*pb.Volume{vol("v", 1, "1h")}},
				{node: node("n2", "a", 1), replicas: []*pb.Replica{{VolumeId: "v", LastSnapshotUnix: now.Unix(), Resumable: true}}},
			},
			wantPushes: []string{"v n1->n2: an interrupted transfer waits"},
		},
		{
			name: "two replicas asked for: the freshest existing one plus the roomiest other node",
			agents: []*agent{
				{node: node("n1", "a", 10), volumes: []*pb.Volume{vol("v", 2, "1m")}},
				{node: node("n2", "a", 1), replicas: []*pb.Replica{replicaOf("v", 10*time.Second)}},
				{node: node("n3", "a", 2)},
				{node: node("n4", "a", 3)},
			},
			wantPushes: []string{"v n1->n4: no replica yet"},
		},
		{
			name: "unhealthy nodes are neither asked nor given replicas",
			agents: []*agent{
				{node: node("n1", "a", 10), volumes: []*pb.Volume{vol("v", 1, "1m")}},
				{node: &pb.Node{NodeId: "n2", AvailableBytes: 100 << 30, UnhealthyReason: "pool faulted",
					Topology: map[string]string{config.TopologyDomainKey: "a"}}},
				{node: node("n3", "a", 1)},
			},
			wantPushes: []string{"v n1->n3: no replica yet"},
		},
		{
			name: "a volume without replicas, and one being moved, get no pushes",
			agents: []*agent{
				{node: node("n1", "a", 10), volumes: []*pb.Volume{vol("none", 0, ""), func() *pb.Volume {
					v := vol("moving", 1, "1m")
					v.MovingTo = "n2"
					return v
				}()}},
				{node: node("n2", "a", 5)},
			},
		},
		{
			name: "two primaries of a volume are settled once, and nothing is pushed for it",
			agents: []*agent{
				{node: node("n1", "a", 10), volumes: []*pb.Volume{vol("v", 1, "1m")}},
				{node: node("n2", "a", 10), volumes: []*pb.Volume{vol("v", 1, "1m")}},
				{node: node("n3", "a", 10)},
			},
			wantSettled: []string{"v"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New(startAgents(t, tt.agents), 1, hclog.NewNullLogger())
			s.now = func() time.Time { return now }
			var settled []string
			s.Settle = func(_ context.Context, id string) error {
				settled = append(settled, id)
				return nil
			}
			pushes, err := s.Plan(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range pushes {
				got = append(got, fmt.Sprintf("%s %s->%s: %s", p.VolumeID, p.Source.Info.NodeID, p.Target.Info.NodeID, p.Reason))
			}
			slices.Sort(got)
			if !slices.Equal(got, tt.wantPushes) {
				t.Errorf("pushes:\n got  %q\n want %q", got, tt.wantPushes)
			}
			if !slices.Equal(settled, tt.wantSettled) {
				t.Errorf("settled %q, want %q", settled, tt.wantSettled)
			}
		})
	}
}

// pushing is an agent whose pushes are answered by replicate.
type pushing struct {
	agent
	replicate func(req *pb.ReplicateRequest, stream pb.NodeAgent_ReplicateServer) error
}

func (a *pushing) Replicate(req *pb.ReplicateRequest, stream pb.NodeAgent_ReplicateServer) error {
	return a.replicate(req, stream)
}

// TestStalledPushBlocksNothing: a push that hangs is cancelled after the
// stall timeout, and meanwhile later rounds run and push other volumes.
func TestStalledPushBlocksNothing(t *testing.T) {
	stalled := make(chan struct{})
	var pushed sync.Map // volume ID -> pushes
	src := &pushing{agent: agent{node: node("n1", "a", 10), volumes: []*pb.Volume{vol("hung", 1, "1m"), vol("fine", 1, "1m")}}}
	src.replicate = func(req *pb.ReplicateRequest, stream pb.NodeAgent_ReplicateServer) error {
		n, _ := pushed.LoadOrStore(req.GetVolumeId(), new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		if req.GetVolumeId() == "hung" {
			_ = stream.Send(&pb.ReplicateProgress{Bytes: 1}) // then nothing more
			<-stream.Context().Done()
			close(stalled)
			return stream.Context().Err()
		}
		return stream.Send(&pb.ReplicateProgress{Bytes: 10, Done: true})
	}
	var served clustertest.Agents
	served.Serve(t, "n1:7670", src)
	served.Serve(t, "n2:7670", &agent{node: node("n2", "a", 10)})
	s := New(served.Cluster(t), 4, hclog.NewNullLogger())
	s.StallTimeout = 300 * time.Millisecond
	ctx := context.Background()

	if got := len(s.Round(ctx)); got != 2 {
		t.Fatalf("first round started %d pushes, want 2", got)
	}
	time.Sleep(100 * time.Millisecond) // "fine" is done, "hung" hangs
	second := make(chan []Push, 1)
	go func() { second <- s.Round(ctx) }()
	select {
	case started := <-second:
		if len(started) != 1 || started[0].VolumeID != "fine" {
			t.Errorf("second round started %v, want only the volume whose push is not running", started)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a round waited for the hung push")
	}
	select {
	case <-stalled:
	case <-time.After(5 * time.Second):
		t.Fatal("the hung push was never cancelled")
	}
	s.Wait()
	if n, _ := pushed.Load("fine"); n.(*atomic.Int32).Load() != 2 {
		t.Errorf("volume fine pushed %d times, want once per round", n.(*atomic.Int32).Load())
	}
}

// TestStalestReplicaIsPushedFirst: a round starts one push per volume, so
// a volume's pushes come stalest target first. In the other order, a
// replica that is due at every round (slow pushes, a short interval)
// starved the volume's other replica: it never got its first push.
func TestStalestReplicaIsPushedFirst(t *testing.T) {
	agents := []*agent{
		{node: node("n1", "a", 10), volumes: []*pb.Volume{vol("v", 2, "1m")}},
		{node: node("n2", "a", 1), replicas: []*pb.Replica{replicaOf("v", 2*time.Minute)}},
		{node: node("n3", "a", 2)},
	}
	s := New(startAgents(t, agents), 1, hclog.NewNullLogger())
	s.now = func() time.Time { return now }
	pushes, err := s.Plan(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range pushes {
		got = append(got, p.Target.Info.NodeID+": "+p.Reason)
	}
	want := []string{"n3: no replica yet", "n2: replica older than the interval"}
	if !slices.Equal(got, want) {
		t.Errorf("pushes in order %q, want %q", got, want)
	}
}

// listing counts the listings a node answers, and reports a volumes
// version.
type listing struct {
	pushing
	mu       sync.Mutex
	version  string
	listings int
	// tells: the node answers Changes from history, the versions it went
	// through and the volume each one changed.
	tells   bool
	history []change
	asked   int // Changes answered
}

type change struct{ version, volumeID string }

// Changes tells what changed since a version the node went through.
func (a *listing) Changes(ctx context.Context, req *pb.ChangesRequest) (*pb.ChangesResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.tells {
		return a.pushing.Changes(ctx, req) // unimplemented, as on an older node
	}
	a.asked++
	i := slices.IndexFunc(a.history, func(c change) bool { return c.version == req.GetSince() })
	if i < 0 {
		return &pb.ChangesResponse{}, nil
	}
	resp := &pb.ChangesResponse{Known: true}
	for _, c := range a.history[i+1:] {
		resp.VolumeIds = append(resp.VolumeIds, c.volumeID)
		for _, v := range a.volumes {
			if v.GetVolumeId() == c.volumeID {
				resp.Volumes = append(resp.Volumes, v)
			}
		}
	}
	return resp, nil
}

func (a *listing) GetNode(context.Context, *pb.GetNodeRequest) (*pb.Node, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := proto.Clone(a.node).(*pb.Node)
	n.VolumesVersion = a.version
	return n, nil
}

func (a *listing) ListVolumes(ctx context.Context, req *pb.ListVolumesRequest) (*pb.ListVolumesResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.listings++
	return a.agent.ListVolumes(ctx, req)
}

func (a *listing) Status(ctx context.Context, req *pb.StatusRequest) (*pb.NodeStatus, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.agent.Status(ctx, req)
}

// add gives the node a new primary, and a new volumes version.
func (a *listing) add(v *pb.Volume, version string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.volumes = append(a.volumes, v)
	if len(a.history) == 0 {
		a.history = []change{{version: a.version}}
	}
	a.history = append(a.history, change{version: version, volumeID: v.GetVolumeId()})
	a.version = version
}

// received records a replica of volume id received now.
func (a *listing) received(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.replicas = append(a.replicas, &pb.Replica{VolumeId: id, LastSnapshotUnix: time.Now().Unix()})
}

func (a *listing) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.listings
}

func (a *listing) setVersion(v string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.version = v
}

// TestRoundsBetweenChangesListNothing (issue 13): while no node's
// primaries change (their volumes versions stay), a round asks the nodes
// only who they are and pushes what the book says is due; a pushed
// replica is not due again within its interval; a changed version, or a
// push refused because the source lost the primary, makes the next
// round plan in full.
func TestRoundsBetweenChangesListNothing(t *testing.T) {
	var refuse atomic.Bool
	var pushes atomic.Int32
	replicate := func(req *pb.ReplicateRequest, stream pb.NodeAgent_ReplicateServer) error {
		pushes.Add(1)
		if refuse.Load() {
			return status.Error(codes.FailedPrecondition, "volume is a replica here")
		}
		return stream.Send(&pb.ReplicateProgress{Bytes: 10, Done: true})
	}
	volumes := []*pb.Volume{vol("a", 1, "1h"), vol("b", 1, "1h"), vol("c", 1, "1h")}
	n1 := &listing{pushing: pushing{agent: agent{node: node("n1", "a", 10), volumes: volumes}, replicate: replicate}, version: "1-0"}
	n2 := &listing{pushing: pushing{agent: agent{node: node("n2", "a", 10)}, replicate: replicate}, version: "1-0"}
	var served clustertest.Agents
	served.Serve(t, "n1:7670", n1)
	served.Serve(t, "n2:7670", n2)
	s := New(served.Cluster(t), 4, hclog.NewNullLogger())
	s.Resync = 24 * time.Hour
	ctx := context.Background()
	round := func() int {
		started := len(s.Round(ctx))
		s.Wait()
		return started
	}

	if got := round(); got != 3 || n1.count() != 1 {
		t.Fatalf("first round: %d pushes, %d listings of n1; want 3 and a full plan", got, n1.count())
	}
	for i := range 3 {
		if got := round(); got != 0 || n1.count() != 1 {
			t.Fatalf("round %d without changes: %d pushes, %d listings of n1; want none and no listing", i+2, got, n1.count())
		}
	}
	n1.setVersion("1-1") // a volume created, deleted, promoted or demoted
	if round(); n1.count() != 2 {
		t.Errorf("after n1's primaries changed: %d listings of n1, want a full plan", n1.count())
	}
	s.now = func() time.Time { return time.Now().Add(2 * time.Hour) } // all due again
	refuse.Store(true)
	if got := round(); got != 3 || n1.count() != 2 {
		t.Errorf("due again: %d pushes, %d listings; want 3 pushes from the book", got, n1.count())
	}
	if round(); n1.count() != 3 {
		t.Errorf("after pushes refused for a lost primary: %d listings of n1, want a full plan", n1.count())
	}
	refuse.Store(false)
	round() // pushes succeed: the book is current again
	listings := n1.count()
	if round(); n1.count() != listings {
		t.Fatalf("a round without changes listed n1")
	}
	served.Stop("n2:7670") // a node went
	if round(); n1.count() != listings+1 {
		t.Errorf("after a node went: %d listings of n1, want a full plan", n1.count()-listings)
	}
	s.now = func() time.Time { return time.Now().Add(50 * time.Hour) } // past Resync
	if round(); n1.count() != listings+2 {
		t.Errorf("past Resync: no full plan")
	}
}

// TestPlanAsksOnlyTheNodesThatChanged (issue 13): after one node's
// primaries change, the next plan asks that node what it holds and takes
// the other nodes' holdings from the book, with the pushes made since
// applied to them: a replica pushed to a node that is not asked again is
// neither placed anew nor pushed to before its interval.
func TestPlanAsksOnlyTheNodesThatChanged(t *testing.T) {
	tests := []struct {
		name         string
		tells        bool // the nodes answer Changes
		wantListings []int
		wantAsked    []int
	}{
		{name: "nodes that tell what changed", tells: true, wantListings: []int{1, 1, 1}, wantAsked: []int{0, 1, 0}},
		{name: "nodes that cannot tell", tells: false, wantListings: []int{1, 2, 1}, wantAsked: []int{0, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nodes := map[string]*listing{}
			replicate := func(req *pb.ReplicateRequest, stream pb.NodeAgent_ReplicateServer) error {
				nodes[strings.TrimPrefix(req.GetTargetAddress(), "passthrough:///")].received(req.GetVolumeId())
				return stream.Send(&pb.ReplicateProgress{Bytes: 10, Done: true})
			}
			var served clustertest.Agents
			for i, id := range []string{"n1", "n2", "n3"} {
				a := &listing{pushing: pushing{agent: agent{node: node(id, "a", 10)}, replicate: replicate}, version: "1-0", tells: tt.tells}
				if i < 2 {
					a.volumes = []*pb.Volume{vol("vol-of-"+id, 1, "1h")}
				}
				nodes[id+":7670"] = a
				served.Serve(t, id+":7670", a)
			}
			s := New(served.Cluster(t), 4, hclog.NewNullLogger())
			s.Resync = 24 * time.Hour
			ctx := context.Background()
			pushed := func() []string {
				var ids []string
				for _, p := range s.Round(ctx) {
					ids = append(ids, p.VolumeID)
				}
				s.Wait()
				slices.Sort(ids)
				return ids
			}
			each := func(f func(*listing) int) []int {
				return []int{f(nodes["n1:7670"]), f(nodes["n2:7670"]), f(nodes["n3:7670"])}
			}
			listings := func() []int { return each(func(a *listing) int { return a.count() }) }
			asked := func() []int {
				return each(func(a *listing) int { a.mu.Lock(); defer a.mu.Unlock(); return a.asked })
			}

			if got := pushed(); !slices.Equal(got, []string{"vol-of-n1", "vol-of-n2"}) || !slices.Equal(listings(), []int{1, 1, 1}) {
				t.Fatalf("first round: pushes of %v, listings %v; want both volumes and every node asked", got, listings())
			}
			nodes["n2:7670"].add(vol("new", 1, "1h"), "1-1")
			if got := pushed(); !slices.Equal(got, []string{"new"}) {
				t.Errorf("after a create on n2: pushes of %v, want only the new volume's", got)
			}
			if got := listings(); !slices.Equal(got, tt.wantListings) {
				t.Errorf("after a create on n2: listings %v, want %v", got, tt.wantListings)
			}
			if got := asked(); !slices.Equal(got, tt.wantAsked) {
				t.Errorf("after a create on n2: asked what changed %v, want %v", got, tt.wantAsked)
			}
			if got := pushed(); len(got) != 0 {
				t.Errorf("a round after: pushes of %v, want none", got)
			}
			// The replicas pushed in the first round are still known on
			// n2 after the changes were applied: nothing is due again.
			nodes["n2:7670"].add(vol("newer", 0, ""), "1-2")
			if got := pushed(); len(got) != 0 {
				t.Errorf("after a second create on n2 (no replicas asked): pushes of %v, want none", got)
			}
		})
	}
}

// TestFullPlanKeepsTheReplicaBeingMade: a first push's replica shows only
// once its receive completes. A full plan meanwhile, with another node
// now having most room, must count the push under way as the volume's
// replica: placing it anew made a second replica that nobody asked for,
// and a failover preferred it over the one a job was rescheduled to (the
// demo's failover then moved the volume and set the other replica aside).
func TestFullPlanKeepsTheReplicaBeingMade(t *testing.T) {
	agents := []*agent{
		{node: node("n1", "a", 10), volumes: []*pb.Volume{vol("v", 1, "1m")}},
		{node: node("n2", "a", 10)},
		{node: node("n3", "a", 1)},
	}
	tests := []struct {
		name     string
		pushing  string // the target of v's push under way, if any
		wantPush string
	}{
		{name: "no push under way: the node with most room", wantPush: "n2"},
		{name: "a first push to n3 under way", pushing: "n3", wantPush: "n3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New(startAgents(t, agents), 1, hclog.NewNullLogger())
			s.now = func() time.Time { return now }
			if tt.pushing != "" && !s.claim("v", tt.pushing) {
				t.Fatal("claim of an idle volume refused")
			}
			pushes, err := s.Plan(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range pushes {
				got = append(got, p.Target.Info.NodeID)
			}
			if !slices.Equal(got, []string{tt.wantPush}) {
				t.Errorf("pushes of v go to %q, want only %q", got, tt.wantPush)
			}
		})
	}
}
