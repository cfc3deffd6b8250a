// Package migration moves a volume's primary between nodes for the
// controller: a planned move when the CO publishes the volume on another
// node, failover when the primary's node is lost, and fencing of a stale
// primary that comes back (docs/migration.md).
//
// It keeps no state. Every decision starts from what the nodes report about
// their copies (role, generation, fence, newest snapshot), and every step
// on a node is idempotent, so a move interrupted anywhere is finished by
// the next attempt. The invariant: the primary is the copy of the highest
// generation; a promotion raises the generation before the old copy is
// demoted, so there is never a moment without a primary, and an older
// primary is never mounted again.
package migration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/keylock"
)

// Migrator runs moves and failovers.
type Migrator struct {
	// Metrics, when set, counts moves and failovers.
	Metrics *Metrics

	// CatchUpFresh: a move whose target holds a replica younger than
	// this goes straight to its final step; any other first catches the
	// target up in the background (catchup.go). Zero means
	// DefaultCatchUpFresh; negative turns catch-ups off (the publish then
	// sends everything itself, however long that takes).
	CatchUpFresh time.Duration
	// MaxCatchUps bounds the catch-ups running from one source node
	// (zero: DefaultMaxCatchUps).
	MaxCatchUps int
	// StallTimeout cancels a catch-up that moved no data for that long
	// (zero: cluster.DefaultStallTimeout).
	StallTimeout time.Duration
	// PublishAheadWithin lets PublishAhead grant a publish while the
	// volume's background move to the node is estimated to end within
	// it (zero: never; see PublishAhead).
	PublishAheadWithin time.Duration
	// CatchUpWait is how long the publish that starts a background move
	// waits for it to end before answering that it runs (zero:
	// DefaultCatchUpWait).
	CatchUpWait time.Duration

	// publishing serialises the foreground publishes of each volume
	// (see publish for the rule it keeps with the background moves).
	publishing keylock.Locks

	cluster         *cluster.Cluster
	log             hclog.Logger
	now             func() time.Time
	jobs            moveJobs
	aheadRetryPause time.Duration // zero: aheadRetryPause
	background      lifecycle     // the moves and demotions that outlive their publish
}

// New returns a Migrator over the cluster's node agents.
func New(c *cluster.Cluster, log hclog.Logger) *Migrator {
	return &Migrator{cluster: c, log: log, now: time.Now}
}

// settle retires primaries older than the current one: a copy fenced for a
// move to the current primary's node becomes a replica; any other (a
// primary that was lost and came back) is set aside.
func (m *Migrator) settle(ctx context.Context, id string, v view) error {
	p, ok := v.primary()
	if !ok {
		return nil
	}
	if nodes := v.conflict(); nodes != nil {
		return m.conflictError(id, v, nodes)
	}
	var errs []error
	for _, c := range v.copies {
		if c.copy.Role != contract.RolePrimary || c.copy.Generation >= p.copy.Generation {
			continue
		}
		aside := c.copy.MovingTo != p.nodeID()
		cctx, cancel := m.call(ctx, v)
		_, err := c.node.Agent.Demote(cctx, agentclient.Demotion{VolumeID: id, Generation: p.copy.Generation, Aside: aside})
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("demoting the stale copy on node %s: %w", c.nodeID(), err))
			continue
		}
		if aside {
			m.Metrics.count("fenced", "ok")
			m.log.Warn("stale primary set aside after a failover", "volume_id", id, "node_id", c.nodeID(),
				"stale_generation", c.copy.Generation, "generation", p.copy.Generation)
		}
	}
	return errors.Join(errs...)
}

// Settle retires stale primaries of a volume; the scheduler calls it when
// two nodes report the volume as primary.
func (m *Migrator) Settle(ctx context.Context, id string) error {
	v, err := m.gather(ctx, id)
	if err != nil {
		return err
	}
	return m.settle(ctx, id, v)
}

// maxSteps bounds one Publish: a failover, a move and a retried push.
const maxSteps = 5

// Publish makes the volume's primary live on nodeID, moving or failing it
// over as needed, and returns its generation: the fencing token the node
// checks when staging.
func (m *Migrator) Publish(ctx context.Context, id, nodeID string) (uint64, error) {
	gen, _, err := m.publish(ctx, id, nodeID)
	return gen, err
}

