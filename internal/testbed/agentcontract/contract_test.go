package agentcontract

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// The contract: each row sets up what the nodes hold of one volume, makes
// one call (or one sequence the controller makes), and says what the node
// answers: an error of an errdefs kind, or success with its answer, and
// what each node named then holds as the controller sees it (GetCopy and
// Status). TestFakeAgreesWithNode runs every row against the real node and
// against the controller tests' fake.

var nodeIDs = []string{"n1", "n2", "n3"}

const (
	volName  = "contract"
	capacity = 1 << 30
	// t0 is when a replica's newest replication snapshot was taken, and
	// when a fenced copy was fenced (unix nanos).
	t0       int64 = 1_800_000_000_000_000_000
	fencedAt       = t0
)

var volID = contract.VolumeIDForName(volName)

// snapshotName is the short name of the replication snapshot taken at
// (unix nanos).
func snapshotName(at int64) string {
	return contract.ReplicationSnapshotPrefix + strconv.FormatInt(at, 10)
}

// promise is a node's promise record of the volume: generation to holder.
type promise struct {
	generation uint64
	holder     string
}

// holding is what a node holds of the volume before the call.
type holding struct {
	role        string // contract.RolePrimary, contract.RoleReplica, or "" for no copy
	generation  uint64
	mounted     bool   // staged or published on the node
	fencedFor   string // a primary fenced (read-only) for a move to this node
	leaseFenced bool   // a primary read-only since its node lost its lease
	snapshotAt  int64  // the copy's newest replication snapshot (unix nanos); 0: none
	promise     promise
}

func primary(generation uint64) holding {
	return holding{role: contract.RolePrimary, generation: generation}
}

// replica is a replica of generation whose newest snapshot was taken at t0.
func replica(generation uint64) holding {
	return holding{role: contract.RoleReplica, generation: generation, snapshotAt: t0}
}

// promisedOnly is a node without a copy that promised generation to holder.
func promisedOnly(generation uint64, holder string) holding {
	return holding{promise: promise{generation, holder}}
}

func (h holding) mount() holding              { h.mounted = true; return h }
func (h holding) fence(target string) holding { h.fencedFor = target; return h }
func (h holding) leaseFence() holding         { h.leaseFenced = true; return h }
func (h holding) promised(g uint64, holder string) holding {
	h.promise = promise{g, holder}
	return h
}

// view is a node's copy as the controller reads it from an answer.
type view struct {
	exists       bool
	role         string
	generation   uint64
	movingTo     string
	mounted      bool
	leaseFenced  bool
	failoverFrom string
	forced       uint64
}

func viewOf(c agentclient.Copy) view {
	return view{exists: c.Exists, role: c.Role, generation: c.Generation, movingTo: c.MovingTo, mounted: c.Mounted,
		leaseFenced: c.LeaseFenced, failoverFrom: c.FailoverFromSnapshot, forced: c.ForcedGeneration}
}

// state is what a node holds of the volume after the call: its copy and
// promise (GetCopy), and whether a copy of it is set aside (Status).
type state struct {
	view
	promise  promise
	setAside bool
}

// answer is a successful call's answer, the fields of its call.
type answer struct {
	granted  bool    // Reserve
	promised promise // Reserve: the record before (granted) or the one in the way (refused)
	copy     view    // Promote, Demote, Unfence, GetCopy
	deleted  bool    // DeleteReplica
	fenced   bool    // MoveFinal: the answer carries the fence's time
}

// world is the nodes of one implementation, each at an address.
type world interface {
	agent(id string) cluster.NodeAgent
	addr(id string) string
}

type call func(ctx context.Context, w world) (answer, error)

func reserve(node string, generation uint64, holder string) call {
	return func(ctx context.Context, w world) (answer, error) {
		p, err := w.agent(node).Reserve(ctx, agentclient.Reservation{VolumeID: volID, Generation: generation, HolderNodeID: holder})
		return answer{granted: p.Granted, promised: promise{p.PromisedGeneration, p.PromisedHolder}}, err
	}
}

func promote(node string, p agentclient.Promotion) call {
	return func(ctx context.Context, w world) (answer, error) {
		p.VolumeID = volID
		c, err := w.agent(node).Promote(ctx, p)
		return answer{copy: viewOf(c)}, err
	}
}

func demote(node string, generation uint64, aside bool) call {
	return func(ctx context.Context, w world) (answer, error) {
		c, err := w.agent(node).Demote(ctx, agentclient.Demotion{VolumeID: volID, Generation: generation, Aside: aside})
		return answer{copy: viewOf(c)}, err
	}
}

