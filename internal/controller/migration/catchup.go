package migration

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// A move's catch-up (docs/migration.md, "Catch-up"). Nomad
// sends a plugin's controller calls one at a time across the whole
// cluster and gives each about two minutes; a move that streamed the
// whole volume inside ControllerPublishVolume held every other volume's
// calls behind it, and failed outright when the transfer needed longer.
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

// DefaultCatchUpFresh is how recent the target's replica must be for a
// move to skip the catch-up: its final step then sends what was written
// since, at most that much.
const DefaultCatchUpFresh = time.Minute

// DefaultMaxCatchUps bounds the catch-ups running from one source node:
// a drain of many volumes streams a few at a time, not all at once. A
// final step takes no place among them: it sends what was written since
// the target was caught up, and counting it held a large volume's
// catch-up behind the final steps of small ones (a drain's 1 GiB volume
// waited over two minutes for them).
const DefaultMaxCatchUps = 4

// DefaultCatchUpWait is how long a publish waits for the background move it
// started before answering that it runs: a small volume's move ends
// within it on real disks, and the same call answers it moved. It is
// short: Nomad sends a plugin's controller calls one at a time, so every
// other volume's calls wait as long.
const DefaultCatchUpWait = time.Second

// finalStepTimeout bounds a final step run in the background.
const finalStepTimeout = 10 * time.Minute

// catchUpKeep is how long a finished catch-up waits for the publish that
// finishes its move; one older is forgotten (the CO gave up, or went
// elsewhere).
const catchUpKeep = 10 * time.Minute

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
	c, forgotten := m.jobs.find(a.id, a.nodeID, m.now())
	for _, f := range forgotten {
		m.Metrics.finalStepPending(f, false) // the CO gave up on it, or went elsewhere
	}
	if c == nil {
		fresh := m.targetFresh(p, target, v)
		if fresh && p.copy.Mounted {
			return goOn, nil // the move says it is still published there
		}
		return m.startMove(ctx, a, p, target, !fresh)
	}
	// Only the call that starts a job waits for it: Nomad sends a
	// plugin's controller calls one at a time, so a retry that waited
	// for a running one would hold every other volume's calls that long.
	if !c.isDone() {
		return answer, a.runs(c, m.now())
	}
	return m.answerEnded(ctx, a, c, p, target)
}

// startMove starts a job moving p to target (from its catch-up, or from
// its final step) and waits CatchUpWait for it.
func (m *Migrator) startMove(ctx context.Context, a *attempt, p copyOn, target cluster.Node, withCatchUp bool) (next, error) {
	c := newMoveJob(p, target.Info.NodeID, withCatchUp, m.now())
	if err := m.jobs.add(c, m.maxCatchUps()); err != nil {
		return answer, err
	}
	if withCatchUp {
		a.log.Info("catching the move's target up in the background", "from_node", c.source)
	} else {
		a.log.Info("moving the volume in the background: its target is fresh", "from_node", c.source)
	}
	m.background.spawn(func() { m.runMove(c, p.node, target.Addr, withCatchUp, a.log) })
	if err := waitFor(ctx, c.done, cmp.Or(m.CatchUpWait, DefaultCatchUpWait)); err != nil {
		return answer, err
	}
	if !c.isDone() {
		return answer, a.runs(c, m.now())
	}
	return m.answerEnded(ctx, a, c, p, target)
}

// arrived forgets an ended move job of the volume to nodeID, which holds
// its primary now: the publish that finds it there answers from it.
func (m *Migrator) arrived(id, nodeID string) {
	c, forgotten := m.jobs.find(id, nodeID, m.now())
	for _, f := range forgotten {
		m.Metrics.finalStepPending(f, false)
	}
	if c != nil && c.isDone() {
		m.jobs.remove(c)
		m.Metrics.finalStepPending(c, false)
	}
}

// answerEnded is the publish's answer from the ended job c, which it
// forgets: moved, look again (and find the volume on the target); failed,
// refuse; with the source published now, go on (the move answers so);
// nothing to move, refuse (another final step started now would find the
// same until the call's deadline; the CO's retry looks afresh); caught
// up, start the final step.
func (m *Migrator) answerEnded(ctx context.Context, a *attempt, c *moveJob, p copyOn, target cluster.Node) (next, error) {
	m.jobs.remove(c)
	m.Metrics.finalStepPending(c, false)
	outcome, err := c.result()
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
			a.id, a.nodeID, c.source)
	}
	return m.startMove(ctx, a, p, target, false) // caught up
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

// targetFresh reports whether target holds a replica of p's generation
// whose newest snapshot is younger than CatchUpFresh, with no receive
// left to resume.
func (m *Migrator) targetFresh(p copyOn, target cluster.Node, v view) bool {
	for _, c := range v.copies {
		if c.nodeID() != target.Info.NodeID {
			continue
		}
		age := m.now().Sub(time.Unix(0, c.copy.LastSnapshotUnixNano))
		return c.copy.Role == contract.RoleReplica && c.copy.Generation == p.copy.Generation && !c.copy.Resumable &&
			c.copy.LastSnapshotUnixNano > 0 && age < m.catchUpFresh()
	}
	return false
}