// Publication is what a publish grants the node: the generation it must
// find when staging or, granted ahead of a move's end (After set), the
// generation its copy must be newer than once the move has promoted it.
type Publication struct {
	Generation, After uint64
}

// PublishAhead is Publish for a CO that stages the volume on the node
// next, as Nomad does. While the volume's background move to nodeID
// runs, its source unpublished, and is estimated to end within
// PublishAheadWithin, it grants the publish at once with the source's
// generation as After: the node's stage waits for its copy's promotion
// (docs/migration.md, "Publishing ahead of a move's end"). Otherwise it
// is Publish. Nomad retries a refused publish with a backoff that
// reaches a minute, so a move that ended just after a retry left the
// workload waiting up to a minute for the next; a stage that waits ends
// when the move does.
func (m *Migrator) PublishAhead(ctx context.Context, id, nodeID string) (Publication, error) {
	gen, running, err := m.publish(ctx, id, nodeID)
	if m.PublishAheadWithin > 0 && running != nil {
		if after, ok := running.aheadOf(m.now(), m.PublishAheadWithin); ok {
			running.grantedAhead(m.now())
			m.Metrics.publishedAhead()
			m.log.Info("published ahead of the move's end: the node stages the volume once its copy is promoted",
				"volume_id", id, "node_id", nodeID, "from_node", running.source, "after_generation", after)
			return Publication{After: after}, nil
		}
	}
	return Publication{Generation: gen}, err
}

// MoveRunning returns the target of the volume's move running in the
// background (catchup.go), if one runs: a delete or an expansion of the
// volume waits for it.
func (m *Migrator) MoveRunning(id string) (string, bool) { return m.jobs.running(id) }

// publish is a foreground publish: the CO's, or one on its behalf
// (finishAwaited). When its refusal is that the volume's move to nodeID
// runs in the background, running is that move's job.
//
// The rule that keeps a background move and the CO's publishes of its
// volume apart (issue 35): one decision acts on a volume's copies at a
// time. The foreground publishes of a volume hold its publishing lock,
// so they run one at a time; a move job of the volume is started only by
// one of them (startMove), and while it runs (catch-up or final step,
// until it ends) every foreground publish of the volume answers from
// memory without acting: to the move's target its progress, to any
// other node (the source included) that the publish is decided once the
// move ends (movingElsewhere). A foreground publish that starts a job
// acts no more once it returns, or before that only once the job ended
// (startMove, answerEnded). So a job's final step never runs beside a
// foreground publish.
func (m *Migrator) publish(ctx context.Context, id, nodeID string) (gen uint64, running *moveJob, err error) {
	a := m.newAttempt(id, nodeID, false)
	unlock, err := m.enterForeground(a)
	if err != nil {
		return 0, a.running, err
	}
	defer unlock()
	gen, err = m.steps(ctx, a)
	return gen, a.running, err
}

// steps looks at the volume's copies and acts on what it sees, and looks
// again after each change, up to maxSteps times: the steps of a
// foreground publish, and of a move job's final step (runFinalStep).
func (m *Migrator) steps(ctx context.Context, a *attempt) (uint64, error) {
	var refused error
	for range maxSteps {
		gen, n, err := m.publishStep(ctx, a)
		if n == answer {
			return gen, err
		}
		refused = err // what made the step look again, if anything
	}
	if refused != nil {
		return 0, errdefs.Wrap(errdefs.ErrAborted, "volume %s did not settle on node %s in %d steps (the last: %v); retry", a.id, a.nodeID, maxSteps, refused)
	}
	return 0, errdefs.Wrap(errdefs.ErrAborted, "volume %s did not settle on node %s in %d steps; retry", a.id, a.nodeID, maxSteps)
}

// next is where a publish goes after one of its steps.
type next int

const (
	// answer: the step's generation, or its error, answers the publish.
	answer next = iota
	// lookAgain: the step changed the copies, or a reservation lost to
	// another (its error says how): the publish looks at them again.
	lookAgain
	// goOn: what the step checked stands not in the way (a reservation
	// granted, no move job to wait for): it acts in this call.
	goOn
)

