package provision

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster/clustertest"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/migration"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// world is three fake nodes, n1 to n3, in memory; n2 has the most free
// space, then n1, then n3. Each node's topology names it.
type world struct {
	fakes clustertest.Fakes
	nodes map[string]*clustertest.FakeAgent
}

func newWorld() *world {
	w := &world{nodes: map[string]*clustertest.FakeAgent{}}
	for id, free := range map[string]uint64{"n1": 20 << 30, "n2": 30 << 30, "n3": 10 << 30} {
		w.nodes[id] = w.fakes.Add(agentclient.NodeInfo{NodeID: id, AvailableBytes: free,
			Topology: map[string]string{config.TopologyNodeKey: id}})
	}
	return w
}

// provisioner is the logic over the world's nodes, plus peers at the
// extra addresses, which nobody answers.
func (w *world) provisioner(t *testing.T, extra ...string) *Provisioner {
	c := w.fakes.Cluster(t, extra...)
	return New(c, migration.New(c, hclog.NewNullLogger()), "most-free", hclog.NewNullLogger())
}

// snapshotted returns a world whose volume v, on n1, has CSI snapshot s,
// and its provisioner.
func snapshotted(t *testing.T) (w *world, p *Provisioner, vol string, snap agentclient.Snapshot) {
	t.Helper()
	w = newWorld()
	vol = w.nodes["n1"].PutPrimary("v", 1)
	p = w.provisioner(t)
	snap, err := p.CreateSnapshot(context.Background(), "s", vol)
	if err != nil {
		t.Fatal(err)
	}
	return w, p, vol, snap
}

// holders returns the nodes holding a copy of volume id, as "node:role:generation".
func (w *world) holders(id string) []string {
	var out []string
	for node, f := range w.nodes {
		if c, ok := f.Copy(id); ok {
			out = append(out, node+":"+c.Role+":"+strconv.FormatUint(c.Generation, 10))
		}
	}
	slices.Sort(out)
	return out
}

// put gives the nodes copies of volume name, each "node:role:generation"
// as holders lists them.
func (w *world) put(t *testing.T, name string, copies ...string) {
	t.Helper()
	for _, c := range copies {
		f := strings.Split(c, ":")
		gen, err := strconv.ParseUint(f[len(f)-1], 10, 64)
		if len(f) != 3 || err != nil {
			t.Fatalf("copy %q is not node:role:generation", c)
		}
		switch node, role := w.nodes[f[0]], f[1]; role {
		case "primary":
			node.PutPrimary(name, gen)
		case "replica":
			node.PutReplica(name, gen)
		default:
			t.Fatalf("copy %q: no role %s", c, role)
		}
	}
}

// promiseOnMajority records on n1 and n2 (a majority of three) that an
// earlier create of volume name reserved generation 1 for holder.
func (w *world) promiseOnMajority(name, holder string) {
	for _, n := range []string{"n1", "n2"} {
		w.nodes[n].Promise(contract.VolumeIDForName(name), 1, holder)
	}
}

func TestCreate(t *testing.T) {
	snapshotOnN3 := func(w *world) {
		w.nodes["n3"].PutPrimary("src", 1)
		if _, err := w.nodes["n3"].CreateSnapshot(context.Background(), contract.VolumeIDForName("src"), "snap", 0); err != nil {
			t.Fatal(err)
		}
	}
	// snapshotOnN3AndN1: n1 holds a replica of the snapshot's volume, and
	// replication gave it a copy.
	snapshotOnN3AndN1 := func(w *world) {
		snapshotOnN3(w)
		s, _ := w.nodes["n3"].ListSnapshots(context.Background(), agentclient.SnapshotQuery{})
		w.nodes["n1"].PutSnapshot(s[0])
	}
	tests := []struct {
		name    string
		setup   func(w *world)
		req     CreateRequest
		down    []string // nodes that answer nothing
		want    string   // the node the volume is on
		wantErr error
	}{
		{
			name: "a new volume goes to the node with the most free space",
			req:  CreateRequest{VolumeRequest: contract.VolumeRequest{Name: "v", RequiredBytes: 1 << 30}},
			want: "n2",
		},
		{
			name: "a topology requirement wins over free space",
			req:  CreateRequest{VolumeRequest: contract.VolumeRequest{Name: "v"}, Requisite: []map[string]string{{config.TopologyNodeKey: "n3"}}},
			want: "n3",
		},
		{
			name:  "an existing volume is answered from its node, wherever placement would put a new one",
			setup: func(w *world) { w.nodes["n3"].PutPrimary("v", 4) },
			req:   CreateRequest{VolumeRequest: contract.VolumeRequest{Name: "v"}},
			want:  "n3",
		},
		{
			name:  "a retry after a lost answer creates on the node an earlier attempt was promised",
			setup: func(w *world) { w.promiseOnMajority("v", "n3") },
			req:   CreateRequest{VolumeRequest: contract.VolumeRequest{Name: "v"}},
			want:  "n3",
		},
		{
			name:    "a retry whose promised node is down waits for it",
			setup:   func(w *world) { w.promiseOnMajority("v", "n3") },
			down:    []string{"n3"},
			req:     CreateRequest{VolumeRequest: contract.VolumeRequest{Name: "v"}},
			wantErr: errdefs.ErrUnavailable,
		},
		{
			name:    "no node matches the topology",
			req:     CreateRequest{VolumeRequest: contract.VolumeRequest{Name: "v"}, Requisite: []map[string]string{{config.TopologyNodeKey: "n9"}}},
			wantErr: errdefs.ErrResourceExhausted,
		},
		{
			name:    "no node that answered matches, and one did not answer: a retry may find it",
			down:    []string{"n3"},
			req:     CreateRequest{VolumeRequest: contract.VolumeRequest{Name: "v", Parameters: map[string]string{contract.ParamNode: "n3"}}},
			wantErr: errdefs.ErrUnavailable,
		},
		{
			name:    "the size is above every node's ceiling",
			req:     CreateRequest{VolumeRequest: contract.VolumeRequest{Name: "v", RequiredBytes: 40 << 30}},
			wantErr: errdefs.ErrOutOfRange,
		},
		{
			name: "the best candidate cannot say what it holds: the next one gets the volume",
			setup: func(w *world) {
				w.nodes["n2"].Refuse("GetCopy", errdefs.Wrap(errdefs.ErrUnavailable, "pool busy"))
			},
			req:  CreateRequest{VolumeRequest: contract.VolumeRequest{Name: "v"}},
			want: "n1",
		},
		{
			name:    "without a majority nothing is created",
			down:    []string{"n1", "n2"},
			req:     CreateRequest{VolumeRequest: contract.VolumeRequest{Name: "v"}},
			wantErr: errdefs.ErrUnavailable,
		},
		{
			name:  "a clone of a snapshot is made on the snapshot's node",
			setup: snapshotOnN3,
			req:   CreateRequest{VolumeRequest: contract.VolumeRequest{Name: "v", SourceSnapshotID: contract.SnapshotIDForName("snap")}},
			want:  "n3",
		},
		{
			name:  "a clone of a snapshot held by two nodes goes where placement prefers (most free)",
			setup: snapshotOnN3AndN1,
			req:   CreateRequest{VolumeRequest: contract.VolumeRequest{Name: "v", SourceSnapshotID: contract.SnapshotIDForName("snap")}},
			want:  "n1",
		},
		{
			name:  "a clone pinned to a node holding a copy of its snapshot",
			setup: snapshotOnN3AndN1,
			req:   CreateRequest{VolumeRequest: contract.VolumeRequest{Name: "v", SourceSnapshotID: contract.SnapshotIDForName("snap"), Parameters: map[string]string{contract.ParamNode: "n3"}}},
			want:  "n3",
		},
		{
			name:    "a clone pinned to another node than its source's is refused",
			setup:   snapshotOnN3,
			req:     CreateRequest{VolumeRequest: contract.VolumeRequest{Name: "v", SourceSnapshotID: contract.SnapshotIDForName("snap"), Parameters: map[string]string{contract.ParamNode: "n1"}}},
			wantErr: errdefs.ErrInvalidArgument,
		},
		{
			name:    "a clone of a snapshot no node holds",
			req:     CreateRequest{VolumeRequest: contract.VolumeRequest{Name: "v", SourceSnapshotID: contract.SnapshotIDForName("nowhere")}},
			wantErr: errdefs.ErrNotFound,
		},
		{
			name: "the chosen node's refusal is the answer",
			setup: func(w *world) {
				w.nodes["n2"].Refuse("CreateVolume", errdefs.Wrap(errdefs.ErrInvalidArgument, `parameter "mountpoint" is not allowed`))
			},
			req:     CreateRequest{VolumeRequest: contract.VolumeRequest{Name: "v"}},
			wantErr: errdefs.ErrInvalidArgument,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld()
			if tc.setup != nil {
				tc.setup(w)
			}
			for _, n := range tc.down {
				w.nodes[n].SetDown(true)
			}
			v, node, err := w.provisioner(t).Create(context.Background(), tc.req)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("got %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			id := contract.VolumeIDForName(tc.req.Name)
			if node.Info.NodeID != tc.want || v.VolumeID != id {
				t.Fatalf("volume %s on %s, want %s on %s", v.VolumeID, node.Info.NodeID, id, tc.want)
			}
			if got := w.holders(id); len(got) != 1 {
				t.Fatalf("copies after the create: %v, want one", got)
			}
		})
	}
}

