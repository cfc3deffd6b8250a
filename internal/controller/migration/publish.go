package migration

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

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