// attempt is one publish of a volume to a node, over its steps.
type attempt struct {
	id, nodeID   string
	inBackground bool // the final step of a move job
	superseded   bool // a promise was superseded before lifting a fence (supersede)
	// running is the volume's move job to nodeID whose progress refused
	// the publish (runs).
	running *moveJob
	log     hclog.Logger
}

func (m *Migrator) newAttempt(id, nodeID string, inBackground bool) *attempt {
	return &attempt{id: id, nodeID: nodeID, inBackground: inBackground, log: m.log.With("volume_id", id, "node_id", nodeID)}
}

// runs is the publish's refusal while the move job c runs.
func (a *attempt) runs(c *moveJob, now time.Time) error {
	a.running = c
	return c.refusal(now)
}

// enterForeground takes the volume's publishing lock for a foreground
// publish, or refuses it: another publish of the volume holds it
// (Aborted), or the volume's move runs in the background. A retry while
// the move to this node runs answers from memory, without asking the
// nodes: Nomad's serialised calls wait for every answer, and the nodes
// are busy with the moves.
func (m *Migrator) enterForeground(a *attempt) (unlock func(), err error) {
	unlock, ok := m.publishing.TryLock(a.id)
	if !ok {
		return nil, errdefs.Wrap(errdefs.ErrAborted, "another publish of volume %s is in progress; retry", a.id)
	}
	if c, running := m.jobs.runningTo(a.id, a.nodeID); running {
		unlock()
		return nil, a.runs(c, m.now())
	}
	if err := m.jobs.movingElsewhere(a.id, a.nodeID); err != nil {
		a.log.Info("publish refused: the volume's move to another node runs in the background", "error", err)
		unlock()
		return nil, err
	}
	return unlock, nil
}

// publishStep looks at the volume's copies once and acts on what it
// sees: it answers (a generation, or an error), or it changed something,
// or lost a race to another change, and the next step looks again.
func (m *Migrator) publishStep(ctx context.Context, a *attempt) (uint64, next, error) {
	id, nodeID := a.id, a.nodeID
	v, err := m.gather(ctx, id)
	if err != nil {
		return 0, answer, err
	}
	v.background = a.inBackground
	target, ok := v.node(nodeID)
	if !ok {
		if len(v.unreachable) > 0 {
			return 0, answer, errdefs.Wrap(errdefs.ErrUnavailable, "node %s did not answer (unreachable agents: %s); retry", nodeID, strings.Join(v.unreachable, ", "))
		}
		return 0, answer, errdefs.Wrap(errdefs.ErrNotFound, "node %s is not a node of this driver", nodeID)
	}
	if nodes := v.conflict(); nodes != nil {
		return 0, answer, m.conflictError(id, v, nodes)
	}
	if !v.quorum() && !v.forcedOn(nodeID) {
		return 0, answer, m.noQuorum(id, v)
	}
	if err := m.settle(ctx, id, v); err != nil {
		a.log.Warn("stale copies remain; retrying later", "error", err)
	}
	p, ok := v.primary()
	if !ok {
		promoted, n, err := m.failover(ctx, id, v, nodeID, a.log)
		switch {
		case n != goOn:
			return 0, n, err
		case promoted.NodeID == nodeID:
			return promoted.Generation, answer, nil
		}
		return 0, lookAgain, nil // and move it on to the target
	}
	if pr, newer := v.newerElsewhere(p); newer {
		return 0, answer, errdefs.Wrap(errdefs.ErrUnavailable, "generation %d of volume %s was promised to node %s, which did not answer: the copy on node %s (generation %d) may be stale, so it is not published; retry once node %s answers",
			pr.generation, id, pr.holder, p.nodeID(), p.copy.Generation, pr.holder)
	}
	if p.nodeID() == nodeID {
		return m.publishOnPrimary(ctx, a, p, v)
	}
	if err := m.checkMove(p, target); err != nil {
		return 0, answer, err
	}
	return m.move(ctx, a, p, target, v)
}