// TestCreateTwiceMakesOneVolume: a repeated create (the CO's retry)
// answers the first one's volume and reserves nothing again.
func TestCreateTwiceMakesOneVolume(t *testing.T) {
	w := newWorld()
	p := w.provisioner(t)
	ctx := context.Background()
	first, _, err := p.Create(ctx, CreateRequest{VolumeRequest: contract.VolumeRequest{Name: "v"}})
	if err != nil {
		t.Fatal(err)
	}
	// The retry asks for another node's topology: the volume stays where
	// it is all the same.
	reserves := countCalls(w, "Reserve")
	again, node, err := p.Create(ctx, CreateRequest{VolumeRequest: contract.VolumeRequest{Name: "v"}, Requisite: []map[string]string{{config.TopologyNodeKey: "n1"}}})
	if err != nil || again.VolumeID != first.VolumeID || node.Info.NodeID != "n2" {
		t.Fatalf("repeated create: %+v on %s, %v; want %s on n2", again, node.Info.NodeID, err, first.VolumeID)
	}
	if got := countCalls(w, "Reserve"); got != reserves {
		t.Errorf("a repeated create reserved again (%d Reserve calls, were %d)", got, reserves)
	}
	if got := w.holders(first.VolumeID); !slices.Equal(got, []string{"n2:primary:1"}) {
		t.Errorf("copies: %v, want n2's primary only", got)
	}
}

// TestASlowCreateIsWaitedFor: a node's create writes transaction groups
// and may take longer than one agent timeout (2 s for the fakes) on a
// busy pool; the controller waits for it (cluster.CallCreate). One that
// outlasts even that answers DeadlineExceeded naming the node and
// telling the CO to retry, which then finds the volume.
func TestASlowCreateIsWaitedFor(t *testing.T) {
	w := newWorld()
	p := w.provisioner(t)
	ctx := context.Background()
	slowest := 2500 * time.Millisecond // more than one agent timeout
	w.nodes["n2"].BeforeCreate = func(ctx context.Context) error {
		select {
		case <-time.After(slowest):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if _, node, err := p.Create(ctx, CreateRequest{VolumeRequest: contract.VolumeRequest{Name: "slow"}}); err != nil || node.Info.NodeID != "n2" {
		t.Fatalf("a create that takes %s on its node: on %s, %v; want it created on n2", slowest, node.Info.NodeID, err)
	}

	// As the agent client answers a call whose deadline passed.
	w.nodes["n2"].BeforeCreate = func(context.Context) error {
		return errdefs.FromStatus(status.Error(codes.DeadlineExceeded, context.DeadlineExceeded.Error()))
	}
	_, _, err := p.Create(ctx, CreateRequest{VolumeRequest: contract.VolumeRequest{Name: "slower"}})
	if errdefs.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), `creating volume "slower" on node n2 did not finish in time`) || !strings.Contains(err.Error(), "retry") {
		t.Fatalf("a create that outlasts its deadline: %v (%v); want DeadlineExceeded naming the node, telling to retry", err, errdefs.Code(err))
	}
	w.nodes["n2"].BeforeCreate = nil
	if _, node, err := p.Create(ctx, CreateRequest{VolumeRequest: contract.VolumeRequest{Name: "slower"}}); err != nil || node.Info.NodeID != "n2" {
		t.Fatalf("the retry: on %s, %v; want the volume on n2", node.Info.NodeID, err)
	}
}

