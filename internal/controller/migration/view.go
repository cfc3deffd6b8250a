package migration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/witnesses"
)

// copyOn is one node's copy of a volume.
type copyOn struct {
	node cluster.Node
	copy agentclient.Copy
}

func (c copyOn) nodeID() string { return c.node.Info.NodeID }

// view is what the reachable nodes hold of one volume.
type view struct {
	nodes       []cluster.Node
	copies      []copyOn   // existing copies, by node ID
	promises    []promised // what each answering node promised
	unreachable []string   // agents that did not answer
	// members is how many nodes the majorities count (cluster.Members):
	// at least the answering and the unreachable ones, more when a node's
	// lease knows more than the controller's peer list.
	members int
	// witnesses: when not empty, the set a generation's majorities count
	// (the look's quorum, a reservation, a creation's plan) instead of
	// every node (cluster.Witnesses). witnessErr: the answering nodes
	// report different sets, and the view has no quorum.
	witnesses  witnesses.Set
	witnessErr error
	// background: no CO waits on this decision (a move's final step run
	// in the background), so its agent calls may take longer (call).
	background bool
}

// backgroundCallTimeout bounds one agent call of a move run in the
// background. Nobody waits on it, and a node whose pool is busy with a
// drain's other moves may answer a promotion slowly: failing it at the
// agent timeout would leave the source fenced and the move to do again.
const backgroundCallTimeout = 2 * time.Minute

// call bounds one agent call made for a decision from view v: by the
// agent timeout while a CO waits, by backgroundCallTimeout in the
// background.
func (m *Migrator) call(ctx context.Context, v view) (context.Context, context.CancelFunc) {
	if v.background {
		return context.WithTimeout(ctx, backgroundCallTimeout)
	}
	return m.cluster.Call(ctx)
}

// promised is one node's promise of a generation (Reserve).
type promised struct {
	generation uint64
	holder     string
	recorder   string // the node whose record it is
}

// quorum reports whether a majority of the nodes answered: only then does
// the view hold every generation ever given (each was promised by a
// majority, and two majorities share a node). With witnesses it is a
// majority of the witnesses: each generation was promised by one.
func (v view) quorum() bool {
	return v.witnessErr == nil && v.answeringVoters() > v.voters()/2
}

// counts reports whether node nodeID's word counts toward a generation's
// majority: every node's, or with witnesses only theirs.
func (v view) counts(nodeID string) bool {
	return v.witnesses.Empty() || v.witnesses.Has(nodeID)
}

// voters is how many nodes a generation's majority is taken over: every
// node (total), or the witnesses.
func (v view) voters() int {
	if v.witnesses.Empty() {
		return v.total()
	}
	return v.witnesses.Len()
}

// answeringVoters is how many of the voters answered.
func (v view) answeringVoters() int {
	n := 0
	for _, node := range v.nodes {
		if v.counts(node.Info.NodeID) {
			n++
		}
	}
	return n
}

// total is how many nodes a majority is taken over.
func (v view) total() int { return max(len(v.nodes)+len(v.unreachable), v.members) }

// allAnswered reports whether every node answered, those the nodes'
// leases count beyond the controller's list included, and at least one
// did (cluster.AllAnswered): only then does no copy in the view mean no
// copy anywhere.
func (v view) allAnswered() bool { return len(v.nodes) > 0 && v.total() == len(v.nodes) }

// silent says, for an error, which nodes did not answer: the unreachable
// agents by name, and how many more the nodes' leases count than the
// controller's peer list names (a node gone from service discovery).
func (v view) silent() string {
	var parts []string
	if len(v.unreachable) > 0 {
		parts = append(parts, "unreachable agents "+strings.Join(v.unreachable, ", "))
	}
	if unlisted := v.members - len(v.nodes) - len(v.unreachable); unlisted > 0 {
		parts = append(parts, fmt.Sprintf("%d node(s) the nodes' leases count that the controller's peer list no longer names", unlisted))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", and ")
}

// newest is the highest generation any answering node holds or promised.
func (v view) newest() uint64 {
	g := v.maxGeneration()
	for _, p := range v.promises {
		g = max(g, p.generation)
	}
	return g
}

// forcedOn reports whether the newest primary in view is on nodeID and was
// promoted there by the operator without a majority (promote -force) at
// its current generation: the one copy that may be published while the
// majority stays lost, on the operator's word.
func (v view) forcedOn(nodeID string) bool {
	p, ok := v.primary()
	if !ok || p.nodeID() != nodeID || p.copy.ForcedGeneration != p.copy.Generation {
		return false
	}
	_, newer := v.newerElsewhere(p)
	return !newer && p.copy.Generation >= v.newest()
}