// publishOnPrimary publishes the volume on the node of its primary,
// lifting the copy's fence (a move's or a lost lease's) if it has one.
// A fence is lifted only when no other node may have been promoted
// meanwhile (publishStep's newerElsewhere saw to that), nor may be
// promoted later with a promise it still holds.
func (m *Migrator) publishOnPrimary(ctx context.Context, a *attempt, p copyOn, v view) (uint64, next, error) {
	m.arrived(a.id, a.nodeID)
	if p.copy.MovingTo == "" && !p.copy.LeaseFenced {
		return p.copy.Generation, answer, nil
	}
	if pr, away := v.promisedAway(p); away {
		if a.superseded {
			return 0, answer, errdefs.Wrap(errdefs.ErrUnavailable, "node %s still holds the promise of generation %d of volume %s (it did not grant the newer one reserved for node %s): its promotion may be under way, so the copy on node %s stays fenced; retry",
				pr.holder, pr.generation, a.id, a.nodeID, a.nodeID)
		}
		a.superseded = true
		n, err := m.supersede(ctx, a.id, p, pr, v, a.log)
		if n == answer {
			return 0, answer, err
		}
		return 0, lookAgain, err // the promise is void now, or its holder was promoted
	}
	if err := m.unfence(ctx, a.id, p, a.log); err != nil {
		return 0, answer, err
	}
	return p.copy.Generation, answer, nil
}

// Current returns the node of the volume's current primary, decided as a
// publish decides it: from a majority of the nodes (or the operator's
// forced copy), with no newer generation promised to a node that did not
// answer, and no two primaries of one generation. Operations that act on
// the primary without moving it (expansion) and reports of it use it, so
// that none of them takes a stale copy for the volume (docs/safety.md,
// G8).
func (m *Migrator) Current(ctx context.Context, id string) (cluster.Node, agentclient.Copy, error) {
	v, err := m.gather(ctx, id)
	if err != nil {
		return cluster.Node{}, agentclient.Copy{}, err
	}
	if nodes := v.conflict(); nodes != nil {
		return cluster.Node{}, agentclient.Copy{}, m.conflictError(id, v, nodes)
	}
	p, ok := v.primary()
	if !v.quorum() && !(ok && v.forcedOn(p.nodeID())) {
		return cluster.Node{}, agentclient.Copy{}, m.noQuorum(id, v)
	}
	if !ok {
		if _, maybe := v.newerElsewhere(copyOn{}); len(v.copies) == 0 && !maybe {
			return cluster.Node{}, agentclient.Copy{}, errdefs.Wrap(errdefs.ErrNotFound, "volume %s does not exist", id)
		}
		return cluster.Node{}, agentclient.Copy{}, errdefs.Wrap(errdefs.ErrUnavailable, "no node that answered holds volume %s's primary (not answering: %s): its node is down; a publish fails over by the volume's policy, or retry once it answers",
			id, strings.Join(v.unreachable, ", "))
	}
	if pr, newer := v.newerElsewhere(p); newer {
		return cluster.Node{}, agentclient.Copy{}, errdefs.Wrap(errdefs.ErrUnavailable, "generation %d of volume %s was promised to node %s, which did not answer: the copy on node %s (generation %d) may be stale; retry once node %s answers",
			pr.generation, id, pr.holder, p.nodeID(), p.copy.Generation, pr.holder)
	}
	return p.node, p.copy, nil
}

// supersede voids the promise pr, above p's generation and held by a
// node that may still be promoted with it (promisedAway), before p's
// fence is lifted: it reserves a newer generation for p's node on a
// majority. Once the holder grants it, the holder's record promises it
// to p's node, and its promotion with pr, which checks that record under
// the record's lock, is refused for good; if the holder was promoted
// first, the caller's next look finds it the primary and the volume moves
// from there. Either way no two primaries.
func (m *Migrator) supersede(ctx context.Context, id string, p copyOn, pr promised, v view, log hclog.Logger) (next, error) {
	gen := v.nextGeneration(p.nodeID())
	log.Info("superseding a promise to another node before lifting the fence: its holder may still be promoted with it",
		"promised_generation", pr.generation, "holder", pr.holder, "generation", gen)
	n, err := m.reserve(ctx, id, gen, p.nodeID(), v, false, false, false)
	if err != nil {
		err = fmt.Errorf("generation %d of volume %s is promised to node %s, whose promotion may still be under way; reserving generation %d for node %s to void it: %w",
			pr.generation, id, pr.holder, gen, p.nodeID(), err)
	}
	return n, err
}