// TestARetriedCloneIsTheFirstOne: a repeated create of a clone (the CO's
// retry after a lost answer) answers the clone the first call made. The
// retry used to reach the clone's node without its source, which the
// node refused as another volume of that name (AlreadyExists): found by
// the fault simulation's settled restore (S2, seed 108).
func TestARetriedCloneIsTheFirstOne(t *testing.T) {
	ctx := context.Background()
	for _, source := range []string{"snapshot", "volume"} {
		t.Run(source, func(t *testing.T) {
			w := newWorld()
			w.nodes["n3"].PutPrimary("src", 1)
			req := CreateRequest{VolumeRequest: contract.VolumeRequest{Name: "clone", SourceVolumeID: contract.VolumeIDForName("src")}}
			if source == "snapshot" {
				if _, err := w.nodes["n3"].CreateSnapshot(ctx, contract.VolumeIDForName("src"), "snap", 0); err != nil {
					t.Fatal(err)
				}
				req.SourceVolumeID, req.SourceSnapshotID = "", contract.SnapshotIDForName("snap")
			}
			p := w.provisioner(t)
			first, _, err := p.Create(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			again, node, err := p.Create(ctx, req)
			if err != nil || again.VolumeID != first.VolumeID || node.Info.NodeID != "n3" {
				t.Fatalf("repeated create of a clone: %+v on %s, %v; want %s on n3", again, node.Info.NodeID, err, first.VolumeID)
			}
			other := req
			other.SourceSnapshotID, other.SourceVolumeID = "", ""
			if _, _, err := p.Create(ctx, other); !errors.Is(err, errdefs.ErrAlreadyExists) {
				t.Errorf("the same name without the source: %v, want AlreadyExists", err)
			}
		})
	}
}

func countCalls(w *world, method string) int {
	n := 0
	for _, f := range w.nodes {
		for _, c := range f.Calls() {
			if c == method || strings.HasPrefix(c, method+" ") {
				n++
			}
		}
	}
	return n
}

func TestDelete(t *testing.T) {
	const name = "v"
	id := contract.VolumeIDForName(name)
	tests := []struct {
		name     string
		copies   []string // copies before the delete, "node:role:generation"
		setup    func(w *world)
		extra    []string // peers nobody answers
		wantErr  error
		wantLeft []string // copies left, "node:role:generation"
		aside    string   // the node that set a copy aside
	}{
		{
			name:   "the primary and every replica are deleted",
			copies: []string{"n1:primary:1", "n2:replica:1", "n3:replica:1"},
		},
		{
			name: "a volume no node holds is deleted already",
		},
		{
			name:   "a node that does not answer may hold a copy: nothing is deleted",
			copies: []string{"n1:primary:1", "n2:replica:1"},
			setup: func(w *world) {
				w.nodes["n3"].SetDown(true)
			},
			wantErr:  errdefs.ErrUnavailable,
			wantLeft: []string{"n1:primary:1", "n2:replica:1"},
		},
		{
			name:     "a peer that cannot be reached may hold a copy: nothing is deleted",
			copies:   []string{"n1:primary:1"},
			extra:    []string{"n4:7670"},
			wantErr:  errdefs.ErrUnavailable,
			wantLeft: []string{"n1:primary:1"},
		},
		{
			name:   "a node that cannot describe its copy: nothing is deleted",
			copies: []string{"n1:primary:1"},
			setup: func(w *world) {
				w.nodes["n2"].Refuse("GetCopy", errdefs.Wrap(errdefs.ErrFailedPrecondition, "pool suspended"))
			},
			wantErr:  errdefs.ErrUnavailable,
			wantLeft: []string{"n1:primary:1"},
		},
		{
			name:   "an older primary is set aside, not destroyed",
			copies: []string{"n1:primary:1", "n2:primary:2", "n3:replica:2"},
			aside:  "n1",
		},
		{
			name:   "an older primary that cannot be set aside keeps the volume",
			copies: []string{"n1:primary:1", "n2:primary:2"},
			setup: func(w *world) {
				w.nodes["n1"].Refuse("Demote", errdefs.Wrap(errdefs.ErrAborted, "busy"))
			},
			wantErr:  errdefs.ErrAborted,
			wantLeft: []string{"n1:primary:1", "n2:primary:2"},
		},
		{
			// Replicas go before the primary: were the primary deleted
			// first, a publish before the retry would fail the volume
			// over to the replica left, bringing the volume back.
			name:   "a replica that cannot be deleted fails the delete before the primary goes",
			copies: []string{"n1:primary:1", "n2:replica:1", "n3:replica:1"},
			setup: func(w *world) {
				w.nodes["n2"].Refuse("DeleteReplica", errdefs.Wrap(errdefs.ErrAborted, "receiving"))
			},
			wantErr:  errdefs.ErrUnavailable,
			wantLeft: []string{"n1:primary:1", "n2:replica:1"},
		},
		{
			name:   "a mounted primary is refused before anything goes",
			copies: []string{"n1:primary:1", "n2:replica:1"},
			setup: func(w *world) {
				c, _ := w.nodes["n1"].Copy(id)
				c.Mounted = true
				w.nodes["n1"].PutCopy(c)
			},
			wantErr:  errdefs.ErrFailedPrecondition,
			wantLeft: []string{"n1:primary:1", "n2:replica:1"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld()
			w.put(t, name, tc.copies...)
			if tc.setup != nil {
				tc.setup(w)
			}
			err := w.provisioner(t, tc.extra...).Delete(context.Background(), id)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("got %v, want %v", err, tc.wantErr)
			}
			if got := w.holders(id); !slices.Equal(got, tc.wantLeft) {
				t.Errorf("copies left: %v, want %v", got, tc.wantLeft)
			}
			for node, f := range w.nodes {
				setAside := slices.Contains(f.SetAside(), id)
				if setAside != (node == tc.aside) {
					t.Errorf("node %s set the volume aside: %v, want %v", node, setAside, node == tc.aside)
				}
			}
			if tc.aside != "" && slices.Contains(w.nodes[tc.aside].Calls(), "DeleteVolume "+id) {
				t.Errorf("the older primary on %s was destroyed", tc.aside)
			}
		})
	}
}

