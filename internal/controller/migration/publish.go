package migration

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
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
// background (runner.go), if one runs: a delete or an expansion of the
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
	// seen is a look its caller took just before the first step (a move
	// job's final step checks the copies first), which that step acts on
	// instead of asking every node again.
	seen *view
	log  hclog.Logger
}

// look is the view a's step acts on: the one a's caller took just before
// the first step, or a fresh look at every node.
func (m *Migrator) look(ctx context.Context, a *attempt) (view, error) {
	if v := a.seen; v != nil {
		a.seen = nil
		return *v, nil
	}
	return m.gather(ctx, a.id)
}

func (m *Migrator) newAttempt(id, nodeID string, inBackground bool) *attempt {
	return &attempt{id: id, nodeID: nodeID, inBackground: inBackground, log: m.log.With("volume_id", id, "node_id", nodeID)}
}

// runs is the publish's refusal while the move job j runs.
func (a *attempt) runs(j *moveJob, now time.Time) error {
	a.running = j
	return j.refusal(now)
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
	if j, running := m.jobs.runningTo(a.id, a.nodeID); running {
		unlock()
		return nil, a.runs(j, m.now())
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
	v, err := m.look(ctx, a)
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
	if v.witnessErr != nil {
		return v.witnessErr
	}
	if !v.witnesses.Empty() {
		return errdefs.Wrap(errdefs.ErrUnavailable, "only %d of the %d witnesses (%s) answered (not answering: %s): a majority of them must answer to know volume %s's newest copy; retry, "+
			"or if they are lost for good, an operator may promote a replica with zfs-controller promote -force",
			v.answeringVoters(), v.voters(), v.witnesses, v.silent(), id)
	}
	return errdefs.Wrap(errdefs.ErrUnavailable, "only %d of the %d nodes answered (not answering: %s): a majority must answer to know volume %s's newest copy; retry, "+
		"or if those nodes are lost for good, an operator may promote a replica with zfs-controller promote -force",
		len(v.nodes), v.total(), v.silent(), id)
}

// A publish hands a move to a job (docs/migration.md, "Catch-up"). Nomad
// sends a plugin's controller calls one at a time across the whole
// cluster and gives each about two minutes: a move that streamed the
// whole volume inside ControllerPublishVolume would hold every other
// volume's calls behind it, and fail when the transfer needs longer.
// So when the target holds no fresh replica, the publish starts a push
// of the primary to it in the background (an ordinary push: the primary
// stays where it is, writable and unfenced; the target gets a replica)
// and answers FailedPrecondition, which Nomad's claim retries with
// backoff. The retry that finds the catch-up done goes on to the move's
// final step, which sends only what changed since. A catch-up is no
// change of ownership: it keeps every invariant a scheduled push keeps.
//
// The final step runs in the background too, right after the catch-up
// (or at once, when the target is fresh), once the source is unpublished
// (Nomad unpublishes it before it publishes on the target): it is the
// publish Nomad would retry, run by the controller itself
// (runFinalStep), so a drain's final steps run side by side instead
// of one at a time inside Nomad's serialised calls, and the retry only
// finds the volume moved.

// checkMove says why the primary p may not move to target (a pinned
// volume, another replication domain), or nil.
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
// final step), answering a retryable error until the job ended; the job
// runs the final step through steps with inBackground set. The catch-up
// may run while the workload still writes on the source: it is a push
// like the schedule's, and the final step sends the rest.
func (m *Migrator) move(ctx context.Context, a *attempt, p copyOn, target cluster.Node, v view) (uint64, next, error) {
	if !a.inBackground {
		if n, err := m.handOff(ctx, a, p, target, v); n != goOn {
			return 0, n, err
		}
	}
	return m.finishMove(ctx, a, p, target, v)
}

// DefaultCatchUpFresh is how recent the target's replica must be for a
// move to skip the catch-up: its final step then sends what was written
// since, at most that much.
const DefaultCatchUpFresh = time.Minute

// DefaultMaxCatchUps bounds the catch-ups running from one source node:
// a drain of many volumes streams a few at a time, not all at once. A
// final step takes no place among them: it sends what was written since
// the target was caught up, or since a fresh target's snapshot (a
// minute's writes, or DefaultCatchUpFreshBytes), and counting it held a
// large volume's catch-up behind the final steps of small ones (a
// drain's 1 GiB volume waited over two minutes for them).
const DefaultMaxCatchUps = 4

// DefaultCatchUpWait is how long a publish waits for the background move it
// started before answering that it runs: a small volume's move ends
// within it on real disks, and the same call answers it moved. It is
// short: Nomad sends a plugin's controller calls one at a time, so every
// other volume's calls wait as long.
const DefaultCatchUpWait = time.Second

// handOff is what a foreground publish that would move p to target does
// about the volume's move job (job.go): goOn when the move goes on in
// this call (catch-ups are off, or the target is fresh and the source
// still published, which the move then answers). Otherwise it starts a
// job and waits CatchUpWait for it, or answers from the job it finds:
// its progress while it runs, and once it ended, by its outcome
// (answerEnded).
func (m *Migrator) handOff(ctx context.Context, a *attempt, p copyOn, target cluster.Node, v view) (next, error) {
	if m.CatchUpFresh < 0 {
		return goOn, nil // catch-ups off: the move sends everything itself
	}
	j := m.findJob(a.id, a.nodeID)
	if j != nil && j.movedAwaySince(p) {
		// The job moved the volume here, and it moved on since: its end
		// answers nothing now (a publish granted ahead of it never came
		// back for it), and looking again would find what v shows.
		m.forgetJob(j)
		j = nil
	}
	if j == nil {
		fresh := m.targetFresh(p, target, v)
		if fresh && p.copy.Mounted {
			return goOn, nil // the move says it is still published there
		}
		if fresh {
			return m.startMove(ctx, a, p, target, false, &v)
		}
		return m.startMove(ctx, a, p, target, true, nil)
	}
	// Only the call that starts a job waits for it: Nomad sends a
	// plugin's controller calls one at a time, so a retry that waited
	// for a running one would hold every other volume's calls that long.
	if !j.isDone() {
		return answer, a.runs(j, m.now())
	}
	return m.answerEnded(ctx, a, j, p, target)
}

// startMove starts a job moving p to target (from its catch-up, or from
// its final step) and waits CatchUpWait for it. seen, if given, is the
// look this publish just took, which a job starting at its final step
// acts on first.
func (m *Migrator) startMove(ctx context.Context, a *attempt, p copyOn, target cluster.Node, withCatchUp bool, seen *view) (next, error) {
	j := newMoveJob(p, target.Info.NodeID, withCatchUp, m.now())
	if !withCatchUp {
		j.seen = seen
	}
	if err := m.jobs.add(j, m.maxCatchUps()); err != nil {
		return answer, err
	}
	if withCatchUp {
		a.log.Info("catching the move's target up in the background", "from_node", j.source)
	} else {
		a.log.Info("moving the volume in the background: its target is fresh", "from_node", j.source)
	}
	m.background.spawn(func() { m.runMove(j, p.node, target.Addr, withCatchUp, a.log) })
	if err := waitFor(ctx, j.done, cmp.Or(m.CatchUpWait, DefaultCatchUpWait)); err != nil {
		return answer, err
	}
	if !j.isDone() {
		return answer, a.runs(j, m.now())
	}
	return m.answerEnded(ctx, a, j, p, target)
}

// arrived forgets an ended move job of the volume to nodeID, which holds
// its primary now: the publish that finds it there answers from it.
func (m *Migrator) arrived(id, nodeID string) {
	if j := m.findJob(id, nodeID); j != nil && j.isDone() {
		m.forgetJob(j)
	}
}

// answerEnded is the publish's answer from the ended job j, which it
// forgets: moved, look again (and find the volume on the target); failed,
// refuse; with the source published now, go on (the move answers so);
// nothing to move, refuse (another final step started now would find the
// same until the call's deadline; the CO's retry looks afresh); caught
// up, start the final step.
func (m *Migrator) answerEnded(ctx context.Context, a *attempt, j *moveJob, p copyOn, target cluster.Node) (next, error) {
	m.forgetJob(j)
	outcome, err := j.result()
	switch {
	case outcome == moved:
		return lookAgain, nil
	case outcome == failed && permanent(err):
		return answer, fmt.Errorf("sending volume %s to node %s before the move: %w", a.id, a.nodeID, err)
	case outcome == failed:
		// Anything else (a node restarted, a stream broke, a push busy)
		// may pass: the retry starts another, which resumes what arrived.
		return answer, errdefs.Wrap(errdefs.ErrFailedPrecondition, "moving volume %s to node %s in the background failed: %v; a retry starts it again from where it stopped",
			a.id, a.nodeID, err)
	case p.copy.Mounted:
		return goOn, nil
	case outcome == nothingToMove:
		return answer, errdefs.Wrap(errdefs.ErrFailedPrecondition, "volume %s did not move to node %s: its final step found it published again on node %s, or no longer its primary there; retry once it is unpublished there",
			a.id, a.nodeID, j.source)
	}
	return m.startMove(ctx, a, p, target, false, nil) // caught up
}

// waitFor waits until done is closed or wait has passed, whichever is
// first; only ctx's end is an error.
func waitFor(ctx context.Context, done <-chan struct{}, wait time.Duration) error {
	if wait <= 0 {
		return nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// DefaultCatchUpFreshBytes is how much may have been written to an
// unpublished primary since the snapshot the target's replica holds for
// the move to skip the catch-up: a final step that sends that much ends
// within seconds, so a catch-up first would only add a round.
const DefaultCatchUpFreshBytes = 64 << 20

// targetFresh reports whether target holds a replica of p's generation,
// with no receive left to resume, that a final step brings up to date
// at once: its newest snapshot is younger than CatchUpFresh, or at most
// DefaultCatchUpFreshBytes were written to the unpublished primary
// since it. The second is what an idle volume's replica is between
// scheduled pushes. A published primary is judged by age alone: what
// its workload writes until it is unpublished is not known.
func (m *Migrator) targetFresh(p copyOn, target cluster.Node, v view) bool {
	for _, c := range v.copies {
		if c.nodeID() != target.Info.NodeID {
			continue
		}
		if c.copy.Role != contract.RoleReplica || c.copy.Generation != p.copy.Generation || c.copy.Resumable || c.copy.LastSnapshotUnixNano == 0 {
			return false
		}
		age := m.now().Sub(time.Unix(0, c.copy.LastSnapshotUnixNano))
		return age < m.catchUpFresh() || smallIncrement(p.copy, c.copy)
	}
	return false
}

// smallIncrement tells whether at most DefaultCatchUpFreshBytes were
// written to the unpublished primary since the newest snapshot replica
// holds, as the primary's node reads it.
func smallIncrement(primary, replica agentclient.Copy) bool {
	written, known := primary.WrittenSince[replica.LastSnapshot]
	return !primary.Mounted && known && written <= DefaultCatchUpFreshBytes
}

func (m *Migrator) catchUpFresh() time.Duration {
	if m.CatchUpFresh == 0 {
		return DefaultCatchUpFresh
	}
	return m.CatchUpFresh
}

func (m *Migrator) maxCatchUps() int {
	if m.MaxCatchUps <= 0 {
		return DefaultMaxCatchUps
	}
	return m.MaxCatchUps
}