// noQuorum is the error for a decision a view without a majority cannot
// make: a newer generation may live on the nodes that did not answer.
func (m *Migrator) noQuorum(id string, v view) error {
	return errdefs.Wrap(errdefs.ErrUnavailable, "only %d of the %d nodes answered (not answering: %s%s): a majority must answer to know volume %s's newest copy; retry, "+
		"or if those nodes are lost for good, an operator may promote a replica with zfs-controller promote -force",
		len(v.nodes), v.total(), strings.Join(v.unreachable, ", "), v.unlisted(), id)
}

// reserve has a majority of the nodes promise generation gen of the
// volume to holder's copy before it is promoted with it: no other copy
// can then ever get gen (docs/safety.md, "Generations"). Granted, the
// caller goes on; refused because a newer generation exists or another
// promotion raced this one, it looks again (lookAgain, with an error
// that says who refused); anything else answers. With everyAnswering (the operator's
// forced promotion, without a majority) every node that answered must
// grant it instead. A failover's reservation (failover) has every node
// attest the silence of those that did not answer, and of any node its
// lease knows that is not among those that did (agentclient.Reservation).
// operator marks the operator's promotion: a node that keeps no lease
// (no peers) grants its failover on the operator's word, and refuses the
// controller's automatic one.
func (m *Migrator) reserve(ctx context.Context, id string, gen uint64, holder string, v view, everyAnswering, failover, operator bool) (next, error) {
	type reply struct {
		node string
		resp agentclient.Promise
		err  error
	}
	r := agentclient.Reservation{VolumeID: id, Generation: gen, HolderNodeID: holder, Operator: operator, Failover: failover}
	if failover {
		r.FailoverFrom = v.unreachable
		for _, n := range v.nodes {
			r.Answering = append(r.Answering, n.Info.NodeID)
		}
	}
	answers := make(chan reply, len(v.nodes))
	for _, n := range v.nodes {
		go func() {
			cctx, cancel := m.call(ctx, v)
			defer cancel()
			resp, err := n.Agent.Reserve(cctx, r)
			answers <- reply{n.Info.NodeID, resp, err}
		}()
	}
	total := v.total()
	granted, holderGranted, waiting := 0, false, false
	var refusals []string
	for range v.nodes {
		a := <-answers
		switch {
		case a.err != nil:
			refusals = append(refusals, fmt.Sprintf("node %s: %v", a.node, a.err))
			waiting = waiting || (failover && errors.Is(a.err, errdefs.ErrUnavailable))
		case a.resp.Granted:
			granted++
			holderGranted = holderGranted || a.node == holder
		default:
			refusals = append(refusals, fmt.Sprintf("node %s promised generation %d to node %s", a.node, a.resp.PromisedGeneration, a.resp.PromisedHolder))
		}
	}
	enough := granted > total/2
	if everyAnswering {
		enough = granted == len(v.nodes)
	}
	if enough && holderGranted {
		return goOn, nil
	}
	if waiting {
		// Nodes that keep leases wait for the silent ones' to run out:
		// looking again at once changes nothing; the CO's retry comes
		// later.
		m.log.Warn("generation not reserved: nodes wait for the silent ones' leases to run out", "volume_id", id, "generation", gen, "holder", holder,
			"granted", granted, "nodes", total, "refusals", strings.Join(refusals, "; "))
		return answer, errdefs.Wrap(errdefs.ErrUnavailable, "generation %d of volume %s for node %s: %d of %d nodes granted it (%s); retry",
			gen, id, holder, granted, total, strings.Join(refusals, "; "))
	}
	m.log.Warn("generation not reserved; looking again", "volume_id", id, "generation", gen, "holder", holder,
		"granted", granted, "nodes", total, "refusals", strings.Join(refusals, "; "))
	return lookAgain, errdefs.Wrap(errdefs.ErrAborted, "generation %d of volume %s for node %s: %d of %d nodes granted it (%s)",
		gen, id, holder, granted, total, strings.Join(refusals, "; "))
}