// TestADeleteForgetsPromisesLast: the nodes forget the generation they
// promised for a deleted volume only once every copy is gone. A replica
// left by a failed delete keeps the promises (the deletion's), so a
// failover of it can never take a generation a deleted copy held (I3:
// found by the simulation, seeds 4115 and 5483 of a 5000-seed sweep,
// 2026-11-27).
func TestADeleteForgetsPromisesLast(t *testing.T) {
	w := newWorld()
	w.put(t, "v", "n1:primary:3", "n2:replica:3")
	id := contract.VolumeIDForName("v")
	for _, n := range w.nodes {
		n.Promise(id, 3, "n1")
	}
	promised := func() map[string]uint64 {
		out := map[string]uint64{}
		for name, n := range w.nodes {
			c, err := n.GetCopy(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			out[name] = c.PromisedGeneration
		}
		return out
	}
	p := w.provisioner(t)
	w.nodes["n2"].RefuseTimes("DeleteReplica", 1, errdefs.Wrap(errdefs.ErrAborted, "receiving"))
	if err := p.Delete(context.Background(), id); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("a delete whose replica could not go: %v, want Unavailable", err)
	}
	if got, want := promised(), map[string]uint64{"n1": 4, "n2": 4, "n3": 4}; !maps.Equal(got, want) {
		t.Fatalf("promises after a delete that left a replica: %v, want generation 4 kept for the deletion %v", got, want)
	}
	if err := p.Delete(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if got, want := promised(), map[string]uint64{"n1": 0, "n2": 0, "n3": 0}; !maps.Equal(got, want) {
		t.Fatalf("promises after the delete's retry: %v, want all forgotten %v", got, want)
	}
}

// TestADeleteOutlastsAMoveItRaces: another controller instance's move
// has reserved its generation and promotes its target while the delete
// runs. Whether the promotion lands before the delete's reservation (the
// delete's second look finds the new primary) or after it (the target
// refuses it), the delete that answers OK leaves no copy. Looking once
// and deleting what that look saw left the promoted target (G9, found
// by the simulation with two instances).
func TestADeleteOutlastsAMoveItRaces(t *testing.T) {
	for _, landsAt := range []string{"Reserve", "DeleteReplica"} {
		t.Run("promotion at "+landsAt, func(t *testing.T) {
			w := newWorld()
			w.put(t, "v", "n1:primary:3", "n3:replica:3")
			id := contract.VolumeIDForName("v")
			for _, n := range w.nodes {
				n.Promise(id, 4, "n3") // the move's reservation
			}
			var promoted error
			landed := false
			w.nodes["n3"].BeforeCall(landsAt, func() {
				landed = true
				_, promoted = w.nodes["n3"].Promote(context.Background(), agentclient.Promotion{VolumeID: id, Generation: 4})
			})
			if err := w.provisioner(t).Delete(context.Background(), id); err != nil {
				t.Fatal(err)
			}
			if !landed {
				t.Fatalf("the delete made no %s call on n3: the promotion never raced it", landsAt)
			}
			t.Logf("the move's promotion: %v", promoted)
			for name, n := range w.nodes {
				if c, ok := n.Copy(id); ok && c.Exists {
					t.Errorf("the delete answered OK, but node %s holds a %s of generation %d", name, c.Role, c.Generation)
				}
			}
		})
	}
}

func TestDeleteOfNoVolumeIDAsksNobody(t *testing.T) {
	w := newWorld()
	if err := w.provisioner(t).Delete(context.Background(), "not-a-volume"); err != nil {
		t.Fatal(err)
	}
	if n := countCalls(w, "GetCopy"); n != 0 {
		t.Errorf("%d nodes asked about an ID of no volume", n)
	}
}

func TestListVolumes(t *testing.T) {
	w := newWorld()
	// Seven volumes over the nodes; "moving" is on two, between a move's
	// promotion (n3, generation 2) and the old copy's demotion.
	for i, name := range []string{"a", "b", "c", "d", "e", "f"} {
		w.nodes[[]string{"n1", "n2", "n3"}[i%3]].PutPrimary(name, 1)
	}
	moving := w.nodes["n1"].PutPrimary("moving", 1)
	w.nodes["n3"].PutPrimary("moving", 2)
	p := w.provisioner(t)
	ctx := context.Background()

	all, err := p.ListVolumes(ctx, Page{})
	if err != nil || len(all.Volumes) != 7 || all.NextToken != "" {
		t.Fatalf("all at once: %d volumes, next %q, %v; want 7 and no next page", len(all.Volumes), all.NextToken, err)
	}
	var want []string
	for _, v := range all.Volumes {
		want = append(want, v.Object.VolumeID)
		if v.Object.VolumeID == moving && (v.Node.Info.NodeID != "n3" || v.Object.Generation != 2) {
			t.Errorf("the moving volume is listed on %s at generation %d, want n3 at 2 (the newest)", v.Node.Info.NodeID, v.Object.Generation)
		}
	}
	if !slices.IsSorted(want) {
		t.Errorf("listed out of order: %v", want)
	}

	// Pages of 3 list every volume once, in order.
	var got []string
	token := ""
	for pages := 0; pages < 10; pages++ {
		page, err := p.ListVolumes(ctx, Page{StartingToken: token, MaxEntries: 3})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Volumes) > 3 {
			t.Fatalf("a page of %d volumes, want at most 3", len(page.Volumes))
		}
		for _, v := range page.Volumes {
			got = append(got, v.Object.VolumeID)
		}
		if token = page.NextToken; token == "" {
			break
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pages listed %v, want %v", got, want)
	}

	// A node that does not answer is left out: listings are informational.
	w.nodes["n2"].SetDown(true)
	part, err := p.ListVolumes(ctx, Page{})
	if err != nil || len(part.Volumes) != 5 {
		t.Fatalf("with n2 down: %d volumes, %v; want the other nodes' 5", len(part.Volumes), err)
	}

	for _, bad := range []struct {
		page Page
		err  error
	}{
		{Page{StartingToken: "not-a-token"}, errdefs.ErrAborted},
		{Page{MaxEntries: -1}, errdefs.ErrInvalidArgument},
	} {
		if _, err := p.ListVolumes(ctx, bad.page); !errors.Is(err, bad.err) {
			t.Errorf("ListVolumes(%+v): %v, want %v", bad.page, err, bad.err)
		}
	}
}

func TestSnapshots(t *testing.T) {
	w := newWorld()
	vol := w.nodes["n1"].PutPrimary("v", 1)
	other := w.nodes["n2"].PutPrimary("w", 1)
	p := w.provisioner(t)
	ctx := context.Background()

	snap, err := p.CreateSnapshot(ctx, "s", vol)
	if err != nil || snap.NodeID != "n1" || snap.SourceVolumeID != vol {
		t.Fatalf("CreateSnapshot: %+v, %v; want a snapshot of %s on n1", snap, err, vol)
	}
	again, err := p.CreateSnapshot(ctx, "s", vol)
	if err != nil || again.SnapshotID != snap.SnapshotID || countCalls(w, "CreateSnapshot") != 1 {
		t.Fatalf("repeated CreateSnapshot: %+v, %v; want the first one's, not a second", again, err)
	}
	if _, err := p.CreateSnapshot(ctx, "s", other); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("the name of another volume's snapshot: %v, want AlreadyExists", err)
	}
	if _, err := p.CreateSnapshot(ctx, "t", other); err != nil {
		t.Fatal(err)
	}

	of, err := p.ListSnapshots(ctx, SnapshotQuery{SourceVolumeID: vol})
	if err != nil || len(of.Snapshots) != 1 || of.Snapshots[0].SnapshotID != snap.SnapshotID {
		t.Fatalf("snapshots of %s: %+v, %v; want only %s", vol, of, err, snap.SnapshotID)
	}
	first, err := p.ListSnapshots(ctx, SnapshotQuery{Page: Page{MaxEntries: 1}})
	if err != nil || len(first.Snapshots) != 1 || first.NextToken == "" {
		t.Fatalf("a page of one: %+v, %v; want one snapshot and a next page", first, err)
	}
	if _, err := p.ListSnapshots(ctx, SnapshotQuery{Page: Page{StartingToken: vol}}); !errors.Is(err, errdefs.ErrAborted) {
		t.Fatalf("a volume ID as a snapshot token: %v, want Aborted", err)
	}

	if err := p.DeleteSnapshot(ctx, snap.SnapshotID); err != nil {
		t.Fatal(err)
	}
	if err := p.DeleteSnapshot(ctx, snap.SnapshotID); err != nil {
		t.Fatalf("deleting a deleted snapshot: %v, want OK", err)
	}
	// Replication gave n3 a copy of t (n3 holds a replica of other).
	tID := contract.SnapshotIDForName("t")
	tCopy, _ := w.nodes["n2"].ListSnapshots(ctx, agentclient.SnapshotQuery{SnapshotID: tID})
	w.nodes["n3"].PutSnapshot(tCopy[0])
	if all, err := p.ListSnapshots(ctx, SnapshotQuery{}); err != nil || len(all.Snapshots) != 1 || all.Snapshots[0].SnapshotID != tID {
		t.Fatalf("ListSnapshots with t on two nodes: %+v, %v; want t once", all, err)
	}
	w.nodes["n3"].SetDown(true)
	if err := p.DeleteSnapshot(ctx, contract.SnapshotIDForName("u")); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("deleting a snapshot no answering node holds, with a node down: %v, want Unavailable", err)
	}
	w.nodes["n3"].SetDown(false)
	if err := p.DeleteSnapshot(ctx, tID); err != nil || w.nodes["n2"].HasSnapshot(tID) || w.nodes["n3"].HasSnapshot(tID) {
		t.Fatalf("DeleteSnapshot of t: %v; want every copy gone", err)
	}
}