func moveFinal(from, to string) call {
	return func(ctx context.Context, w world) (answer, error) {
		p, err := w.agent(from).MoveFinal(ctx, volID, w.addr(to), to)
		return answer{fenced: p.FencedAt > 0}, err
	}
}

// move is a planned move's last steps as the controller makes them: the
// source's final push, the target's promotion to generation with a
// snapshot taken after the fence, the source's demotion.
func move(from, to string, generation uint64) call {
	return func(ctx context.Context, w world) (answer, error) {
		p, err := w.agent(from).MoveFinal(ctx, volID, w.addr(to), to)
		if err != nil {
			return answer{}, err
		}
		if _, err := w.agent(to).Promote(ctx, agentclient.Promotion{VolumeID: volID, Generation: generation, NotBeforeUnixNano: p.FencedAt}); err != nil {
			return answer{}, err
		}
		c, err := w.agent(from).Demote(ctx, agentclient.Demotion{VolumeID: volID, Generation: generation})
		return answer{copy: viewOf(c)}, err
	}
}

func unfence(node string, generation uint64) call {
	return func(ctx context.Context, w world) (answer, error) {
		c, err := w.agent(node).Unfence(ctx, volID, generation)
		return answer{copy: viewOf(c)}, err
	}
}

func getCopy(node string) call {
	return func(ctx context.Context, w world) (answer, error) {
		c, err := w.agent(node).GetCopy(ctx, volID)
		return answer{copy: viewOf(c)}, err
	}
}

func deleteReplica(node string, volumeDeleted bool) call {
	return func(ctx context.Context, w world) (answer, error) {
		deleted, err := w.agent(node).DeleteReplica(ctx, volID, volumeDeleted)
		return answer{deleted: deleted}, err
	}
}

// row is one case of the contract.
type row struct {
	name  string
	holds map[string]holding // by node; a node not named holds nothing
	call  call
	err   error  // the errdefs kind of the refusal; nil: the call succeeds
	want  answer // the answer, when it succeeds
	after map[string]state
}

// A few states, as the controller sees them after the call.
func primaryState(generation uint64) state {
	return state{view: view{exists: true, role: contract.RolePrimary, generation: generation}}
}

func replicaState(generation uint64) state {
	return state{view: view{exists: true, role: contract.RoleReplica, generation: generation}}
}

func (s state) with(g uint64, holder string) state { s.promise = promise{g, holder}; return s }
func (s state) moving(node string) state           { s.movingTo = node; return s }

var (
	noCopy   = state{}
	setAside = state{setAside: true}
	deletion = contract.DeletionHolder
)

func primaryView(generation uint64) view {
	return view{exists: true, role: contract.RolePrimary, generation: generation}
}