func (m *Migrator) checkMove(p copyOn, target cluster.Node) error {
	id := p.copy.VolumeID
	if contract.Pinned(p.copy.Parameters) {
		return errdefs.Wrap(errdefs.ErrFailedPrecondition, "volume %s is pinned to node %s (parameter pinned=true); it cannot be published on node %s", id, p.nodeID(), target.Info.NodeID)
	}
	from, to := p.node.Info.Topology[config.TopologyDomainKey], target.Info.Topology[config.TopologyDomainKey]
	if from != to {
		return errdefs.Wrap(errdefs.ErrFailedPrecondition, "volume %s lives in replication domain %q; node %s is in %q", id, from, target.Info.NodeID, to)
	}
	return nil
}

// move is the planned move of p to target. A foreground publish hands it
// to a move job (handOff: a catch-up unless the target is fresh, then the
// final step, which the job runs through steps with inBackground set),
// answering a retryable error until the job ended. The final step: fence
// and send the final snapshot (one call: the source fences under the same
// lock hold as the snapshot), promote the target, demote the source.
func (m *Migrator) move(ctx context.Context, a *attempt, p copyOn, target cluster.Node, v view) (uint64, next, error) {
	// The catch-up may run while the workload still writes on the source:
	// it is a push like the schedule's, and the final step sends the rest.
	if !a.inBackground {
		if n, err := m.handOff(ctx, a, p, target, v); n != goOn {
			return 0, n, err
		}
	}
	id := a.id
	if p.copy.Mounted {
		return 0, answer, errdefs.Wrap(errdefs.ErrFailedPrecondition, "volume %s is still published on node %s; it moves to node %s once it is unpublished there", id, p.nodeID(), target.Info.NodeID)
	}
	started := m.now()
	gen := v.nextGeneration(target.Info.NodeID)
	log := a.log.With("from_node", p.nodeID(), "generation", gen)
	log.Info("moving volume")
	// The reservation runs beside the fence and the final send, off the
	// move's critical path; the promotion waits for it.
	type reservation struct {
		n   next
		err error
	}
	reserved := make(chan reservation, 1)
	go func() {
		n, err := m.reserve(ctx, id, gen, target.Info.NodeID, v, false, false, false)
		reserved <- reservation{n, err}
	}()
	fencedAt, err := m.sendFinal(ctx, id, p, target, v, log)
	if err != nil {
		m.Metrics.count("move", "failed")
		return 0, answer, err
	}
	if r := <-reserved; r.n != goOn {
		return 0, r.n, r.err
	}
	err = m.promoteTarget(ctx, target, agentclient.Promotion{VolumeID: id, Generation: gen, NotBeforeUnixNano: fencedAt}, v)
	if err != nil {
		m.Metrics.count("move", "failed")
		return 0, answer, fmt.Errorf("promoting the copy on node %s: %w", target.Info.NodeID, err)
	}
	// The target is the primary now and the source a fenced, read-only copy
	// of an older generation: the workload need not wait for its demotion.
	// If it fails, the next publish or schedule round settles it. A move
	// job demotes before it ends, so the publish's retry finds the volume
	// settled.
	if a.inBackground {
		m.demote(id, p, gen, log)
	} else {
		m.background.spawn(func() { m.demote(id, p, gen, log) })
	}
	m.Metrics.count("move", "ok")
	m.Metrics.observeMove(m.now().Sub(started))
	log.Info("volume moved", "seconds", m.now().Sub(started).Seconds())
	return gen, answer, nil
}

// promoteTarget promotes the move's target, asking again while the
// target's copy is busy (Aborted: the tidy after the final receive still
// holds it, which took over ten seconds on a node busy with a drain's
// other moves): the source is fenced by now, and giving up would leave
// the move to do again after the CO's backoff.
func (m *Migrator) promoteTarget(ctx context.Context, target cluster.Node, p agentclient.Promotion, v view) error {
	for busy := 0; ; busy++ {
		cctx, cancel := m.call(ctx, v)
		_, err := target.Agent.Promote(cctx, p)
		cancel()
		if !errors.Is(err, errdefs.ErrAborted) || busy >= maxBusyPromotions {
			return err
		}
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
	}
}

// maxBusyPromotions bounds the times a move asks a busy target again.
const maxBusyPromotions = 10