// TestSnapshotDeletedWhileANodeIsAway: a delete while a node holding a
// copy is away succeeds when a majority answers and remembers it; the away
// node's copy is then never listed or restored, is deleted once the node
// is back, and the records go with it. With a majority away nothing is
// deleted.
func TestSnapshotDeletedWhileANodeIsAway(t *testing.T) {
	w, p, vol, snap := snapshotted(t)
	ctx := context.Background()
	id := snap.SnapshotID
	w.nodes["n2"].PutSnapshot(snap) // replication took it to n2's replica

	w.nodes["n2"].SetDown(true)
	if err := p.DeleteSnapshot(ctx, id); err != nil {
		t.Fatalf("deleting with a holder away and a majority answering: %v, want OK", err)
	}
	if w.nodes["n1"].HasSnapshot(id) || !w.nodes["n1"].Remembers(id) || !w.nodes["n3"].Remembers(id) {
		t.Fatalf("after the delete: n1 holds a copy %v, n1 remembers %v, n3 remembers %v; want no copy and both remembering",
			w.nodes["n1"].HasSnapshot(id), w.nodes["n1"].Remembers(id), w.nodes["n3"].Remembers(id))
	}
	if err := p.DeleteSnapshot(ctx, id); err != nil {
		t.Fatalf("the delete repeated while n2 is away: %v, want OK", err)
	}

	w.nodes["n2"].SetDown(false) // back, with its copy
	for _, q := range []SnapshotQuery{{}, {SnapshotID: id}, {SourceVolumeID: vol}, {Page: Page{MaxEntries: 1}}} {
		if page, err := p.ListSnapshots(ctx, q); err != nil || len(page.Snapshots) != 0 {
			t.Errorf("ListSnapshots(%+v) with n2 back: %+v, %v; want the deleted snapshot hidden", q, page, err)
		}
	}
	if _, err := p.SnapshotCopies(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("where to restore the deleted snapshot: %v, want NotFound", err)
	}
	// The first pass deletes n2's copy; the records stay until a pass
	// finds no copy (a push that started before may still land one).
	for pass, wantRecords := range []bool{true, false} {
		if err := p.FinishDeletions(ctx); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"n1", "n2", "n3"} {
			if w.nodes[n].HasSnapshot(id) || n != "n2" && w.nodes[n].Remembers(id) != wantRecords {
				t.Errorf("%s after pass %d: copy %v, record %v; want no copy, a record: %v", n, pass+1, w.nodes[n].HasSnapshot(id), w.nodes[n].Remembers(id), wantRecords)
			}
		}
	}

	// A majority away: no record is sure to be met, so nothing goes.
	again, err := p.CreateSnapshot(ctx, "s", vol)
	if err != nil {
		t.Fatal(err)
	}
	w.nodes["n2"].PutSnapshot(again)
	w.nodes["n2"].SetDown(true)
	w.nodes["n3"].SetDown(true)
	if err := p.DeleteSnapshot(ctx, id); !errors.Is(err, errdefs.ErrUnavailable) || !w.nodes["n1"].HasSnapshot(id) {
		t.Fatalf("deleting with a majority away: %v (n1's copy kept: %v), want Unavailable and nothing deleted", err, w.nodes["n1"].HasSnapshot(id))
	}

	// Taken again under the same name while an old copy is away: the old
	// copy is deleted first, and the new snapshot is never hidden.
	w.nodes["n3"].SetDown(false)
	if err := p.DeleteSnapshot(ctx, id); err != nil {
		t.Fatal(err)
	}
	w.nodes["n2"].SetDown(false)
	fresh, err := p.CreateSnapshot(ctx, "s", vol)
	if err != nil || w.nodes["n2"].HasSnapshot(id) {
		t.Fatalf("CreateSnapshot after a deletion n2 missed: %v (n2's old copy left: %v); want the old copy deleted and a new snapshot", err, w.nodes["n2"].HasSnapshot(id))
	}
	if page, err := p.ListSnapshots(ctx, SnapshotQuery{SnapshotID: id}); err != nil || len(page.Snapshots) != 1 || page.Snapshots[0].NodeID != "n1" {
		t.Fatalf("the snapshot taken again: %+v, %v; want it listed, on n1 (%+v)", page, err, fresh)
	}
}