// nextGeneration is the generation to promote holder's copy with: one
// above every copy and promise seen; or, when the newest is a promise to
// holder that no copy holds yet, that one: a retry of an interrupted
// promotion finishes it rather than spending another generation.
func (v view) nextGeneration(holder string) uint64 {
	newest := v.newest()
	if newest > v.maxGeneration() {
		for _, p := range v.promises {
			if p.generation == newest && p.holder == holder {
				return newest
			}
		}
	}
	return newest + 1
}

// newerElsewhere returns a promise of a generation above p's whose holder
// did not answer: that node may hold a newer primary, so p may be stale.
// A promise whose holder answered is void if the holder has no such copy
// (its promotion never happened).
func (v view) newerElsewhere(p copyOn) (promised, bool) {
	for _, pr := range v.promises {
		if pr.generation <= p.copy.Generation {
			continue
		}
		if _, answered := v.node(pr.holder); !answered {
			return pr, true
		}
	}
	return promised{}, false
}

// promisedAway returns a promise of a generation above p's to another
// node that answered but may still be promoted with it: its own record
// (which its promotion checks, under the record's lock) still holds that
// promise, or holds none as high (a reservation in flight may still reach
// it). The holder answering without a primary proves nothing while a
// move's final step may be promoting it. The promise is void
// only once the holder's own record promises a generation at least as
// high to another node: records only grow, so the holder can then never
// be promoted with it. p's fence is lifted only when there is none
// (supersede).
func (v view) promisedAway(p copyOn) (promised, bool) {
	for _, pr := range v.promises {
		if pr.generation <= p.copy.Generation || pr.holder == p.nodeID() {
			continue
		}
		own := v.recordOf(pr.holder)
		if own.generation < pr.generation || own.holder == pr.holder {
			return pr, true
		}
	}
	return promised{}, false
}

// recordOf is nodeID's own promise record (zero when it answered none).
func (v view) recordOf(nodeID string) promised {
	for _, pr := range v.promises {
		if pr.recorder == nodeID {
			return pr
		}
	}
	return promised{}
}

// gather asks every node what it holds of volume id.
func (m *Migrator) gather(ctx context.Context, id string) (view, error) {
	answers, unreachable, err := cluster.Ask(ctx, m.cluster, getCopy(id))
	if err != nil {
		return view{}, err
	}
	return notBeingDeleted(id, m.viewOf(id, answers, unreachable))
}

// getCopy asks a node for its copy of volume id.
func getCopy(id string) func(context.Context, cluster.Agent) (agentclient.Copy, error) {
	return func(ctx context.Context, a cluster.Agent) (agentclient.Copy, error) { return a.GetCopy(ctx, id) }
}

// viewOf is the view of volume id the nodes' answers to GetCopy give.
func (m *Migrator) viewOf(id string, answers []cluster.Answer[agentclient.Copy], unreachable []cluster.Unreachable) view {
	var v view
	for _, u := range unreachable {
		v.unreachable = append(v.unreachable, u.Addr)
	}
	var answering []cluster.Node
	for _, a := range answers {
		answering = append(answering, a.Node)
	}
	v.members = cluster.Members(answering, len(unreachable))
	v.witnesses, v.witnessErr = cluster.Witnesses(answering)
	for _, a := range answers { // sorted by node ID
		if a.Err != nil {
			m.log.Warn("node cannot describe its copy", "volume_id", id, "node_id", a.Node.Info.NodeID, "error", a.Err)
			v.unreachable = append(v.unreachable, a.Node.Addr)
			continue
		}
		v.nodes = append(v.nodes, a.Node)
		if a.Object.Exists {
			v.copies = append(v.copies, copyOn{node: a.Node, copy: a.Object})
		}
		if g := a.Object.PromisedGeneration; g > 0 {
			v.promises = append(v.promises, promised{generation: g, holder: a.Object.PromisedHolder, recorder: a.Node.Info.NodeID})
		}
	}
	return v
}

// notBeingDeleted refuses a view of volume id in which a delete of it has
// reserved its generation (deletion): nothing is decided from it.
func notBeingDeleted(id string, v view) (view, error) {
	if pr, ok := v.deletion(); ok {
		return view{}, errdefs.Wrap(errdefs.ErrAborted, "volume %s is being deleted: a delete reserved its generation %d (node %s's record) and has not finished, so it is neither published, moved, failed over nor created; retry the delete",
			id, pr.generation, pr.recorder)
	}
	return v, nil
}

// deletion returns a promise to the volume's deletion, if a node answered
// one: the nodes that recorded it refuse every other reservation until the
// delete is done (provision.Delete), so any decision to promote or create
// would fail there anyway, and one that needs no reservation (a publish on
// the primary's node) would use a volume whose copies are going.
func (v view) deletion() (promised, bool) {
	for _, pr := range v.promises {
		if pr.holder == contract.DeletionHolder {
			return pr, true
		}
	}
	return promised{}, false
}

// primary is the primary copy of the highest generation.
func (v view) primary() (copyOn, bool) {
	var best copyOn
	found := false
	for _, c := range v.copies {
		if c.copy.Role == contract.RolePrimary && (!found || c.copy.Generation > best.copy.Generation) {
			best, found = c, true
		}
	}
	return best, found
}