var table = []row{
	// Reserve: granted above every generation the node promised or
	// holds a copy of, and again to the same holder; refused otherwise,
	// answering what stands in the way. A grant answers the record it
	// supersedes.
	{name: "Reserve: nothing known: granted",
		call: reserve("n1", 2, "n2"),
		want: answer{granted: true}, after: map[string]state{"n1": noCopy.with(2, "n2")}},
	{name: "Reserve: above the copy and the record: granted",
		holds: map[string]holding{"n1": primary(1).promised(2, "n2")}, call: reserve("n1", 3, "n1"),
		want: answer{granted: true, promised: promise{2, "n2"}}, after: map[string]state{"n1": primaryState(1).with(3, "n1")}},
	{name: "Reserve: the same generation to the same holder again: granted",
		holds: map[string]holding{"n1": primary(1).promised(2, "n2")}, call: reserve("n1", 2, "n2"),
		want: answer{granted: true, promised: promise{2, "n2"}}, after: map[string]state{"n1": primaryState(1).with(2, "n2")}},
	{name: "Reserve: not above the record: refused with the record",
		holds: map[string]holding{"n1": primary(1).promised(3, "n2")}, call: reserve("n1", 3, "n3"),
		want: answer{promised: promise{3, "n2"}}, after: map[string]state{"n1": primaryState(1).with(3, "n2")}},
	{name: "Reserve: not above the primary here: refused with the copy's generation",
		holds: map[string]holding{"n1": primary(4)}, call: reserve("n1", 4, "n2"),
		want: answer{promised: promise{4, "n1"}}, after: map[string]state{"n1": primaryState(4)}},
	{name: "Reserve: not above a replica here: refused with the replica's generation",
		holds: map[string]holding{"n1": replica(5)}, call: reserve("n1", 5, "n2"),
		want: answer{promised: promise{5, "n1"}}, after: map[string]state{"n1": replicaState(5)}},
	{name: "Reserve: a deletion's promise refuses any other holder",
		holds: map[string]holding{"n1": primary(1).promised(9, deletion)}, call: reserve("n1", 10, "n2"),
		want: answer{promised: promise{9, deletion}}, after: map[string]state{"n1": primaryState(1).with(9, deletion)}},
	{name: "Reserve: a deletion again at or below its generation: granted, the record kept",
		holds: map[string]holding{"n1": primary(1).promised(9, deletion)}, call: reserve("n1", 8, deletion),
		want: answer{granted: true, promised: promise{9, deletion}}, after: map[string]state{"n1": primaryState(1).with(9, deletion)}},
	{name: "Reserve: a deletion above its own generation: refused",
		holds: map[string]holding{"n1": primary(1).promised(9, deletion)}, call: reserve("n1", 10, deletion),
		want: answer{promised: promise{9, deletion}}, after: map[string]state{"n1": primaryState(1).with(9, deletion)}},
	{name: "Reserve: generation 0: invalid",
		call: reserve("n1", 0, "n2"), err: errdefs.ErrInvalidArgument, after: map[string]state{"n1": noCopy}},

	// Promote: only the generation the node promised to itself, only a
	// replica below it, holding the snapshot named after the fence's time
	// (a fenced copy's own), not merely a later one.
	{name: "Promote: without a promise",
		holds: map[string]holding{"n2": replica(1)}, call: promote("n2", agentclient.Promotion{Generation: 2, NotBeforeUnixNano: t0}),
		err: errdefs.ErrFailedPrecondition, after: map[string]state{"n2": replicaState(1)}},
	{name: "Promote: the generation promised to another node",
		holds: map[string]holding{"n2": replica(1).promised(2, "n3")}, call: promote("n2", agentclient.Promotion{Generation: 2, NotBeforeUnixNano: t0}),
		err: errdefs.ErrFailedPrecondition, after: map[string]state{"n2": replicaState(1).with(2, "n3")}},
	{name: "Promote: the replica ends before the fence",
		holds: map[string]holding{"n2": replica(1).promised(2, "n2")}, call: promote("n2", agentclient.Promotion{Generation: 2, NotBeforeUnixNano: t0 + 1}),
		err: errdefs.ErrFailedPrecondition, after: map[string]state{"n2": replicaState(1).with(2, "n2")}},
	{name: "Promote: the replica's snapshot is later than the fence, not the fence's own",
		holds: map[string]holding{"n2": replica(1).promised(2, "n2")}, call: promote("n2", agentclient.Promotion{Generation: 2, NotBeforeUnixNano: t0 - 1}),
		err: errdefs.ErrFailedPrecondition, after: map[string]state{"n2": replicaState(1).with(2, "n2")}},
	{name: "Promote: promised, fresh: the primary",
		holds: map[string]holding{"n2": replica(1).promised(2, "n2")}, call: promote("n2", agentclient.Promotion{Generation: 2, NotBeforeUnixNano: t0}),
		want: answer{copy: primaryView(2)}, after: map[string]state{"n2": primaryState(2).with(2, "n2")}},
	{name: "Promote: again once promoted: the primary",
		holds: map[string]holding{"n2": primary(2).promised(2, "n2")}, call: promote("n2", agentclient.Promotion{Generation: 2, NotBeforeUnixNano: t0}),
		want: answer{copy: primaryView(2)}, after: map[string]state{"n2": primaryState(2).with(2, "n2")}},
	{name: "Promote: promised but no copy here",
		holds: map[string]holding{"n2": promisedOnly(2, "n2")}, call: promote("n2", agentclient.Promotion{Generation: 2}),
		err: errdefs.ErrNotFound, after: map[string]state{"n2": noCopy.with(2, "n2")}},
	{name: "Promote: a primary of another generation",
		holds: map[string]holding{"n2": primary(1).promised(2, "n2")}, call: promote("n2", agentclient.Promotion{Generation: 2}),
		err: errdefs.ErrFailedPrecondition, after: map[string]state{"n2": primaryState(1).with(2, "n2")}},
	{name: "Promote: the replica is at the promised generation already",
		holds: map[string]holding{"n2": replica(3).promised(3, "n2")}, call: promote("n2", agentclient.Promotion{Generation: 3, NotBeforeUnixNano: t0}),
		err: errdefs.ErrFailedPrecondition, after: map[string]state{"n2": replicaState(3).with(3, "n2")}},
	{name: "Promote: a failover records the recovery point",
		holds: map[string]holding{"n2": replica(1).promised(2, "n2")}, call: promote("n2", agentclient.Promotion{Generation: 2, Failover: true}),
		want:  answer{copy: view{exists: true, role: contract.RolePrimary, generation: 2, failoverFrom: snapshotName(t0)}},
		after: map[string]state{"n2": {view: view{exists: true, role: contract.RolePrimary, generation: 2, failoverFrom: snapshotName(t0)}, promise: promise{2, "n2"}}}},
	{name: "Promote: forced marks the generation",
		holds: map[string]holding{"n2": replica(1).promised(2, "n2")}, call: promote("n2", agentclient.Promotion{Generation: 2, Failover: true, Forced: true}),
		want:  answer{copy: view{exists: true, role: contract.RolePrimary, generation: 2, failoverFrom: snapshotName(t0), forced: 2}},
		after: map[string]state{"n2": {view: view{exists: true, role: contract.RolePrimary, generation: 2, failoverFrom: snapshotName(t0), forced: 2}, promise: promise{2, "n2"}}}},

	// Demote: only a primary older than the generation, never a mounted
	// one; a fenced one becomes a replica, any other is set aside.
	{name: "Demote: not older",
		holds: map[string]holding{"n1": primary(2)}, call: demote("n1", 2, false),
		err: errdefs.ErrFailedPrecondition, after: map[string]state{"n1": primaryState(2)}},
	{name: "Demote: mounted",
		holds: map[string]holding{"n1": primary(1).mount()}, call: demote("n1", 2, false),
		err: errdefs.ErrFailedPrecondition, after: map[string]state{"n1": {view: view{exists: true, role: contract.RolePrimary, generation: 1, mounted: true}}}},
	{name: "Demote: fenced for a move: a replica of the new generation",
		holds: map[string]holding{"n1": primary(1).fence("n2").promised(2, "n2")}, call: demote("n1", 2, false),
		want: answer{copy: view{exists: true, role: contract.RoleReplica, generation: 2}}, after: map[string]state{"n1": replicaState(2).with(2, "n2")}},
	{name: "Demote: not fenced: set aside",
		holds: map[string]holding{"n1": primary(1)}, call: demote("n1", 2, false),
		want: answer{}, after: map[string]state{"n1": setAside}},
	{name: "Demote: fenced, aside asked: set aside",
		holds: map[string]holding{"n1": primary(1).fence("n2").promised(2, "n2")}, call: demote("n1", 2, true),
		want: answer{}, after: map[string]state{"n1": setAside.with(2, "n2")}},
	{name: "Demote: lease-fenced: set aside",
		holds: map[string]holding{"n1": primary(1).leaseFence()}, call: demote("n1", 2, false),
		want: answer{}, after: map[string]state{"n1": setAside}},
	{name: "Demote: no copy (set aside already): done",
		call: demote("n1", 2, false), want: answer{}, after: map[string]state{"n1": noCopy}},
	{name: "Demote: a replica (demoted already): done",
		holds: map[string]holding{"n1": replica(1)}, call: demote("n1", 2, false),
		want: answer{copy: view{exists: true, role: contract.RoleReplica, generation: 1}}, after: map[string]state{"n1": replicaState(1)}},

	// MoveFinal: fences the primary for the target, only unmounted and
	// promised away to the target above its generation; pushes it there.
	{name: "MoveFinal: mounted",
		holds: map[string]holding{"n1": primary(1).mount().promised(2, "n2")}, call: moveFinal("n1", "n2"), err: errdefs.ErrFailedPrecondition,
		after: map[string]state{"n1": {view: view{exists: true, role: contract.RolePrimary, generation: 1, mounted: true}, promise: promise{2, "n2"}}, "n2": noCopy}},
	{name: "MoveFinal: no promise",
		holds: map[string]holding{"n1": primary(1)}, call: moveFinal("n1", "n2"), err: errdefs.ErrFailedPrecondition,
		after: map[string]state{"n1": primaryState(1), "n2": noCopy}},
	{name: "MoveFinal: promised to another node",
		holds: map[string]holding{"n1": primary(1).promised(2, "n3")}, call: moveFinal("n1", "n2"), err: errdefs.ErrFailedPrecondition,
		after: map[string]state{"n1": primaryState(1).with(2, "n3"), "n2": noCopy}},
	{name: "MoveFinal: promised to the target, not above the copy",
		holds: map[string]holding{"n1": primary(2).promised(2, "n2")}, call: moveFinal("n1", "n2"), err: errdefs.ErrFailedPrecondition,
		after: map[string]state{"n1": primaryState(2).with(2, "n2"), "n2": noCopy}},
	{name: "MoveFinal: promised to the target: fenced and pushed",
		holds: map[string]holding{"n1": primary(1).promised(2, "n2")}, call: moveFinal("n1", "n2"), want: answer{fenced: true},
		after: map[string]state{"n1": primaryState(1).moving("n2").with(2, "n2"), "n2": replicaState(1)}},
	{name: "MoveFinal: fenced for another node, promised to the target: fenced again",
		holds: map[string]holding{"n1": primary(1).fence("n3").promised(3, "n2")}, call: moveFinal("n1", "n2"), want: answer{fenced: true},
		after: map[string]state{"n1": primaryState(1).moving("n2").with(3, "n2"), "n2": replicaState(1)}},
	{name: "MoveFinal: a replica",
		holds: map[string]holding{"n1": replica(1).promised(2, "n2")}, call: moveFinal("n1", "n2"), err: errdefs.ErrFailedPrecondition,
		after: map[string]state{"n1": replicaState(1).with(2, "n2"), "n2": noCopy}},
	{name: "MoveFinal: no copy",
		holds: map[string]holding{"n1": promisedOnly(2, "n2")}, call: moveFinal("n1", "n2"), err: errdefs.ErrNotFound,
		after: map[string]state{"n1": noCopy.with(2, "n2"), "n2": noCopy}},
	{name: "a planned move: final push, promotion after the fence, demotion",
		holds: map[string]holding{"n1": primary(1).promised(2, "n2"), "n2": promisedOnly(2, "n2")}, call: move("n1", "n2", 2),
		want:  answer{copy: view{exists: true, role: contract.RoleReplica, generation: 2}},
		after: map[string]state{"n1": replicaState(2).with(2, "n2"), "n2": primaryState(2).with(2, "n2")}},

	// Unfence: lifts a move's fence unless the node's own record promises
	// a newer generation to another node; a lease's fence only at the
	// copy's generation.
	{name: "Unfence: fenced, promised away",
		holds: map[string]holding{"n1": primary(1).fence("n2").promised(2, "n2")}, call: unfence("n1", 1), err: errdefs.ErrFailedPrecondition,
		after: map[string]state{"n1": primaryState(1).moving("n2").with(2, "n2")}},
	{name: "Unfence: fenced, after a superseding reservation for this node",
		holds: map[string]holding{"n1": primary(1).fence("n2").promised(3, "n1")}, call: unfence("n1", 1),
		want: answer{copy: primaryView(1)}, after: map[string]state{"n1": primaryState(1).with(3, "n1")}},
	{name: "Unfence: fenced, the promise not above the copy",
		holds: map[string]holding{"n1": primary(2).fence("n2").promised(2, "n2")}, call: unfence("n1", 2),
		want: answer{copy: primaryView(2)}, after: map[string]state{"n1": primaryState(2).with(2, "n2")}},
	{name: "Unfence: not fenced",
		holds: map[string]holding{"n1": primary(1)}, call: unfence("n1", 1),
		want: answer{copy: primaryView(1)}, after: map[string]state{"n1": primaryState(1)}},
	{name: "Unfence: lease-fenced, promised away",
		holds: map[string]holding{"n1": primary(1).leaseFence().promised(2, "n2")}, call: unfence("n1", 1), err: errdefs.ErrFailedPrecondition,
		after: map[string]state{"n1": {view: view{exists: true, role: contract.RolePrimary, generation: 1, leaseFenced: true}, promise: promise{2, "n2"}}}},
	{name: "Unfence: lease-fenced, confirmed for another generation",
		holds: map[string]holding{"n1": primary(2).leaseFence()}, call: unfence("n1", 1), err: errdefs.ErrFailedPrecondition,
		after: map[string]state{"n1": {view: view{exists: true, role: contract.RolePrimary, generation: 2, leaseFenced: true}}}},
	{name: "Unfence: lease-fenced, confirmed for its generation",
		holds: map[string]holding{"n1": primary(2).leaseFence()}, call: unfence("n1", 2),
		want: answer{copy: primaryView(2)}, after: map[string]state{"n1": primaryState(2)}},
	{name: "Unfence: a replica",
		holds: map[string]holding{"n1": replica(1)}, call: unfence("n1", 1), err: errdefs.ErrFailedPrecondition,
		after: map[string]state{"n1": replicaState(1)}},
	{name: "Unfence: no copy",
		call: unfence("n1", 1), err: errdefs.ErrNotFound, after: map[string]state{"n1": noCopy}},

	// GetCopy: a volume the node holds no copy of is no error.
	{name: "GetCopy: no copy",
		call: getCopy("n1"), want: answer{}, after: map[string]state{"n1": noCopy}},
	{name: "GetCopy: no copy, a promise",
		holds: map[string]holding{"n1": promisedOnly(2, "n2")}, call: getCopy("n1"),
		want: answer{}, after: map[string]state{"n1": noCopy.with(2, "n2")}},
	{name: "GetCopy: a mounted primary",
		holds: map[string]holding{"n1": primary(1).mount()}, call: getCopy("n1"),
		want: answer{copy: view{exists: true, role: contract.RolePrimary, generation: 1, mounted: true}}},

	// DeleteReplica: never a primary; a deleted volume's promise goes first.
	{name: "DeleteReplica: a primary is kept",
		holds: map[string]holding{"n1": primary(1).promised(2, "n2")}, call: deleteReplica("n1", false),
		want: answer{}, after: map[string]state{"n1": primaryState(1).with(2, "n2")}},
	{name: "DeleteReplica: a deleted volume's primary is kept, its promise forgotten",
		holds: map[string]holding{"n1": primary(1).promised(2, "n2")}, call: deleteReplica("n1", true),
		want: answer{}, after: map[string]state{"n1": primaryState(1)}},
	{name: "DeleteReplica: a replica is deleted",
		holds: map[string]holding{"n1": replica(1).promised(2, "n2")}, call: deleteReplica("n1", false),
		want: answer{deleted: true}, after: map[string]state{"n1": noCopy.with(2, "n2")}},
}