// TestASnapshotDeletedDuringAPush: every delete is remembered, so a copy
// that lands after it (a push that carried the snapshot started before)
// is never listed; the records are forgotten only when every node could
// forget its own, a node receiving into the volume keeps its record for
// the next pass, and a node that missed the delete records it before
// any other forgets.
func TestASnapshotDeletedDuringAPush(t *testing.T) {
	w, p, vol, snap := snapshotted(t)
	ctx := context.Background()
	id := snap.SnapshotID
	remembers := func(want map[string]bool) {
		t.Helper()
		for n, want := range want {
			if got := w.nodes[n].Remembers(id); got != want {
				t.Errorf("%s remembers the deletion: %v, want %v", n, got, want)
			}
		}
	}
	listed := func() {
		t.Helper()
		if page, err := p.ListSnapshots(ctx, SnapshotQuery{}); err != nil || len(page.Snapshots) != 0 {
			t.Errorf("ListSnapshots: %+v, %v; want the deleted snapshot hidden", page, err)
		}
	}

	// Every node answers: each remembers, and the one copy goes.
	if err := p.DeleteSnapshot(ctx, id); err != nil {
		t.Fatal(err)
	}
	remembers(map[string]bool{"n1": true, "n2": true, "n3": true})
	// A push to n2 that started before the delete has not landed yet:
	// n2 keeps its record while it runs; the others forget theirs.
	w.nodes["n2"].Receiving(vol, true)
	if err := p.FinishDeletions(ctx); err == nil {
		t.Error("FinishDeletions with a node keeping its record answered no error")
	}
	remembers(map[string]bool{"n1": false, "n2": true, "n3": false})
	w.nodes["n2"].PutSnapshot(snap) // it lands, and n2's record drops it
	w.nodes["n2"].Receiving(vol, false)
	listed()
	if err := p.FinishDeletions(ctx); err != nil {
		t.Fatal(err)
	}
	remembers(map[string]bool{"n1": false, "n2": false, "n3": false})

	// n3 missed the delete and a push into it runs when it is back: it
	// records the deletion before the others forget, so the copy that
	// lands is dropped and never listed.
	again, err := p.CreateSnapshot(ctx, "s", vol)
	if err != nil {
		t.Fatal(err)
	}
	w.nodes["n3"].SetDown(true)
	if err := p.DeleteSnapshot(ctx, id); err != nil {
		t.Fatal(err)
	}
	w.nodes["n3"].SetDown(false)
	w.nodes["n3"].Receiving(vol, true)
	if err := p.FinishDeletions(ctx); err == nil {
		t.Error("FinishDeletions with a node keeping its record answered no error")
	}
	remembers(map[string]bool{"n3": true})
	w.nodes["n3"].PutSnapshot(again)
	w.nodes["n3"].Receiving(vol, false)
	listed()
	if err := p.FinishDeletions(ctx); err != nil {
		t.Fatal(err)
	}
	remembers(map[string]bool{"n1": false, "n2": false, "n3": false})
	for _, n := range []string{"n1", "n2", "n3"} {
		if w.nodes[n].HasSnapshot(id) {
			t.Errorf("%s still holds a copy of the deleted snapshot", n)
		}
	}
}

// TestCurrentPrimaryOnly: what acts on a volume's data acts on its current
// primary, never on an older one, and waits while that cannot be told.
func TestCurrentPrimaryOnly(t *testing.T) {
	w := newWorld()
	id := w.nodes["n1"].PutPrimary("v", 1)
	w.nodes["n2"].PutPrimary("v", 2)
	p := w.provisioner(t)
	ctx := context.Background()

	capacity, err := p.Expand(ctx, id, 5<<30, 0)
	if err != nil || capacity != 5<<30 {
		t.Fatalf("Expand: %d, %v; want 5 GiB", capacity, err)
	}
	if c, _ := w.nodes["n2"].Copy(id); c.CapacityBytes != 5<<30 {
		t.Errorf("the newest primary has %d bytes, want 5 GiB", c.CapacityBytes)
	}
	if slices.Contains(w.nodes["n1"].Calls(), "ExpandVolume "+id) {
		t.Errorf("the older primary on n1 was expanded")
	}

	// Generation 3 was promised to n3, which is down: n2's copy may be
	// stale.
	for _, n := range []string{"n1", "n2"} {
		w.nodes[n].Promise(id, 3, "n3")
	}
	w.nodes["n3"].SetDown(true)
	if _, err := p.CurrentVolume(ctx, id); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("CurrentVolume with a newer generation promised to a silent node: %v, want Unavailable", err)
	}
	if _, err := p.CreateSnapshot(ctx, "s", id); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("CreateSnapshot then: %v, want Unavailable", err)
	}
}

