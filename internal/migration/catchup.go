package migration

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/vocab"
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

// DefaultCatchUpFresh is how recent the target's replica must be for a
// move to skip the catch-up: its final step then sends what was written
// since, at most that much.
const DefaultCatchUpFresh = time.Minute

// DefaultMaxCatchUps bounds the catch-ups running from one source node:
// a drain of many volumes streams a few at a time, not all at once.
const DefaultMaxCatchUps = 4

// catchUpWait is how long a publish waits for the catch-up it started or
// found before answering that it runs: a small volume's catch-up ends
// within it, and the same call goes on to the final step.
const catchUpWait = 5 * time.Second

// catchUpKeep is how long a finished catch-up waits for the publish that
// finishes its move; one older is forgotten (the CO gave up, or went
// elsewhere).
const catchUpKeep = 10 * time.Minute

// catchUp is one background push of a volume's primary to a move's
// target.
type catchUp struct {
	volumeID, source, target string
	started                  time.Time

	mu           sync.Mutex
	bytes, total int64     // sent so far, and the estimate of all
	err          error     // why it failed, once done
	ended        time.Time // zero while it runs
	done         chan struct{}
}

func (c *catchUp) progress(p agentclient.Progress) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bytes, c.total = p.Bytes, p.TotalBytes
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

func (c *catchUp) finish(err error, at time.Time) {
	c.mu.Lock()
	c.err, c.ended = err, at
	c.mu.Unlock()
	close(c.done)
}

// runningError is the publish's answer while c runs: retryable
// (FailedPrecondition, which Nomad retries), saying how far it is.
func (c *catchUp) runningError(now time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	elapsed := now.Sub(c.started)
	how := fmt.Sprintf("%s sent so far", vocab.Bytes(c.bytes))
	if c.total > 0 {
		how = fmt.Sprintf("%s of %s", vocab.Bytes(c.bytes), vocab.Bytes(c.total))
		if c.bytes > 0 && c.total > c.bytes {
			left := time.Duration(float64(elapsed) * float64(c.total-c.bytes) / float64(c.bytes))
			how += fmt.Sprintf(", about %s left", left.Round(time.Second))
		}
	}
	return errdefs.Wrap(errdefs.ErrFailedPrecondition,
		"moving volume %s to node %s: node %s is sending it in the background (%s, running %s); the move finishes at a retry once that is done",
		c.volumeID, c.target, c.source, how, elapsed.Round(time.Second))
}

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

// add records c unless max catch-ups from c's source run already.
func (cs *catchUps) add(c *catchUp, max int) error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	running := 0
	for _, other := range cs.all {
		other.mu.Lock()
		if other.source == c.source && other.ended.IsZero() {
			running++
		}
		other.mu.Unlock()
	}
	if running >= max {
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

// remove forgets c (its move used it, or it failed and was reported).
func (cs *catchUps) remove(c *catchUp) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.all[catchUpKey(c.volumeID, c.target)] == c {
		delete(cs.all, catchUpKey(c.volumeID, c.target))
	}
}

// caughtUp returns nil when the move of p to target may go on to its
// final step: the target holds a replica of p's generation fresher than
// CatchUpFresh, or a catch-up to it has just completed. Otherwise it
// starts a catch-up and waits catchUpWait for it, or finds the one
// running, and answers FailedPrecondition with its progress while it
// runs.
func (m *Migrator) caughtUp(ctx context.Context, p copyOn, target cluster.Node, v view, log hclog.Logger) error {
	if m.CatchUpFresh < 0 {
		return nil // catch-ups off: the move sends everything itself
	}
	id := p.copy.VolumeID
	c, forgotten := m.catchUps.find(id, target.Info.NodeID, m.now())
	for _, f := range forgotten {
		m.Metrics.finalStepPending(f, false) // the CO gave up on it, or went elsewhere
	}
	// Only the call that starts a catch-up waits for it: Nomad sends a
	// plugin's controller calls one at a time, so a retry that waited
	// for a running one would hold every other volume's calls that long.
	wait := time.Duration(0)
	if c == nil {
		if m.targetFresh(p, target, v) {
			return nil
		}
		c = &catchUp{volumeID: id, source: p.nodeID(), target: target.Info.NodeID, started: m.now(), done: make(chan struct{})}
		if err := m.catchUps.add(c, m.maxCatchUps()); err != nil {
			return err
		}
		log.Info("catching the move's target up in the background", "from_node", c.source)
		go m.runCatchUp(c, p.node, target.Addr, log)
		wait = cmp.Or(m.catchUpWait, catchUpWait)
	}
	if err := waitFor(ctx, c.done, wait); err != nil {
		return err
	}
	if !c.isDone() {
		return c.runningError(m.now())
	}
	m.catchUps.remove(c)
	m.Metrics.finalStepPending(c, false)
	if c.err == nil {
		return nil
	}
	if errors.Is(c.err, errdefs.ErrResourceExhausted) || errors.Is(c.err, errdefs.ErrInvalidArgument) {
		return fmt.Errorf("sending volume %s to node %s before the move: %w", id, target.Info.NodeID, c.err)
	}
	// Anything else (a node restarted, a stream broke, a push busy) may
	// pass: the retry starts another, which resumes what arrived.
	return errdefs.Wrap(errdefs.ErrFailedPrecondition, "sending volume %s to node %s before the move failed: %v; a retry sends it again from where it stopped",
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
		return c.copy.Role == vocab.RoleReplica && c.copy.Generation == p.copy.Generation && !c.copy.Resumable &&
			c.copy.LastSnapshotUnixNano > 0 && age < m.catchUpFresh()
	}
	return false
}

// runCatchUp pushes the primary on source to the target until it is done
// or fails, waiting while another push of the volume (the schedule's)
// holds it.
func (m *Migrator) runCatchUp(c *catchUp, source cluster.Node, targetAddr string, log hclog.Logger) {
	m.Metrics.catchUpStarted()
	ctx := context.Background()
	var err error
	for busy := 0; ; busy++ {
		_, err = cluster.Push(ctx, source, c.volumeID, targetAddr, "catch-up for the move to "+c.target, m.StallTimeout, c.progress)
		if !errors.Is(err, errdefs.ErrAborted) || busy >= maxBusyWaits {
			break
		}
		_ = sleep(ctx, time.Second)
	}
	if err == nil {
		// Before finish: the publish waiting for it clears this.
		m.Metrics.finalStepPending(c, true)
	}
	c.finish(err, m.now())
	c.mu.Lock()
	sent := c.bytes
	c.mu.Unlock()
	if err != nil {
		m.Metrics.catchUpEnded("failed")
		log.Warn("catching the move's target up failed; the publish's retry starts it again", "from_node", c.source, "error", err)
		return
	}
	m.Metrics.catchUpEnded("ok")
	log.Info("move's target caught up; the publish's retry finishes the move", "from_node", c.source, "bytes", sent,
		"seconds", m.now().Sub(c.started).Seconds())
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
