package scheduler

import (
	"context"
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
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// agent describes a node for a test: who it is, its primaries and its
// replicas.
type agent struct {
	node     agentclient.NodeInfo
	volumes  []agentclient.Copy
	replicas []agentclient.Copy
}

// startAgents gives each node a fake agent (clustertest.FakeAgent)
// holding its copies, and returns a cluster of them and the agents by
// node ID.
func startAgents(t *testing.T, agents []*agent) (*cluster.Cluster, map[string]*clustertest.FakeAgent) {
	t.Helper()
	var fakes clustertest.Fakes
	byID := map[string]*clustertest.FakeAgent{}
	for _, a := range agents {
		f := fakes.Add(a.node)
		for _, c := range append(slices.Clone(a.volumes), a.replicas...) {
			f.PutCopy(c)
		}
		byID[a.node.NodeID] = f
	}
	return fakes.Cluster(t), byID
}

func node(id, domain string, availableGiB uint64) agentclient.NodeInfo {
	return agentclient.NodeInfo{NodeID: id, AvailableBytes: availableGiB << 30, MaxQuotaBytes: 8 << 30,
		Topology: map[string]string{config.TopologyNodeKey: id, config.TopologyDomainKey: domain}}
}

// vol is the primary of volume id asking for replicas, pushed every
// interval.
func vol(id string, replicas int, interval string) agentclient.Copy {
	return agentclient.Copy{VolumeID: id, Name: id, Role: contract.RolePrimary, Generation: 1, CapacityBytes: 1 << 30,
		Parameters: map[string]string{contract.ParamReplicas: fmt.Sprint(replicas), contract.ParamReplicationInterval: interval}}
}

var now = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// replicaOf is a replica of volume id whose newest snapshot is age old.
func replicaOf(id string, age time.Duration) agentclient.Copy {
	return agentclient.Copy{VolumeID: id, Name: id, Role: contract.RoleReplica, Generation: 1, LastSnapshotUnixNano: now.Add(-age).UnixNano()}
}

// count returns how many calls of method the agent answered.
func count(a *clustertest.FakeAgent, method string) int {
	n := 0
	for _, c := range a.Calls() {
		if c == method || strings.HasPrefix(c, method+" ") {
			n++
		}
	}
	return n
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
				{node: node("n1", "a", 10), volumes: []agentclient.Copy{vol("v", 1, "1m")}},
				{node: node("n2", "a", 5)},
				{node: node("n3", "a", 8)},
				{node: node("n4", "b", 50)},
			},
			wantPushes: []string{"v n1->n3: no replica yet"},
		},
		{
			name: "an existing replica is kept, and pushed to only when older than the interval",
			agents: []*agent{
				{node: node("n1", "a", 10), volumes: []agentclient.Copy{vol("fresh", 1, "1m"), vol("stale", 1, "1m")}},
				{node: node("n2", "a", 1), replicas: []agentclient.Copy{replicaOf("fresh", 30*time.Second), replicaOf("stale", 2*time.Minute)}},
				{node: node("n3", "a", 9)},
			},
			wantPushes: []string{"stale n1->n2: replica older than the interval"},
		},
		{
			name: "an interrupted transfer is resumed at once",
			agents: []*agent{
				{node: node("n1", "a", 10), volumes: []agentclient.Copy{vol("v", 1, "1h")}},
				{node: node("n2", "a", 1), replicas: []agentclient.Copy{func() agentclient.Copy {
					r := replicaOf("v", 0)
					r.Resumable = true
					return r
				}()}},
			},
			wantPushes: []string{"v n1->n2: an interrupted transfer waits"},
		},
		{
			name: "two replicas asked for: the freshest existing one plus the roomiest other node",
			agents: []*agent{
				{node: node("n1", "a", 10), volumes: []agentclient.Copy{vol("v", 2, "1m")}},
				{node: node("n2", "a", 1), replicas: []agentclient.Copy{replicaOf("v", 10*time.Second)}},
				{node: node("n3", "a", 2)},
				{node: node("n4", "a", 3)},
			},
			wantPushes: []string{"v n1->n4: no replica yet"},
		},
		{
			name: "unhealthy nodes are neither asked nor given replicas",
			agents: []*agent{
				{node: node("n1", "a", 10), volumes: []agentclient.Copy{vol("v", 1, "1m")}},
				{node: agentclient.NodeInfo{NodeID: "n2", AvailableBytes: 100 << 30, UnhealthyReason: "pool faulted",
					Topology: map[string]string{config.TopologyDomainKey: "a"}}},
				{node: node("n3", "a", 1)},
			},
			wantPushes: []string{"v n1->n3: no replica yet"},
		},
		{
			name: "a volume without replicas, and one being moved, get no pushes",
			agents: []*agent{
				{node: node("n1", "a", 10), volumes: []agentclient.Copy{vol("none", 0, ""), func() agentclient.Copy {
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
				{node: node("n1", "a", 10), volumes: []agentclient.Copy{vol("v", 1, "1m")}},
				{node: node("n2", "a", 10), volumes: []agentclient.Copy{vol("v", 1, "1m")}},
				{node: node("n3", "a", 10)},
			},
			wantSettled: []string{"v"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cl, _ := startAgents(t, tt.agents)
			s := New(cl, 1, hclog.NewNullLogger())
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

// TestStalledPushBlocksNothing: a push that hangs is cancelled after the
// stall timeout, and meanwhile later rounds run and push other volumes.
func TestStalledPushBlocksNothing(t *testing.T) {
	stalled := make(chan struct{})
	cl, agents := startAgents(t, []*agent{
		{node: node("n1", "a", 10), volumes: []agentclient.Copy{vol("hung", 1, "1m"), vol("fine", 1, "1m")}},
		{node: node("n2", "a", 10)},
	})
	agents["n1"].BeforePush = func(ctx context.Context, id string, each func(agentclient.Progress)) error {
		if id != "hung" {
			return nil
		}
		each(agentclient.Progress{Bytes: 1}) // then nothing more
		<-ctx.Done()
		close(stalled)
		return ctx.Err()
	}
	s := New(cl, 4, hclog.NewNullLogger())
	s.StallTimeout = 300 * time.Millisecond
	var ahead atomic.Int64 // how far the schedule's clock is ahead of the wall clock
	s.now = func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
	ctx := context.Background()

	if got := len(s.Round(ctx)); got != 2 {
		t.Fatalf("first round started %d pushes, want 2", got)
	}
	// "fine" is done (however slow the machine), "hung" hangs.
	for deadline := time.Now().Add(5 * time.Second); s.pushingTo("fine") != ""; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the push of \"fine\" did not end")
		}
	}
	ahead.Store(int64(2 * time.Minute)) // "fine" is due again
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
	pushes := 0
	for _, c := range agents["n1"].Calls() {
		if c == "Replicate fine" {
			pushes++
		}
	}
	if pushes != 2 {
		t.Errorf("volume fine pushed %d times, want once per round", pushes)
	}
}

// TestStalestReplicaIsPushedFirst: a round starts one push per volume, so
// a volume's pushes come stalest target first. In the other order, a
// replica that is due at every round (slow pushes, a short interval)
// starved the volume's other replica: it never got its first push.
func TestStalestReplicaIsPushedFirst(t *testing.T) {
	agents := []*agent{
		{node: node("n1", "a", 10), volumes: []agentclient.Copy{vol("v", 2, "1m")}},
		{node: node("n2", "a", 1), replicas: []agentclient.Copy{replicaOf("v", 2*time.Minute)}},
		{node: node("n3", "a", 2)},
	}
	cl, _ := startAgents(t, agents)
	s := New(cl, 1, hclog.NewNullLogger())
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

// TestRoundsBetweenChangesListNothing: while no node's primaries change
// (their volumes versions stay), a round asks the nodes only who they are
// and pushes what the book says is due; a pushed replica is not due again
// within its interval; a changed version, or a push refused because the
// source lost the primary, makes the next round plan in full. The nodes
// cannot tell what changed (as nodes older than Changes):
// TestPlanAsksOnlyTheNodesThatChanged covers those that can.
func TestRoundsBetweenChangesListNothing(t *testing.T) {
	cl, agents := startAgents(t, []*agent{
		{node: node("n1", "a", 10), volumes: []agentclient.Copy{vol("a", 1, "1h"), vol("b", 1, "1h"), vol("c", 1, "1h")}},
		{node: node("n2", "a", 10)},
	})
	n1, n2 := agents["n1"], agents["n2"]
	n1.SetTellsChanges(false)
	n2.SetTellsChanges(false)
	listings := func() int { return count(n1, "ListVolumes") }
	s := New(cl, 4, hclog.NewNullLogger())
	s.Resync = 24 * time.Hour
	ctx := context.Background()
	round := func() int {
		started := len(s.Round(ctx))
		s.Wait()
		return started
	}

	if got := round(); got != 3 || listings() != 1 {
		t.Fatalf("first round: %d pushes, %d listings of n1; want 3 and a full plan", got, listings())
	}
	for i := range 3 {
		if got := round(); got != 0 || listings() != 1 {
			t.Fatalf("round %d without changes on n1: %d pushes, %d listings of n1; want none and no listing", i+2, got, listings())
		}
	}
	n1.PutCopy(vol("d", 0, "")) // a volume created on n1
	if round(); listings() != 2 {
		t.Errorf("after n1's primaries changed: %d listings of n1, want a full plan", listings())
	}
	s.now = func() time.Time { return time.Now().Add(2 * time.Hour) } // all due again
	n1.Refuse("Replicate", errdefs.Wrap(errdefs.ErrFailedPrecondition, "volume is a replica here"))
	if got := round(); got != 3 || listings() != 2 {
		t.Errorf("due again: %d pushes, %d listings; want 3 pushes from the book", got, listings())
	}
	if round(); listings() != 3 {
		t.Errorf("after pushes refused for a lost primary: %d listings of n1, want a full plan", listings())
	}
	n1.Refuse("Replicate", nil)
	round() // pushes succeed: the book is current again
	round() // n2 received them: its version moved
	before := listings()
	if round(); listings() != before {
		t.Fatalf("a round without changes listed n1")
	}
	n2.SetDown(true) // a node went
	if round(); listings() != before+1 {
		t.Errorf("after a node went: %d listings of n1, want a full plan", listings()-before)
	}
	s.now = func() time.Time { return time.Now().Add(50 * time.Hour) } // past Resync
	if round(); listings() != before+2 {
		t.Errorf("past Resync: no full plan")
	}
}

// TestAnIncompleteRoundKeepsNoBook: a round that could not learn what
// every healthy node holds (a node's listing failed), or that found two
// primaries of a volume (Settle retires the older; the volume waits),
// keeps no book: the next round asks every node in full, not only those
// that changed.
func TestAnIncompleteRoundKeepsNoBook(t *testing.T) {
	tests := []struct {
		name        string
		change      func(n2 *clustertest.FakeAgent) // n2 changes, and the round after sees it this way
		wantSettled []string
	}{
		{"a node's listing failed", func(n2 *clustertest.FakeAgent) {
			n2.PutCopy(vol("new", 0, ""))
			n2.RefuseTimes("ListVolumes", 1, errdefs.Wrap(errdefs.ErrUnavailable, "agent busy"))
		}, nil},
		{"two primaries of a volume", func(n2 *clustertest.FakeAgent) {
			n2.PutCopy(vol("a", 1, "1h")) // a lost primary back after a failover
		}, []string{"a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cl, agents := startAgents(t, []*agent{
				{node: node("n1", "a", 10), volumes: []agentclient.Copy{vol("a", 1, "1h")}},
				{node: node("n2", "a", 10)},
			})
			n1, n2 := agents["n1"], agents["n2"]
			n1.SetTellsChanges(false)
			n2.SetTellsChanges(false)
			listings := func() int { return count(n1, "ListVolumes") }
			s := New(cl, 4, hclog.NewNullLogger())
			s.Resync = 24 * time.Hour
			var settled []string
			s.Settle = func(_ context.Context, id string) error {
				settled = append(settled, id)
				n2.PutCopy(replicaOf(id, time.Minute)) // the older demoted
				return nil
			}
			ctx := context.Background()
			round := func() {
				s.Round(ctx)
				s.Wait()
			}
			round()
			round() // n2 received the first round's push: its version moved
			before := listings()
			if round(); listings() != before {
				t.Fatalf("a round without changes listed n1: the book is not kept")
			}
			tt.change(n2)
			if round(); listings() != before {
				t.Fatalf("the round that found n2 changed listed n1, which did not change")
			}
			if _, _, ok := s.Held("n1"); ok {
				t.Errorf("the book is kept after that round")
			}
			if round(); listings() != before+1 {
				t.Errorf("the round after: %d listings of n1, want a full plan", listings()-before)
			}
			if !slices.Equal(settled, tt.wantSettled) {
				t.Errorf("settled %v, want %v", settled, tt.wantSettled)
			}
		})
	}
}

// TestPlanAsksOnlyTheNodesThatChanged: after one node's primaries change,
// the next plan asks that node what it holds and takes the other nodes'
// holdings from the book, with the pushes made since applied to them: a
// replica pushed to a node that is not asked again is neither placed anew
// nor pushed to before its interval.
func TestPlanAsksOnlyTheNodesThatChanged(t *testing.T) {
	tests := []struct {
		name         string
		tells        bool  // the nodes answer Changes
		wantListings []int // ListVolumes calls of n1, n2, n3 in the round after the create
		wantAsked    []int // Changes calls, answered or not
	}{
		{name: "nodes that tell what changed", tells: true, wantListings: []int{0, 0, 0}, wantAsked: []int{0, 1, 0}},
		{name: "nodes that cannot tell", tells: false, wantListings: []int{0, 1, 0}, wantAsked: []int{0, 1, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cl, agents := startAgents(t, []*agent{
				{node: node("n1", "a", 10), volumes: []agentclient.Copy{vol("vol-of-n1", 1, "1h")}},
				{node: node("n2", "a", 10), volumes: []agentclient.Copy{vol("vol-of-n2", 1, "1h")}},
				{node: node("n3", "a", 10)},
			})
			for _, a := range agents {
				a.SetTellsChanges(tt.tells)
			}
			s := New(cl, 4, hclog.NewNullLogger())
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
			each := func(method string) []int {
				return []int{count(agents["n1"], method), count(agents["n2"], method), count(agents["n3"], method)}
			}
			since := func(before, after []int) []int {
				out := make([]int, len(after))
				for i := range after {
					out[i] = after[i] - before[i]
				}
				return out
			}

			if got := pushed(); !slices.Equal(got, []string{"vol-of-n1", "vol-of-n2"}) || !slices.Equal(each("ListVolumes"), []int{1, 1, 1}) {
				t.Fatalf("first round: pushes of %v, listings %v; want both volumes and every node asked", got, each("ListVolumes"))
			}
			if got := pushed(); len(got) != 0 { // the targets' versions moved with the replicas they received
				t.Fatalf("a round after the first: pushes of %v, want none", got)
			}
			listings, asked := each("ListVolumes"), each("Changes")
			agents["n2"].PutCopy(vol("new", 1, "1h"))
			if got := pushed(); !slices.Equal(got, []string{"new"}) {
				t.Errorf("after a create on n2: pushes of %v, want only the new volume's", got)
			}
			if got := since(listings, each("ListVolumes")); !slices.Equal(got, tt.wantListings) {
				t.Errorf("after a create on n2: listings %v, want %v", got, tt.wantListings)
			}
			if got := since(asked, each("Changes")); !slices.Equal(got, tt.wantAsked) {
				t.Errorf("after a create on n2: asked what changed %v, want %v", got, tt.wantAsked)
			}
			if got := pushed(); len(got) != 0 {
				t.Errorf("a round after: pushes of %v, want none", got)
			}
			// The replicas pushed in the first round are still known on
			// n2 after the changes were applied: nothing is due again.
			agents["n2"].PutCopy(vol("newer", 0, ""))
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
		{node: node("n1", "a", 10), volumes: []agentclient.Copy{vol("v", 1, "1m")}},
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
			cl, _ := startAgents(t, agents)
			s := New(cl, 1, hclog.NewNullLogger())
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

// TestSurplusCopies: after a move the demoted source is one replica more
// than the volume asks for; a full plan removes it once it was demoted
// SurplusGrace ago and as many kept replicas as the volume wants are as
// fresh as it, and never otherwise: not a replica of the schedule's own,
// not one fresher than the kept ones, not while a move runs, not the
// volume's only replica when it wants one.
func TestSurplusCopies(t *testing.T) {
	demoted := func(age time.Duration) agentclient.Copy { return replicaOf("v", age) }
	resumable := func(c agentclient.Copy) agentclient.Copy {
		c.Resumable = true
		return c
	}
	moving := vol("v", 1, "1h")
	moving.MovingTo = "n3"
	tests := []struct {
		name       string
		primary    agentclient.Copy
		onN2       agentclient.Copy // marked demoted demotedAgo ago, unless demotedAgo is 0
		onN3       *agentclient.Copy
		demotedAgo time.Duration
		removed    bool
		// snapshotOn: the nodes holding a copy of a CSI snapshot of v;
		// refused: the schedule asks, the node keeps its copy for it.
		snapshotOn []string
		refused    bool
	}{
		{"the other replica is as fresh: the demoted copy goes", vol("v", 1, "1h"), demoted(5 * time.Minute), ptr(replicaOf("v", time.Minute)), time.Hour, true, nil, false},
		{"the volume wants no replica: the demoted copy goes", vol("v", 0, "1h"), demoted(5 * time.Minute), nil, time.Hour, true, nil, false},
		{"the other replica is staler: kept until it is as fresh", vol("v", 1, "1h"), demoted(time.Minute), ptr(replicaOf("v", 5*time.Minute)), time.Hour, false, nil, false},
		{"no other replica: the demoted copy is the replica", vol("v", 1, "1h"), demoted(time.Minute), nil, time.Hour, false, nil, false},
		{"demoted within the grace", vol("v", 0, "1h"), demoted(time.Minute), nil, time.Minute, false, nil, false},
		{"not demoted: the schedule's own surplus replica stays", vol("v", 1, "1h"), replicaOf("v", 5*time.Minute), ptr(replicaOf("v", time.Minute)), 0, false, nil, false},
		{"the other replica's receive waits to resume", vol("v", 1, "1h"), demoted(5 * time.Minute), ptr(resumable(replicaOf("v", time.Minute))), time.Hour, false, nil, false},
		{"its own receive waits to resume", vol("v", 1, "1h"), resumable(demoted(5 * time.Minute)), ptr(replicaOf("v", time.Minute)), time.Hour, false, nil, false},
		{"the volume is moving", moving, demoted(5 * time.Minute), ptr(replicaOf("v", time.Minute)), time.Hour, false, nil, false},
		{"two wanted: both replicas are kept", vol("v", 2, "1h"), demoted(5 * time.Minute), ptr(replicaOf("v", time.Minute)), time.Hour, false, nil, false},
		{"a CSI snapshot every copy holds: the demoted copy goes", vol("v", 1, "1h"), demoted(5 * time.Minute), ptr(replicaOf("v", time.Minute)), time.Hour, true,
			[]string{"n1", "n2", "n3"}, false},
		{"a CSI snapshot the kept replica lacks: the node keeps the demoted copy", vol("v", 1, "1h"), demoted(5 * time.Minute), ptr(replicaOf("v", time.Minute)), time.Hour, false,
			[]string{"n1", "n2"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.onN2.LastSnapshot = "zn-on-n2"
			n3 := &agent{node: node("n3", "a", 5)}
			if tt.onN3 != nil {
				n3.replicas = []agentclient.Copy{*tt.onN3}
			}
			cl, agents := startAgents(t, []*agent{
				{node: node("n1", "a", 10), volumes: []agentclient.Copy{tt.primary}},
				{node: node("n2", "a", 5), replicas: []agentclient.Copy{tt.onN2}},
				n3,
			})
			if tt.demotedAgo > 0 {
				agents["n2"].MarkDemoted("v", now.Add(-tt.demotedAgo))
			}
			for _, n := range tt.snapshotOn {
				agents[n].PutSnapshot(agentclient.Snapshot{SnapshotID: "snap-s", SourceVolumeID: "v"})
			}
			s := New(cl, 2, hclog.NewNullLogger())
			s.now = func() time.Time { return now }
			ctx := context.Background()
			s.Round(ctx)
			s.Wait()
			c, err := agents["n2"].GetCopy(ctx, "v")
			if err != nil {
				t.Fatal(err)
			}
			if removed := !c.Exists; removed != tt.removed {
				t.Errorf("n2's copy removed: %v, want %v (calls: %q)", removed, tt.removed, agents["n2"].Calls())
			}
			// The schedule judges for itself; the node's own refusal is
			// for what changed since.
			if asked := count(agents["n2"], "DeleteSurplus") > 0; asked != (tt.removed || tt.refused) {
				t.Errorf("n2 asked to remove its copy: %v, want %v", asked, tt.removed || tt.refused)
			}
			if c3, _ := agents["n3"].GetCopy(ctx, "v"); tt.onN3 != nil && !c3.Exists {
				t.Error("n3's replica was removed")
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestTheKeptReplicaCatchesUpNotTheDemotedCopy: after a move the schedule
// updates the volume's other replica, not the demoted copy (fresher at
// first), so the other becomes as fresh and the demoted copy goes;
// pushing to the demoted copy instead would keep both for good.
func TestTheKeptReplicaCatchesUpNotTheDemotedCopy(t *testing.T) {
	onN2 := replicaOf("v", time.Minute)
	onN2.LastSnapshot = "zn-final"
	cl, agents := startAgents(t, []*agent{
		{node: node("n1", "a", 10), volumes: []agentclient.Copy{vol("v", 1, "1h")}},
		{node: node("n2", "a", 5), replicas: []agentclient.Copy{onN2}},
		{node: node("n3", "a", 5), replicas: []agentclient.Copy{replicaOf("v", 2*time.Hour)}},
	})
	agents["n2"].MarkDemoted("v", now.Add(-time.Hour))
	s := New(cl, 2, hclog.NewNullLogger())
	s.now = func() time.Time { return now }
	ctx := context.Background()
	pushes := s.Round(ctx)
	s.Wait()
	if len(pushes) != 1 || pushes[0].Target.Info.NodeID != "n3" {
		t.Fatalf("first round pushed %v; want v to n3, the replica older than its interval", pushes)
	}
	if c, _ := agents["n2"].GetCopy(ctx, "v"); !c.Exists {
		t.Fatal("the demoted copy went before the other replica was as fresh")
	}
	s.Round(ctx)
	s.Wait()
	if c, _ := agents["n2"].GetCopy(ctx, "v"); c.Exists {
		t.Errorf("the demoted copy is still there after n3 caught up (calls: %q)", agents["n2"].Calls())
	}
}