func TestCapacityOf(t *testing.T) {
	w := newWorld()
	w.nodes["n3"].SetDown(true)
	p := w.provisioner(t)
	ctx := context.Background()
	all, err := p.CapacityOf(ctx, nil, "")
	if err != nil || all.AvailableBytes != 50<<30 || all.MaxVolumeBytes != 8<<30 {
		t.Fatalf("capacity: %+v, %v; want 50 GiB of the answering nodes, at most 8 GiB (the ceiling) each", all, err)
	}
	one, err := p.CapacityOf(ctx, map[string]string{config.TopologyNodeKey: "n1"}, "")
	if err != nil || one.AvailableBytes != 20<<30 {
		t.Fatalf("capacity of n1's topology: %+v, %v; want 20 GiB", one, err)
	}
	pinned, err := p.CapacityOf(ctx, nil, "n2")
	if err != nil || pinned.AvailableBytes != 30<<30 {
		t.Fatalf("capacity pinned to n2: %+v, %v; want 30 GiB", pinned, err)
	}
}

// TestNothingRacesABackgroundMove: while a volume's move runs in the
// background (its final step would race them), its delete and its
// expansion answer Aborted; once it is done they go on.
func TestNothingRacesABackgroundMove(t *testing.T) {
	w := newWorld()
	id := w.nodes["n1"].PutPrimary("v", 1)
	release := make(chan struct{})
	w.nodes["n1"].BeforePush = func(ctx context.Context, _ string, _ func(agentclient.Progress)) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	c := w.fakes.Cluster(t)
	mig := migration.New(c, hclog.NewNullLogger())
	p := New(c, mig, "most-free", hclog.NewNullLogger())
	ctx := context.Background()
	if _, err := mig.Publish(ctx, id, "n2"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("publish on n2: %v, want FailedPrecondition (moving in the background)", err)
	}
	if err := p.Delete(ctx, id); !errors.Is(err, errdefs.ErrAborted) || !strings.Contains(err.Error(), "moving to node n2") {
		t.Errorf("delete during the move: %v, want Aborted naming the move", err)
	}
	if _, err := p.Expand(ctx, id, 2<<30, 0); !errors.Is(err, errdefs.ErrAborted) {
		t.Errorf("expansion during the move: %v, want Aborted", err)
	}
	close(release)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, moving := mig.MoveRunning(id); !moving {
			break
		}
	}
	if err := p.Delete(ctx, id); err != nil {
		t.Fatalf("delete after the move: %v", err)
	}
	if h := w.holders(id); len(h) != 0 {
		t.Errorf("copies left after the delete: %v", h)
	}
}

// TestNothingIsGoneWhileAnUnlistedNodeMayHoldIt: the controller's peer
// list (rendered from service discovery) names n2 and n3 only, while the
// nodes' leases count three: n1, away from service discovery, may hold
// the only copy of a volume or a snapshot. "No node holds it" must then
// be Unavailable, never NotFound or an idempotent OK: a snapshot deleted
// so would be listed again once n1 is back, and never deleted. So too
// with a list that names no node. The control: nodes that count only
// the two listed.
func TestNothingIsGoneWhileAnUnlistedNodeMayHoldIt(t *testing.T) {
	ctx := context.Background()
	vol, snap := contract.VolumeIDForName("v"), contract.SnapshotIDForName("s")
	for _, tt := range []struct {
		name       string
		listed     []string
		knownNodes int
		gone       bool   // the calls may conclude that nothing is there
		why        string // else what their error says
	}{
		{"the nodes' leases count three", []string{"n2", "n3"}, 3, false, "1 more the nodes' leases count that the controller's peer list does not name"},
		{"the peer list names no node", nil, 0, false, "the controller's peer list names none"},
		{"the nodes count the two listed (control)", []string{"n2", "n3"}, 2, true, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var fakes clustertest.Fakes
			for _, id := range tt.listed {
				fakes.Add(agentclient.NodeInfo{NodeID: id, KnownNodes: tt.knownNodes})
			}
			c := fakes.Cluster(t)
			p := New(c, migration.New(c, hclog.NewNullLogger()), "most-free", hclog.NewNullLogger())
			checks := []struct {
				call     string
				err      error
				goneWant error // what "gone" answers
			}{
				{"DeleteSnapshot", p.DeleteSnapshot(ctx, snap), nil},
				{"SnapshotCopies", second(p.SnapshotCopies(ctx, snap)), errdefs.ErrNotFound},
				{"FindVolume", second(p.FindVolume(ctx, vol)), errdefs.ErrNotFound},
				{"Delete", p.Delete(ctx, vol), nil},
			}
			for _, ch := range checks {
				switch {
				case tt.gone && ch.goneWant == nil && ch.err != nil:
					t.Errorf("%s: %v, want OK", ch.call, ch.err)
				case tt.gone && ch.goneWant != nil && !errors.Is(ch.err, ch.goneWant):
					t.Errorf("%s: %v, want %v", ch.call, ch.err, ch.goneWant)
				case !tt.gone && (!errors.Is(ch.err, errdefs.ErrUnavailable) || !strings.Contains(ch.err.Error(), tt.why)):
					t.Errorf("%s: %v, want Unavailable saying %q", ch.call, ch.err, tt.why)
				}
			}
		})
	}
}

// second is the error of a call's two results.
func second[T any](_ T, err error) error { return err }

// fakeTargets holds one backup and records the restores it grants;
// listed are the backups it lists by target (a target missing there does
// not answer).
type fakeTargets struct {
	have    contract.BackupRef
	granted []string // node IDs
	listed  map[string][]agentclient.Backup
	names   []string
}

func (f *fakeTargets) Names() []string { return f.names }

func (f *fakeTargets) Backups(_ context.Context, target, volumeID string) ([]agentclient.Backup, error) {
	all, ok := f.listed[target]
	if !ok {
		return nil, errdefs.Wrap(errdefs.ErrUnavailable, "target %s does not answer", target)
	}
	var out []agentclient.Backup
	for _, b := range all {
		if volumeID == "" || b.VolumeID == volumeID {
			out = append(out, b)
		}
	}
	return out, nil
}

