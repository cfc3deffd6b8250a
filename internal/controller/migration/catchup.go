package migration

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// A move's catch-up (issue 15, docs/migration.md "Catch-up"). Nomad
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
// (finishInBackground), so a drain's final steps run side by side instead
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

// catchUp is one background push of a volume's primary to a move's
// target.
type catchUp struct {
	volumeID, source, target string
	started                  time.Time
	// The source's copy when the move started: its generation, and
	// whether it was unpublished (only then may the publish be granted
	// ahead of the move's end: the final step follows the catch-up).
	sourceGeneration  uint64
	sourceUnpublished bool

	mu           sync.Mutex
	bytes, total int64 // sent so far, and the estimate of all
	// since is when the push that sent those bytes started (its rate
	// estimates the end), and via, when that push is not this move's
	// own, why the source says it runs (follow).
	since          time.Time
	via            string
	final          bool      // the final step runs (or ran)
	moved          bool      // the final step moved the volume
	err            error     // why it failed, once done
	publishedAhead time.Time // when a publish was granted ahead of its end
	ended          time.Time // zero while it runs
	done           chan struct{}
}

func (c *catchUp) startFinal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.final = true
}

func (c *catchUp) inFinalStep() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.final
}

// progress records what the move's own push, started at since, sent.
func (c *catchUp) progress(p agentclient.Progress, since time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bytes, c.total, c.since, c.via = p.Bytes, p.TotalBytes, since, ""
}

// observe records what the source's running push t of the volume to the
// move's target sent, as the move's progress; it reports whether t is
// another push than the one observed last, or sent more since.
func (c *catchUp) observe(t agentclient.Transfer) (progressed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	since, via := time.Unix(t.StartedUnix, 0), cmp.Or(t.Purpose, "a push")
	progressed = c.via != via || !c.since.Equal(since) || t.Bytes > c.bytes
	c.bytes, c.total, c.since, c.via = t.Bytes, t.TotalBytes, since, via
	return progressed
}

// isDone tells whether c is done.
func (c *catchUp) isDone() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func (c *catchUp) finish(moved bool, err error, at time.Time) {
	c.mu.Lock()
	c.moved, c.err, c.ended = moved, err, at
	c.mu.Unlock()
	close(c.done)
}

// runningError is the publish's answer while c runs: retryable
// (FailedPrecondition, which Nomad retries), saying how far it is.
func (c *catchUp) runningError(now time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	elapsed := now.Sub(c.started)
	if c.final {
		return &moveRunning{move: c, err: errdefs.Wrap(errdefs.ErrFailedPrecondition,
			"moving volume %s to node %s: the final step (fence, last increment, promotion) runs in the background (%s sent before it, running %s); the move is done at a retry",
			c.volumeID, c.target, contract.Bytes(c.bytes), elapsed.Round(time.Second))}
	}
	how := fmt.Sprintf("%s sent so far", contract.Bytes(c.bytes))
	if c.total > 0 {
		how = fmt.Sprintf("%s of %s", contract.Bytes(c.bytes), contract.Bytes(c.total))
		if left, ok := c.leftLocked(now); ok {
			how += fmt.Sprintf(", about %s left", left.Round(time.Second))
		}
	}
	if c.via != "" {
		how += fmt.Sprintf(", by the push already running there: %s", c.via)
	}
	return &moveRunning{move: c, err: errdefs.Wrap(errdefs.ErrFailedPrecondition,
		"moving volume %s to node %s: node %s is sending it in the background (%s, running %s); the move finishes at a retry once that is done",
		c.volumeID, c.target, c.source, how, elapsed.Round(time.Second))}
}

// leftLocked estimates the catch-up's time left from its rate so far,
// once it has run long enough for a rate to mean something.
func (c *catchUp) leftLocked(now time.Time) (time.Duration, bool) {
	elapsed := now.Sub(cmp.Or(c.since, c.started))
	if c.bytes <= 0 || c.total <= c.bytes || elapsed < minEstimateTime {
		return 0, false
	}
	return time.Duration(float64(elapsed) * float64(c.total-c.bytes) / float64(c.bytes)), true
}

// minEstimateTime is how long a catch-up runs before its rate gives an
// estimate of its end.
const minEstimateTime = 2 * time.Second

// wasGrantedAhead tells whether a publish was granted ahead of c's end.
func (c *catchUp) wasGrantedAhead() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.publishedAhead.IsZero()
}