// demoteTimeout bounds the demotion that follows a move.
const demoteTimeout = time.Minute

func (m *Migrator) demote(id string, p copyOn, gen uint64, log hclog.Logger) {
	ctx, cancel := context.WithTimeout(m.background.context(), demoteTimeout)
	defer cancel()
	if _, err := p.node.Agent.Demote(ctx, agentclient.Demotion{VolumeID: id, Generation: gen}); err != nil {
		log.Warn("the old primary is not demoted yet; it stays fenced and is settled later", "error", err)
	}
}

// sendFinal fences the primary for the move and pushes it to the target
// until the target holds a snapshot taken after the fence (a push may
// first finish an older, interrupted transfer); it returns the fence's
// time. Every push fences: the first one up keeps its time.
func (m *Migrator) sendFinal(ctx context.Context, id string, p copyOn, target cluster.Node, v view, log hclog.Logger) (int64, error) {
	busy := 0
	for attempt := 0; attempt < 3; attempt++ {
		last, err := p.node.Agent.MoveFinal(ctx, id, target.Addr, target.Info.NodeID)
		if errors.Is(err, errdefs.ErrAborted) && busy < maxBusyWaits {
			// A scheduled push of the volume holds it: it ends soon.
			busy++
			attempt--
			if err := sleep(ctx, time.Second); err != nil {
				return 0, err
			}
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("fencing volume %s on node %s and sending it to node %s: %w", id, p.nodeID(), target.Info.NodeID, err)
		}
		fencedAt := last.FencedAt
		if fencedAt == 0 {
			return 0, fmt.Errorf("%w: node %s pushed volume %s without fencing it (a zfs-node older than the controller?): upgrade zfs-node there, then retry",
				errdefs.ErrFailedPrecondition, p.nodeID(), id)
		}
		log.Info("final snapshot sent", "kind", last.Kind, "bytes", last.Bytes, "snapshot", last.Snapshot)
		if at, ok := contract.ReplicationSnapshotTime(last.Snapshot); ok && at >= fencedAt {
			return fencedAt, nil // the promotion checks it again on the target
		}
		cctx, cancel := m.call(ctx, v)
		c, err := target.Agent.GetCopy(cctx, id)
		cancel()
		if err != nil {
			return 0, err
		}
		if c.LastSnapshotUnixNano >= fencedAt {
			return fencedAt, nil
		}
	}
	return 0, errdefs.Wrap(errdefs.ErrAborted, "node %s has no snapshot of volume %s newer than its fence after 3 pushes; retry", target.Info.NodeID, id)
}

// maxBusyWaits bounds the seconds a move waits for other transfers of the
// volume to end.
const maxBusyWaits = 60

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (m *Migrator) unfence(ctx context.Context, id string, p copyOn, log hclog.Logger) error {
	cctx, cancel := m.cluster.Call(ctx)
	defer cancel()
	if _, err := p.node.Agent.Unfence(cctx, id, p.copy.Generation); err != nil {
		return fmt.Errorf("lifting the fence on node %s: %w", p.nodeID(), err)
	}
	if p.copy.MovingTo != "" {
		log.Info("move abandoned: the volume is published where it was")
	} else {
		log.Info("a majority shows the copy current: its lease's read-only lifted", "generation", p.copy.Generation)
	}
	return nil
}

// failover runs when no reachable node holds a primary: the volume's
// policy decides between promoting the freshest replica (target's, if it
// is as fresh) and waiting for an operator.
func (m *Migrator) failover(ctx context.Context, id string, v view, target string, log hclog.Logger) (agentclient.Copy, next, error) {
	r, ok := v.failoverReplica(target)
	if !ok {
		if len(v.unreachable) > 0 {
			return agentclient.Copy{}, answer, errdefs.Wrap(errdefs.ErrUnavailable, "no reachable node holds volume %s (unreachable agents: %s); retry", id, strings.Join(v.unreachable, ", "))
		}
		return agentclient.Copy{}, answer, errdefs.Wrap(errdefs.ErrNotFound, "volume %s does not exist", id)
	}
	lastAt := time.Unix(0, r.copy.LastSnapshotUnixNano)
	if contract.FailoverPolicy(r.copy.Parameters) != contract.FailoverAuto {
		return agentclient.Copy{}, answer, errdefs.Wrap(errdefs.ErrUnavailable, "the primary of volume %s is unreachable and its failover policy is manual: an operator promotes a replica with `zfs-controller promote -node %s %s` (the freshest, as of %s), or brings the primary's node back",
			id, r.nodeID(), id, lastAt.UTC().Format(time.RFC3339))
	}
	return m.promote(ctx, id, r, v, false, false, log)
}