// implementations are what the table runs against: the real node first,
// the truth, then the fake.
var implementations = []struct {
	name  string
	start func(t *testing.T, holdings map[string]holding) world
}{
	{"node", startReal},
	{"fake", startFakes},
}

// TestFakeAgreesWithNode runs the contract against the real node and the
// controller tests' fake: each must answer every row as the row says.
func TestFakeAgreesWithNode(t *testing.T) {
	for _, r := range table {
		t.Run(r.name, func(t *testing.T) {
			for _, impl := range implementations {
				t.Run(impl.name, func(t *testing.T) {
					check(t, r, impl.start(t, r.holds))
				})
			}
		})
	}
}

// check makes the row's call in w and compares what follows with the row.
func check(t *testing.T, r row, w world) {
	t.Helper()
	ctx := context.Background()
	got, err := r.call(ctx, w)
	switch {
	case r.err == nil && err != nil:
		t.Errorf("refused (%v): %v; want success", errdefs.Code(err), err)
	case r.err != nil && (err == nil || !errors.Is(err, r.err)):
		t.Errorf("answered %+v, %v (%v); want %v", got, err, errdefs.Code(err), errdefs.Code(r.err))
	case r.err == nil && got != r.want:
		t.Errorf("answered %+v; want %+v", got, r.want)
	}
	for _, id := range nodeIDs {
		want, ok := r.after[id]
		if !ok {
			continue
		}
		if s := stateOf(t, w, id); s != want {
			t.Errorf("node %s then holds %+v; want %+v", id, s, want)
		}
	}
}

// stateOf reads what node id holds of the volume as the controller does.
func stateOf(t *testing.T, w world, id string) state {
	t.Helper()
	ctx := context.Background()
	c, err := w.agent(id).GetCopy(ctx, volID)
	if err != nil {
		t.Fatalf("GetCopy on node %s: %v", id, err)
	}
	st, err := w.agent(id).Status(ctx)
	if err != nil {
		t.Fatalf("Status of node %s: %v", id, err)
	}
	aside := slices.ContainsFunc(st.SetAside, func(name string) bool { return strings.Contains(name, volID) })
	return state{view: viewOf(c), promise: promise{c.PromisedGeneration, c.PromisedHolder}, setAside: aside}
}