// runMove runs the job c to its end: it pushes the primary on source to
// the target unless the target is fresh (waiting while another push of
// the volume, the schedule's, holds it), then runs the final step if the
// source is unpublished. A job whose publish was granted ahead of its
// end gets no retry of the publish to start it again after a failure,
// so it tries again itself, up to maxAheadAttempts times.
func (m *Migrator) runMove(c *moveJob, source cluster.Node, targetAddr string, withCatchUp bool, log hclog.Logger) {
	var outcome moveOutcome
	var err error
	for attempt := 1; ; attempt++ {
		outcome, err = m.moveOnce(c, source, targetAddr, withCatchUp, log)
		if err == nil || !c.wasGrantedAhead() || attempt >= maxAheadAttempts || permanent(err) {
			break
		}
		log.Warn("moving the volume in the background failed after its publish was granted ahead; no publish retry will start it again, so the controller does",
			"from_node", c.source, "attempt", attempt, "error", err)
		if sleep(m.background.context(), cmp.Or(m.aheadRetryPause, aheadRetryPause)) != nil {
			break // the controller stops
		}
	}
	if outcome == caughtUp {
		// Before end: the publish that answers from it clears this.
		m.Metrics.finalStepPending(c, true)
	}
	c.end(outcome, err, m.now())
	seconds := m.now().Sub(c.started).Seconds()
	switch outcome {
	case failed:
		log.Warn("moving the volume in the background failed; the publish's retry starts it again", "from_node", c.source, "error", err, "seconds", seconds)
	case moved:
		log.Info("volume moved in the background; the publish's retry, or the node's stage of a publish granted ahead, finds it there", "from_node", c.source, "seconds", seconds)
	case caughtUp:
		log.Info("move's target caught up; the final step waits for the volume to be unpublished on its node", "from_node", c.source, "seconds", seconds)
	case nothingToMove:
		log.Info("the move's final step found nothing to move: the volume is published again on its node, or no longer its primary there; the publish's retry decides afresh", "from_node", c.source, "seconds", seconds)
	}
}

// moveOnce is one attempt of the job c: a catch-up resumes what an
// earlier attempt sent, and a final step starts from a fresh look at
// every node, as the publish's retry would.
func (m *Migrator) moveOnce(c *moveJob, source cluster.Node, targetAddr string, withCatchUp bool, log hclog.Logger) (moveOutcome, error) {
	if withCatchUp {
		if err := m.runCatchUp(c, source, targetAddr, log); err != nil {
			return failed, err
		}
	}
	return m.runFinalStep(c)
}

// A move granted ahead tries again itself after a failure (runMove):
// this many attempts in all, this far apart.
const (
	maxAheadAttempts = 3
	aheadRetryPause  = 5 * time.Second
)

// permanent tells a move's failure that trying again cannot cure: the
// target cannot hold the volume, or the request is wrong.
func permanent(err error) bool {
	return errors.Is(err, errdefs.ErrResourceExhausted) || errors.Is(err, errdefs.ErrInvalidArgument)
}

// runCatchUp pushes the primary on source to the target until it is done
// or fails. While another push of the volume holds it on the source (the
// schedule's, or another controller instance's catch-up for the same
// move), it waits, following that push's progress when it goes to the
// same target; it gives up after maxBusyWaits seconds without progress.
func (m *Migrator) runCatchUp(c *moveJob, source cluster.Node, targetAddr string, log hclog.Logger) error {
	m.Metrics.catchUpStarted()
	began := m.now()
	ctx := m.background.context()
	to := agentclient.Target{Addr: targetAddr, NodeID: c.target}
	var err error
	for idle := 0; ; {
		since := m.now()
		_, err = cluster.Push(ctx, source, c.volumeID, to, "catch-up for the move to "+c.target, m.StallTimeout,
			func(p agentclient.Progress) { c.progress(p, since) })
		if !errors.Is(err, errdefs.ErrAborted) {
			break
		}
		if m.follow(ctx, c, source, targetAddr) {
			idle = 0
		} else if idle++; idle >= maxBusyWaits {
			break
		}
		_ = sleep(ctx, time.Second)
	}
	if err != nil {
		m.Metrics.catchUpEnded("failed", m.now().Sub(began))
		return err
	}
	m.Metrics.catchUpEnded("ok", m.now().Sub(began))
	c.mu.Lock()
	sent := c.bytes
	c.mu.Unlock()
	log.Info("move's target caught up", "from_node", c.source, "bytes", sent, "seconds", m.now().Sub(c.started).Seconds())
	return nil
}

// follow looks for the source's running push of c's volume to c's target
// and records its progress as c's (observe): a move that another
// controller instance started, and a publish's retry landed here, tells
// how far the volume's sending is, and estimates its end, instead of
// "nothing sent" until that push ends. It reports whether that push
// progressed since the last look.
func (m *Migrator) follow(ctx context.Context, c *moveJob, source cluster.Node, targetAddr string) bool {
	transfers, err := transfersOf(ctx, m.cluster, source, c.volumeID)
	if err != nil {
		return false
	}
	for _, t := range transfers {
		if t.Peer == targetAddr {
			return c.observe(t)
		}
	}
	return false
}

// runFinalStep runs the job's final step when the primary is still on
// the move's source and unpublished there, taking the same steps as the
// publish's retry would (from a fresh look at every node). While the
// source is published, the final step waits for the publish's retry, as
// it must: the job may still write. A job that never entered its final
// step ends caught up then; one that did (its target was fresh, or an
// earlier attempt entered it) finds nothing to move.
func (m *Migrator) runFinalStep(c *moveJob) (moveOutcome, error) {
	ctx, cancel := context.WithTimeout(m.background.context(), finalStepTimeout)
	defer cancel()
	v, err := m.gather(ctx, c.volumeID)
	if err != nil {
		return failed, fmt.Errorf("looking at the copies of volume %s before the move's final step: %w", c.volumeID, err)
	}
	if p, ok := v.primary(); !ok || p.nodeID() != c.source || p.copy.Mounted {
		if c.inFinalStep() {
			return nothingToMove, nil
		}
		return caughtUp, nil
	}
	c.enterFinalStep()
	if _, err := m.steps(ctx, m.newAttempt(c.volumeID, c.target, true)); err != nil {
		return failed, err
	}
	return moved, nil
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
