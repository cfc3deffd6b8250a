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
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// The job runner: a move job's catch-up and final step, run in the
// background by the controller instance whose publish started the job
// (publish.go's hand-off), to the job's end (job.go), which the CO's
// retry of the publish then answers from.

// finalStepTimeout bounds a final step run in the background.
const finalStepTimeout = 10 * time.Minute

// runMove runs the job j to its end: it pushes the primary on source to
// the target unless the target is fresh (waiting while another push of
// the volume, the schedule's, holds it), then runs the final step if the
// source is unpublished. A job whose publish was granted ahead of its
// end gets no retry of the publish to start it again after a failure,
// so it tries again itself, up to maxAheadAttempts times.
func (m *Migrator) runMove(j *moveJob, source cluster.Node, targetAddr string, withCatchUp bool, log hclog.Logger) {
	var outcome moveOutcome
	var err error
	for attempt := 1; ; attempt++ {
		outcome, err = m.moveOnce(j, source, targetAddr, withCatchUp, log)
		if err == nil || !j.wasGrantedAhead() || attempt >= maxAheadAttempts || permanent(err) {
			break
		}
		log.Warn("moving the volume in the background failed after its publish was granted ahead; no publish retry will start it again, so the controller does",
			"from_node", j.source, "attempt", attempt, "error", err)
		if sleep(m.background.context(), cmp.Or(m.aheadRetryPause, aheadRetryPause)) != nil {
			break // the controller stops
		}
	}
	if outcome == caughtUp {
		// Before end: the publish that answers from it clears this.
		m.Metrics.finalStepPending(j, true)
	}
	j.end(outcome, err, m.now())
	seconds := m.now().Sub(j.started).Seconds()
	switch outcome {
	case failed:
		log.Warn("moving the volume in the background failed; the publish's retry starts it again", "from_node", j.source, "error", err, "seconds", seconds)
	case moved:
		log.Info("volume moved in the background; the publish's retry, or the node's stage of a publish granted ahead, finds it there", "from_node", j.source, "seconds", seconds)
	case caughtUp:
		log.Info("move's target caught up; the final step waits for the volume to be unpublished on its node", "from_node", j.source, "seconds", seconds)
	case nothingToMove:
		log.Info("the move's final step found nothing to move: the volume is published again on its node, or no longer its primary there; the publish's retry decides afresh", "from_node", j.source, "seconds", seconds)
	}
}

// moveOnce is one attempt of the job j: a catch-up resumes what an
// earlier attempt sent, and a final step starts from a fresh look at
// every node, as the publish's retry would.
func (m *Migrator) moveOnce(j *moveJob, source cluster.Node, targetAddr string, withCatchUp bool, log hclog.Logger) (moveOutcome, error) {
	// A catch-up pushes at once, and waits for the flush here; a final
	// step first looks and reserves while the flush's push to its target
	// goes on, and waits for it at its fence (sendFinal).
	if withCatchUp {
		m.yieldFlush(m.background.context(), j.volumeID, j.target, log)
		if err := m.runCatchUp(j, source, targetAddr, log); err != nil {
			return failed, err
		}
	} else {
		m.cancelFlushElsewhere(j.volumeID, j.target)
	}
	return m.runFinalStep(j)
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
func (m *Migrator) runCatchUp(j *moveJob, source cluster.Node, targetAddr string, log hclog.Logger) error {
	m.Metrics.catchUpStarted()
	began := m.now()
	ctx := m.background.context()
	to := agentclient.Target{Addr: targetAddr, NodeID: j.target}
	var err error
	for idle := 0; ; {
		since := m.now()
		_, err = cluster.Push(ctx, source, j.volumeID, to, "catch-up for the move to "+j.target, m.StallTimeout,
			func(p agentclient.Progress) { j.progress(p, since) })
		if !errors.Is(err, errdefs.ErrAborted) {
			break
		}
		if m.follow(ctx, j, source, targetAddr) {
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
	j.mu.Lock()
	sent := j.bytes
	j.mu.Unlock()
	log.Info("move's target caught up", "from_node", j.source, "bytes", sent, "seconds", m.now().Sub(j.started).Seconds())
	return nil
}

// follow looks for the source's running push of j's volume to j's target
// and records its progress as j's (observe): a move that another
// controller instance started, and a publish's retry landed here, tells
// how far the volume's sending is, and estimates its end, instead of
// "nothing sent" until that push ends. It reports whether that push
// progressed since the last look.
func (m *Migrator) follow(ctx context.Context, j *moveJob, source cluster.Node, targetAddr string) bool {
	transfers, err := transfersOf(ctx, m.cluster, source, j.volumeID)
	if err != nil {
		return false
	}
	for _, t := range transfers {
		if t.Peer == targetAddr {
			return j.observe(t)
		}
	}
	return false
}

// runFinalStep runs the job's final step when the primary is still on
// the move's source and unpublished there, taking the same steps as the
// publish's retry would (from a look at every node, finalLook's, which
// its first step acts on). While the
// source is published, the final step waits for the publish's retry, as
// it must: the job may still write. A job that never entered its final
// step ends caught up then; one that did (its target was fresh, or an
// earlier attempt entered it) finds nothing to move.
func (m *Migrator) runFinalStep(j *moveJob) (moveOutcome, error) {
	ctx, cancel := context.WithTimeout(m.background.context(), finalStepTimeout)
	defer cancel()
	v, err := m.finalLook(ctx, j)
	if err != nil {
		return failed, fmt.Errorf("looking at the copies of volume %s before the move's final step: %w", j.volumeID, err)
	}
	if p, ok := v.primary(); !ok || p.nodeID() != j.source || p.copy.Mounted {
		if j.inFinalStep() {
			return nothingToMove, nil
		}
		return caughtUp, nil
	}
	j.enterFinalStep()
	a := m.newAttempt(j.volumeID, j.target, true)
	a.seen = &v // its first step acts on this look
	if _, err := m.steps(ctx, a); err != nil {
		return failed, err
	}
	return moved, nil
}

// finalLook is the look a final step starts from: the one the job's
// publish took just before starting it at its final step (its first
// attempt only), or a fresh look at every node. A look a moment old is
// as good as a fresh one: whatever changed since is refused by the nodes
// (the reservation, the fence's checks of the promise and the mount) and
// looked at again.
func (m *Migrator) finalLook(ctx context.Context, j *moveJob) (view, error) {
	if v := j.takeSeen(); v != nil {
		return *v, nil
	}
	return m.gather(ctx, j.volumeID)
}