// promote promotes the replica r by failover: goOn once promoted,
// lookAgain when its reservation lost to another (reserve). operator is
// the operator's promotion (Promote), forced the operator's promotion
// without a majority (promote -force): every node that answered must
// grant the generation, and the copy records it was forced.
func (m *Migrator) promote(ctx context.Context, id string, r copyOn, v view, operator, forced bool, log hclog.Logger) (agentclient.Copy, next, error) {
	withoutMajority := !v.quorum()
	if withoutMajority && !forced {
		return agentclient.Copy{}, answer, m.noQuorum(id, v)
	}
	gen := v.nextGeneration(r.nodeID())
	lastAt := time.Unix(0, r.copy.LastSnapshotUnixNano)
	// A failover waits until a majority of the nodes attest that the
	// silent ones, one of which may hold the primary, have been silent for
	// a lease and its margin (docs/safety.md, "Leases"); the operator's
	// forced promotion does not.
	if n, err := m.reserve(ctx, id, gen, r.nodeID(), v, withoutMajority, !withoutMajority, operator); n != goOn {
		return agentclient.Copy{}, n, err
	}
	if withoutMajority {
		log.Warn("promoting without a majority of the nodes, as the operator forced: the silent nodes must hold nothing newer",
			"not_answering", strings.Join(v.unreachable, ","), "generation", gen)
	}
	cctx, cancel := m.call(ctx, v)
	c, err := r.node.Agent.Promote(cctx, agentclient.Promotion{VolumeID: id, Generation: gen, Failover: true, Forced: withoutMajority})
	cancel()
	if err != nil {
		m.Metrics.count("failover", "failed")
		return agentclient.Copy{}, answer, fmt.Errorf("promoting the replica on node %s: %w", r.nodeID(), err)
	}
	rpo := m.now().Sub(lastAt)
	m.Metrics.count("failover", "ok")
	m.Metrics.recordRPO(id, rpo)
	log.Warn("failover: replica promoted; writes on the lost primary after its last replicated snapshot are lost",
		"promoted_node", r.nodeID(), "generation", gen, "last_snapshot", r.copy.LastSnapshot,
		"last_snapshot_time", lastAt.UTC().Format(time.RFC3339), "rpo_seconds", int64(rpo.Seconds()))
	return c, goOn, nil
}

// Promote is the operator's failover: it promotes the replica on nodeID
// (the freshest if empty) when no reachable node holds a primary. Without
// a majority of the nodes answering it refuses, unless forced: the
// operator then asserts that the silent nodes are lost for good, or hold
// nothing newer (docs/safety.md, "Generations").
func (m *Migrator) Promote(ctx context.Context, id, nodeID string, force bool) (agentclient.Copy, error) {
	if !contract.IsVolumeID(id) {
		return agentclient.Copy{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "%q is not a volume ID", id)
	}
	v, err := m.gather(ctx, id)
	if err != nil {
		return agentclient.Copy{}, err
	}
	if p, ok := v.primary(); ok {
		return agentclient.Copy{}, errdefs.Wrap(errdefs.ErrFailedPrecondition, "volume %s has a primary on node %s (generation %d); publishing it elsewhere moves it", id, p.nodeID(), p.copy.Generation)
	}
	r, ok := v.freshestReplica(nodeID)
	if !ok {
		return agentclient.Copy{}, errdefs.Wrap(errdefs.ErrNotFound, "no reachable node holds a replica of volume %s%s", id, map[bool]string{true: " on node " + nodeID}[nodeID != ""])
	}
	// A reservation lost to another promotion is the operator's to retry.
	c, _, err := m.promote(ctx, id, r, v, true, force, m.log.With("volume_id", id, "operator", true))
	return c, err
}