func (f *fakeTargets) Backup(_ context.Context, ref contract.BackupRef) (agentclient.Backup, error) {
	if ref != f.have {
		return agentclient.Backup{}, errdefs.Wrap(errdefs.ErrNotFound, "no backup %s", ref.SnapshotID())
	}
	return agentclient.Backup{Target: ref.Target, VolumeID: ref.VolumeID, Snapshot: ref.Snapshot}, nil
}

func (f *fakeTargets) GrantRestore(_ context.Context, ref contract.BackupRef, nodeID string) (string, error) {
	f.granted = append(f.granted, nodeID)
	return "grant-for-" + nodeID, nil
}

// TestARestoreGoesWhereTheJobIs: a volume made from a backup goes to any
// node the request's topology allows, not where a copy of a snapshot is;
// the node is handed the target's grant of the restore to it. A backup
// the target does not hold is NotFound before anything is reserved, and
// a controller without targets says so.
func TestARestoreGoesWhereTheJobIs(t *testing.T) {
	ctx := context.Background()
	ref := contract.BackupRef{Target: "vault", VolumeID: contract.VolumeIDForName("gone"), Snapshot: "zn-1796294546589447510"}
	w := newWorld()
	p := w.provisioner(t)
	targets := &fakeTargets{have: ref}
	p.UseTargets(targets)
	req := CreateRequest{VolumeRequest: contract.VolumeRequest{Name: "restored", SourceSnapshotID: ref.SnapshotID()},
		Requisite: []map[string]string{{config.TopologyNodeKey: "n3"}}}
	_, node, err := p.Create(ctx, req)
	if err != nil || node.Info.NodeID != "n3" {
		t.Fatalf("restore: on %s, %v; want n3, where the topology asks", node.Info.NodeID, err)
	}
	creates := w.nodes["n3"].Creates()
	if len(targets.granted) != 1 || targets.granted[0] != "n3" || len(creates) != 1 || creates[0].RestoreGrant != "grant-for-n3" {
		t.Errorf("grants %v, creates on n3 %+v; want one grant to n3, handed to its create", targets.granted, creates)
	}

	missing := req
	missing.Name, missing.SourceSnapshotID = "other", contract.BackupRef{Target: "vault", VolumeID: ref.VolumeID, Snapshot: "zn-1"}.SnapshotID()
	reserves := countCalls(w, "Reserve")
	if _, _, err := p.Create(ctx, missing); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a restore of a backup the target lacks: %v, want NotFound", err)
	}
	if n := countCalls(w, "Reserve"); n != reserves {
		t.Errorf("a restore of a missing backup reserved on %d nodes", n-reserves)
	}
	if _, _, err := w.provisioner(t).Create(ctx, missing); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "backup_targets") {
		t.Errorf("a restore with no backup targets: %v, want NotFound naming backup_targets", err)
	}
}

// TestBackupsListedAsSnapshots: with Backups, every answering target's
// backups are listed among the snapshots (a deleted volume's too), by
// source volume or ID, and paged with them; a target that does not
// answer is left out; without Backups none is listed.
func TestBackupsListedAsSnapshots(t *testing.T) {
	ctx := context.Background()
	w := newWorld()
	vol := w.nodes["n1"].PutPrimary("v", 1)
	p := w.provisioner(t)
	if _, err := p.CreateSnapshot(ctx, "s", vol); err != nil {
		t.Fatal(err)
	}
	gone := contract.VolumeIDForName("gone")
	at := time.Unix(1796294546, 0)
	backup := func(target, volumeID, snap string) agentclient.Backup {
		return agentclient.Backup{Target: target, VolumeID: volumeID, Snapshot: snap, Received: at, ReferencedBytes: 4096}
	}
	p.UseTargets(&fakeTargets{names: []string{"offsite", "vault"}, listed: map[string][]agentclient.Backup{
		"vault": {backup("vault", vol, "zn-1"), backup("vault", gone, "zn-2")}}})
	ids := func(page SnapshotPage) []string {
		var out []string
		for _, s := range page.Snapshots {
			out = append(out, s.SnapshotID)
		}
		return out
	}
	ofVol := backup("vault", vol, "zn-1").Ref().SnapshotID()
	ofGone := backup("vault", gone, "zn-2").Ref().SnapshotID()
	snap := contract.SnapshotIDForName("s")

	all, err := p.ListSnapshots(ctx, SnapshotQuery{Backups: true})
	if want := []string{ofGone, ofVol, snap}; err != nil || !slices.Equal(ids(all), slices.Sorted(slices.Values(want))) {
		t.Fatalf("every snapshot and backup: %v, %v; want %v", ids(all), err, want)
	}
	if s := all.Snapshots[0]; s.SourceVolumeID == "" || s.SizeBytes != 4096 || s.CreatedUnix != at.Unix() {
		t.Errorf("a backup as a snapshot: %+v; want its volume, size and the time the target received it", s)
	}
	if of, err := p.ListSnapshots(ctx, SnapshotQuery{Backups: true, SourceVolumeID: vol}); err != nil || !slices.Equal(ids(of), []string{ofVol, snap}) {
		t.Errorf("of volume %s: %v, %v; want its backup and its snapshot", vol, ids(of), err)
	}
	if one, err := p.ListSnapshots(ctx, SnapshotQuery{Backups: true, SnapshotID: ofGone}); err != nil || !slices.Equal(ids(one), []string{ofGone}) {
		t.Errorf("one backup by ID: %v, %v", ids(one), err)
	}
	var paged []string
	q := SnapshotQuery{Backups: true, Page: Page{MaxEntries: 1}}
	for range 5 {
		page, err := p.ListSnapshots(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		paged = append(paged, ids(page)...)
		if q.StartingToken = page.NextToken; q.StartingToken == "" {
			break
		}
	}
	if !slices.Equal(paged, ids(all)) {
		t.Errorf("paged one at a time: %v; want %v", paged, ids(all))
	}
	if none, err := p.ListSnapshots(ctx, SnapshotQuery{}); err != nil || !slices.Equal(ids(none), []string{snap}) {
		t.Errorf("without backups: %v, %v; want the snapshot only", ids(none), err)
	}
	if _, err := p.ListSnapshots(ctx, SnapshotQuery{Page: Page{StartingToken: ofVol}}); !errors.Is(err, errdefs.ErrAborted) {
		t.Errorf("a backup's ID as the token of a list without backups: %v, want Aborted", err)
	}
}