// grantedAhead records that a publish was granted ahead of c's end.
func (c *catchUp) grantedAhead(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.publishedAhead.IsZero() {
		c.publishedAhead = at
	}
}

// aheadOf returns the generation the target's copy must exceed when the
// publish may be granted ahead of c's end: it runs its final step (which
// it does only with the source unpublished), or its source was
// unpublished when it started (the final step follows) and its catch-up
// is estimated to end within d.
func (c *catchUp) aheadOf(now time.Time, d time.Duration) (uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sourceGeneration == 0 {
		return 0, false
	}
	if c.final {
		return c.sourceGeneration, true
	}
	left, ok := c.leftLocked(now)
	return c.sourceGeneration, c.sourceUnpublished && ok && left <= d
}

// moveRunning is the publish's refusal while a background move of the
// volume to the node runs: FailedPrecondition with the move's progress,
// which PublishAhead reads.
type moveRunning struct {
	move *catchUp
	err  error
}

func (e *moveRunning) Error() string { return e.err.Error() }
func (e *moveRunning) Unwrap() error { return e.err }

// catchUps are the running and finished catch-ups, by volume and target.
type catchUps struct {
	mu  sync.Mutex
	all map[string]*catchUp
}

func catchUpKey(volumeID, target string) string { return volumeID + " " + target }

// find returns the catch-up of volumeID to target, unless there is none
// or it ended more than catchUpKeep before now; those it forgets.
func (cs *catchUps) find(volumeID, target string, now time.Time) (c *catchUp, forgotten []*catchUp) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for key, other := range cs.all {
		other.mu.Lock()
		stale := !other.ended.IsZero() && now.Sub(other.ended) > catchUpKeep
		other.mu.Unlock()
		if stale {
			delete(cs.all, key)
			forgotten = append(forgotten, other)
		}
	}
	return cs.all[catchUpKey(volumeID, target)], forgotten
}

// add records c unless a move of c's volume to another node runs, or c
// starts with a catch-up and max catch-ups from c's source run already
// (moves in their final step are not counted).
func (cs *catchUps) add(c *catchUp, max int) error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	running := 0
	for _, other := range cs.all {
		busy := !other.isDone()
		if busy && other.volumeID == c.volumeID {
			return errdefs.Wrap(errdefs.ErrFailedPrecondition,
				"volume %s is moving to node %s in the background; it can move to node %s at a retry once that move is done", c.volumeID, other.target, c.target)
		}
		if busy && other.source == c.source && !other.inFinalStep() {
			running++
		}
	}
	if !c.inFinalStep() && running >= max {
		return errdefs.Wrap(errdefs.ErrFailedPrecondition,
			"moving volume %s to node %s: node %s already sends %d volumes in the background (at most %d at once); this move starts at a retry once one is done",
			c.volumeID, c.target, c.source, running, max)
	}
	if cs.all == nil {
		cs.all = map[string]*catchUp{}
	}
	cs.all[catchUpKey(c.volumeID, c.target)] = c
	return nil
}

// stillRunning answers, when the move of volumeID to target runs in the
// background, the publish's answer while it runs (nil otherwise).
func (cs *catchUps) stillRunning(volumeID, target string, now time.Time) error {
	cs.mu.Lock()
	c := cs.all[catchUpKey(volumeID, target)]
	cs.mu.Unlock()
	if c == nil || c.isDone() {
		return nil
	}
	return c.runningError(now)
}

// movingElsewhere answers, when a move of volumeID to a node other than
// nodeID runs in the background (its catch-up or its final step), the
// refusal of a publish to nodeID (nil otherwise): FailedPrecondition,
// which Nomad retries. Such a publish, to the move's source above all,
// must not act on the copies while the move may fence the source and
// promote its target (issue 35): it is decided once the move ends.
func (cs *catchUps) movingElsewhere(volumeID, nodeID string) error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for _, c := range cs.all {
		if c.volumeID != volumeID || c.target == nodeID || c.isDone() {
			continue
		}
		step := "catching its target up"
		if c.inFinalStep() {
			step = "final step running"
		}
		return errdefs.Wrap(errdefs.ErrFailedPrecondition,
			"volume %s is moving from node %s to node %s (%s); retry: the publish on node %s will be decided once the move ends",
			volumeID, c.source, c.target, step, nodeID)
	}
	return nil
}