// conflict names the nodes of two or more primaries sharing the highest
// generation, or nil. A generation is never given to two copies (I3 in
// docs/safety.md); when it happened anyway (a promotion that timed out at
// the controller but completed on its node, retried elsewhere), either
// copy may hold writes the other lacks, so neither is staged until an
// operator sets one aside.
func (v view) conflict() []string {
	p, ok := v.primary()
	if !ok {
		return nil
	}
	var nodes []string
	for _, c := range v.copies {
		if c.copy.Role == contract.RolePrimary && c.copy.Generation == p.copy.Generation {
			nodes = append(nodes, c.nodeID())
		}
	}
	if len(nodes) < 2 {
		return nil
	}
	return nodes
}

// conflictError reports a conflict (see conflict) in the log, the metrics
// and the error, which names what the operator must do.
func (m *Migrator) conflictError(id string, v view, nodes []string) error {
	p, _ := v.primary()
	m.Metrics.count("conflict", "refused")
	m.log.Error("two primaries of one generation: neither is staged until an operator sets one aside",
		"volume_id", id, "generation", p.copy.Generation, "nodes", strings.Join(nodes, ","))
	return errdefs.Wrap(errdefs.ErrFailedPrecondition,
		"volume %s has primaries of the same generation %d on nodes %s: either may hold writes the other lacks, so neither is used; "+
			"an operator must compare them and set one aside (zfs-controller status shows them)",
		id, p.copy.Generation, strings.Join(nodes, ", "))
}

// freshestReplica is the replica of the highest generation and, among
// those, the freshest (fresherWithin). Generation first: a replica
// labelled by a newer primary descends from it, whatever the clocks say.
func (v view) freshestReplica(onNode string) (copyOn, bool) {
	var best copyOn
	found := false
	for _, c := range v.copies {
		if c.copy.Role != contract.RoleReplica || (onNode != "" && c.nodeID() != onNode) || v.unpromised(c) {
			continue
		}
		newer := c.copy.Generation > best.copy.Generation ||
			c.copy.Generation == best.copy.Generation && fresherWithin(c, best)
		if !found || newer {
			best, found = c, true
		}
	}
	return best, found
}

// unpromised reports whether copy c carries a generation above 1 that no
// answering node promised, in a view of a majority: no primary was ever
// promoted to it, since every generation was promised by a majority
// first, which shares a node with this one, and records only grow
// (docs/safety.md, "Generations"). Such a replica came from a peer's
// header alone (docs/safety.md, "What a peer's header may decide"), and
// is never the one a failover promotes: a planted replica of a high
// generation would otherwise decide what data is recovered. Without a
// majority the view cannot tell, and nothing is promoted anyway.
func (v view) unpromised(c copyOn) bool {
	if !v.quorum() || c.copy.Generation <= 1 {
		return false
	}
	for _, p := range v.promises {
		if p.generation >= c.copy.Generation {
			return false
		}
	}
	return true
}

// failoverReplica is the replica a failover promotes for a publish on
// target: the freshest, or target's own when it is as fresh, which saves
// the move that would follow (and the setting aside of target's replica
// that a move after a failover brings: the new primary's history starts
// at its failover, so it cannot vouch for an older replica).
func (v view) failoverReplica(target string) (copyOn, bool) {
	best, ok := v.freshestReplica("")
	if !ok || best.nodeID() == target {
		return best, ok
	}
	own, ok := v.freshestReplica(target)
	if ok && own.copy.Generation == best.copy.Generation && !fresherWithin(best, own) {
		return own, true
	}
	return best, true
}

// fresherWithin orders two replicas of one generation, whose snapshots
// all came from that generation's one primary. By lineage first: the
// replica holding the other's newest snapshot and more after it is
// fresher, whatever any clock says. Only when neither holds the other's
// newest (their retained snapshots do not overlap) do the times in the
// names decide: that one primary's clock, which could have stepped back.
func fresherWithin(a, b copyOn) bool {
	ag, bg := a.copy.SnapshotGUIDs, b.copy.SnapshotGUIDs
	if len(ag) > 0 && len(bg) > 0 {
		an, bn := ag[len(ag)-1], bg[len(bg)-1]
		switch {
		case an == bn:
			return false
		case slices.Contains(ag, bn):
			return true
		case slices.Contains(bg, an):
			return false
		}
	}
	return a.copy.LastSnapshotUnixNano > b.copy.LastSnapshotUnixNano
}

func (v view) maxGeneration() uint64 {
	var g uint64
	for _, c := range v.copies {
		g = max(g, c.copy.Generation)
	}
	return g
}

func (v view) node(id string) (cluster.Node, bool) {
	for _, n := range v.nodes {
		if n.Info.NodeID == id {
			return n, true
		}
	}
	return cluster.Node{}, false
}
