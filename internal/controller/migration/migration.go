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
//
// The driver's words (generation, promise, reservation, fence, catch-up,
// final step, settle, ...) are defined in docs/glossary.md.
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
// volume apart: one decision acts on a volume's copies at a
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
		if !v.allAnswered() {
			return 0, answer, errdefs.Wrap(errdefs.ErrUnavailable, "node %s did not answer (not answering: %s); retry", nodeID, v.silent())
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
// meanwhile (publishStep's newerElsewhere saw to that, and a move's
// fence needs its target in the look), nor may be promoted later with a
// promise it still holds.
func (m *Migrator) publishOnPrimary(ctx context.Context, a *attempt, p copyOn, v view) (uint64, next, error) {
	m.arrived(a.id, a.nodeID)
	if p.copy.MovingTo == "" && !p.copy.LeaseFenced {
		return p.copy.Generation, answer, nil
	}
	if t := p.copy.MovingTo; t != "" {
		if _, answered := v.node(t); !answered {
			// A look without the move's target cannot tell whether it was
			// promoted: a promise that superseded the move's may have been
			// granted by the target after its promotion, and the records
			// then show no trace of the move's generation.
			return 0, answer, errdefs.Wrap(errdefs.ErrUnavailable, "the copy on node %s is fenced for a move to node %s, which did not answer: node %s may have been promoted, so the fence stays; retry once node %s answers",
				a.nodeID, t, t, t)
		}
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
	n, err := m.reserve(ctx, id, gen, p.nodeID(), v, grants{})
	if err != nil {
		err = fmt.Errorf("generation %d of volume %s is promised to node %s, whose promotion may still be under way; reserving generation %d for node %s to void it: %w",
			pr.generation, id, pr.holder, gen, p.nodeID(), err)
	}
	return n, err
}

// noQuorum is the error for a decision a view without a majority cannot
// make: a newer generation may live on the nodes that did not answer.
func (m *Migrator) noQuorum(id string, v view) error {
	return errdefs.Wrap(errdefs.ErrUnavailable, "only %d of the %d nodes answered (not answering: %s): a majority must answer to know volume %s's newest copy; retry, "+
		"or if those nodes are lost for good, an operator may promote a replica with zfs-controller promote -force",
		len(v.nodes), v.total(), v.silent(), id)
}

// grants says whose grants a reservation needs besides a majority's
// and its holder's.
type grants struct {
	// everyAnswering: every node that answered must grant, not a
	// majority (the operator's forced promotion, without a majority).
	everyAnswering bool
	// failover: every node attests the silence of those that did not
	// answer, and of any node its lease knows that is not among those that
	// did (agentclient.Reservation); every node that answered the look
	// must grant it, and a node that holds a primary of the volume
	// refuses it.
	failover bool
	// operator marks the operator's promotion: a node that keeps no lease
	// (no peers) grants its failover on the operator's word, and refuses
	// the controller's automatic one.
	operator bool
	// also names a node whose grant is needed too: a move's source, whose
	// own record must promise the target's generation before it is fenced,
	// so that the source's node refuses to lift that fence for any
	// controller instance that has not superseded the promise.
	also string
}

// reserve has a majority of the nodes promise generation gen of the
// volume to holder's copy before it is promoted with it: no other copy
// can then ever get gen (docs/safety.md, "Generations"). Granted, the
// caller goes on; refused because a newer generation exists or another
// promotion raced this one, it looks again (lookAgain, with an error
// that says who refused); anything else answers. g says whose grants it
// needs besides (grants).
func (m *Migrator) reserve(ctx context.Context, id string, gen uint64, holder string, v view, g grants) (next, error) {
	type reply struct {
		node string
		resp agentclient.Promise
		err  error
	}
	r := agentclient.Reservation{VolumeID: id, Generation: gen, HolderNodeID: holder, Operator: g.operator, Failover: g.failover}
	if g.failover {
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
	granted, holderGranted, alsoGranted, waiting, holdsPrimary := 0, false, g.also == "", false, false
	var refusals []string
	for range v.nodes {
		a := <-answers
		switch {
		case a.err != nil:
			refusals = append(refusals, fmt.Sprintf("node %s: %v", a.node, a.err))
			waiting = waiting || (g.failover && errors.Is(a.err, errdefs.ErrUnavailable))
			// A node refuses a failover's reservation with
			// FailedPrecondition while it holds a primary of the volume
			// (volume.Manager.ReserveForFailover).
			holdsPrimary = holdsPrimary || (g.failover && errors.Is(a.err, errdefs.ErrFailedPrecondition))
		case a.resp.Granted:
			granted++
			holderGranted = holderGranted || a.node == holder
			alsoGranted = alsoGranted || a.node == g.also
		default:
			refusals = append(refusals, fmt.Sprintf("node %s promised generation %d to node %s", a.node, a.resp.PromisedGeneration, a.resp.PromisedHolder))
		}
	}
	enough := granted > total/2
	switch {
	case g.everyAnswering:
		enough = granted == len(v.nodes)
	case g.failover:
		// Every node of the look must grant too: one whose answer is
		// missing may have refused because it holds the primary now (a
		// move promoted it after the look read it), and its refusal is
		// what stops a failover on a torn look.
		enough = enough && granted == len(v.nodes)
	}
	if enough && holderGranted && alsoGranted {
		return goOn, nil
	}
	if holdsPrimary {
		// The look was torn: a node it read as holding no primary was
		// promoted since (a move's final step). Its refusal already kept
		// the grants short of every node of the look; look again rather
		// than wait.
		m.log.Warn("no failover: a node holds the primary since the look; looking again", "volume_id", id, "generation", gen, "holder", holder,
			"refusals", strings.Join(refusals, "; "))
		return lookAgain, errdefs.Wrap(errdefs.ErrAborted, "generation %d of volume %s for node %s: a node holds the volume's primary (%s)",
			gen, id, holder, strings.Join(refusals, "; "))
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