// running returns the target of the move of volumeID running in the
// background, if one runs.
func (cs *catchUps) running(volumeID string) (string, bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for _, c := range cs.all {
		if c.volumeID == volumeID && !c.isDone() {
			return c.target, true
		}
	}
	return "", false
}

// remove forgets c (its move used it, or it failed and was reported).
func (cs *catchUps) remove(c *catchUp) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.all[catchUpKey(c.volumeID, c.target)] == c {
		delete(cs.all, catchUpKey(c.volumeID, c.target))
	}
}

// caughtUp returns nil when the move of p to target goes on in this
// call: catch-ups are off, or the target is fresh and the source still
// published (the move then answers so). It returns errRetry when the background move moved the
// volume (the publish looks again, and finds it on the target).
// Otherwise it starts a background move and waits CatchUpWait for it,
// or finds the one running, and answers FailedPrecondition with its
// progress while it runs.
func (m *Migrator) caughtUp(ctx context.Context, p copyOn, target cluster.Node, v view, log hclog.Logger) error {
	if m.CatchUpFresh < 0 {
		return nil // catch-ups off: the move sends everything itself
	}
	id := p.copy.VolumeID
	c, forgotten := m.catchUps.find(id, target.Info.NodeID, m.now())
	for _, f := range forgotten {
		m.Metrics.finalStepPending(f, false) // the CO gave up on it, or went elsewhere
	}
	if c == nil {
		fresh := m.targetFresh(p, target, v)
		if fresh && p.copy.Mounted {
			return nil // the publish says it is still published there
		}
		return m.startMove(ctx, p, target, !fresh, log)
	}
	// Only the call that starts a move waits for it: Nomad sends a
	// plugin's controller calls one at a time, so a retry that waited
	// for a running one would hold every other volume's calls that long.
	if !c.isDone() {
		return c.runningError(m.now())
	}
	return m.ended(ctx, c, p, target, log)
}

// startMove starts the background move of p to target (with a catch-up
// first, or straight to the final step) and waits CatchUpWait for it.
func (m *Migrator) startMove(ctx context.Context, p copyOn, target cluster.Node, withCatchUp bool, log hclog.Logger) error {
	c := &catchUp{volumeID: p.copy.VolumeID, source: p.nodeID(), target: target.Info.NodeID, started: m.now(), final: !withCatchUp, done: make(chan struct{}),
		sourceGeneration: p.copy.Generation, sourceUnpublished: !p.copy.Mounted}
	if err := m.catchUps.add(c, m.maxCatchUps()); err != nil {
		return err
	}
	if withCatchUp {
		log.Info("catching the move's target up in the background", "from_node", c.source)
	} else {
		log.Info("moving the volume in the background: its target is fresh", "from_node", c.source)
	}
	m.background.spawn(func() { m.runMove(c, p.node, target.Addr, withCatchUp, log) })
	if err := waitFor(ctx, c.done, cmp.Or(m.CatchUpWait, DefaultCatchUpWait)); err != nil {
		return err
	}
	if !c.isDone() {
		return c.runningError(m.now())
	}
	return m.ended(ctx, c, p, target, log)
}

// arrived forgets a finished background move of the volume to nodeID,
// which holds its primary now: the publish that finds it there ends it.
func (m *Migrator) arrived(id, nodeID string) {
	c, forgotten := m.catchUps.find(id, nodeID, m.now())
	for _, f := range forgotten {
		m.Metrics.finalStepPending(f, false)
	}
	if c != nil && c.isDone() {
		m.catchUps.remove(c)
		m.Metrics.finalStepPending(c, false)
	}
}

// ended is the publish's answer for the background move c, done: errRetry
// when it moved the volume (the publish looks again and finds it on the
// target), the failure, or, when it caught the target up while the source
// was published, the final step started now if the source no longer is.
func (m *Migrator) ended(ctx context.Context, c *catchUp, p copyOn, target cluster.Node, log hclog.Logger) error {
	m.catchUps.remove(c)
	m.Metrics.finalStepPending(c, false)
	id := c.volumeID
	switch {
	case c.moved:
		return errRetry
	case c.err == nil && p.copy.Mounted:
		return nil // the publish says it is still published there
	case c.err == nil && c.inFinalStep():
		// The final step looked and found nothing to move: the source
		// published again (an old claim restaged there) or no longer the
		// primary. Another started now would find the same, again and
		// again until the call's deadline; the CO's retry looks afresh.
		return errdefs.Wrap(errdefs.ErrFailedPrecondition, "volume %s did not move to node %s: its final step found it published again on node %s, or no longer its primary there; retry once it is unpublished there",
			id, target.Info.NodeID, c.source)
	case c.err == nil:
		return m.startMove(ctx, p, target, false, log)
	case permanent(c.err):
		return fmt.Errorf("sending volume %s to node %s before the move: %w", id, target.Info.NodeID, c.err)
	}
	// Anything else (a node restarted, a stream broke, a push busy) may
	// pass: the retry starts another, which resumes what arrived.
	return errdefs.Wrap(errdefs.ErrFailedPrecondition, "moving volume %s to node %s in the background failed: %v; a retry starts it again from where it stopped",
		id, target.Info.NodeID, c.err)
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

// runMove is the background move: it pushes the primary on source to the
// target unless the target is fresh (waiting while another push of the
// volume, the schedule's, holds it), then runs the final step if the
// source is unpublished. A move whose publish was granted ahead of its
// end gets no retry of the publish to start it again after a failure,
// so it tries again itself, up to maxAheadAttempts times.
func (m *Migrator) runMove(c *catchUp, source cluster.Node, targetAddr string, catchUp bool, log hclog.Logger) {
	var moved bool
	var err error
	for attempt := 1; ; attempt++ {
		moved, err = m.moveOnce(c, source, targetAddr, catchUp, log)
		if err == nil || !c.wasGrantedAhead() || attempt >= maxAheadAttempts || permanent(err) {
			break
		}
		log.Warn("moving the volume in the background failed after its publish was granted ahead; no publish retry will start it again, so the controller does",
			"from_node", c.source, "attempt", attempt, "error", err)
		if sleep(m.background.context(), cmp.Or(m.aheadRetryPause, aheadRetryPause)) != nil {
			break // the controller stops
		}
	}
	if err == nil && !moved {
		// Before finish: the publish waiting for it clears this.
		m.Metrics.finalStepPending(c, true)
	}
	c.finish(moved, err, m.now())
	seconds := m.now().Sub(c.started).Seconds()
	switch {
	case err != nil:
		log.Warn("moving the volume in the background failed; the publish's retry starts it again", "from_node", c.source, "error", err, "seconds", seconds)
	case moved:
		log.Info("volume moved in the background; the publish's retry, or the node's stage of a publish granted ahead, finds it there", "from_node", c.source, "seconds", seconds)
	default:
		log.Info("move's target caught up; the final step waits for the volume to be unpublished on its node", "from_node", c.source, "seconds", seconds)
	}
}

// moveOnce is one attempt of the background move c: a catch-up resumes
// what an earlier attempt sent, and a final step starts from a fresh
// look at every node, as the publish's retry would.
func (m *Migrator) moveOnce(c *catchUp, source cluster.Node, targetAddr string, catchUp bool, log hclog.Logger) (bool, error) {
	if catchUp {
		if err := m.runCatchUp(c, source, targetAddr, log); err != nil {
			return false, err
		}
	}
	return m.finishInBackground(c, log)
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
func (m *Migrator) runCatchUp(c *catchUp, source cluster.Node, targetAddr string, log hclog.Logger) error {
	m.Metrics.catchUpStarted()
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
		m.Metrics.catchUpEnded("failed")
		return err
	}
	m.Metrics.catchUpEnded("ok")
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
func (m *Migrator) follow(ctx context.Context, c *catchUp, source cluster.Node, targetAddr string) bool {
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

// finishInBackground runs the move's final step when the primary is still
// on the move's source and unpublished there, as the publish's retry
// would (the same decisions, from a fresh look at every node); it reports
// whether the volume moved. While the source is published, the final step
// waits for the publish's retry, as it must: the job may still write.
func (m *Migrator) finishInBackground(c *catchUp, log hclog.Logger) (bool, error) {
	ctx, cancel := context.WithTimeout(m.background.context(), finalStepTimeout)
	defer cancel()
	v, err := m.gather(ctx, c.volumeID)
	if err != nil {
		return false, fmt.Errorf("looking at the copies of volume %s before the move's final step: %w", c.volumeID, err)
	}
	if p, ok := v.primary(); !ok || p.nodeID() != c.source || p.copy.Mounted {
		return false, nil
	}
	c.startFinal()
	if _, err := m.publish(ctx, c.volumeID, c.target, true); err != nil {
		return false, err
	}
	return true, nil
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
