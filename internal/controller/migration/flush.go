package migration

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// A flush (docs/migration.md, "Flush at unpublish"): Nomad unpublishes a
// volume from a node after that node unstaged it, so an unpublished
// primary has no writer left, and what it holds is all it will hold until
// its next publish. With flush_on_unpublish on (off by default: a move
// that meets a flush in flight waits for it, and takes longer than
// alone), the controller then pushes it to each of its replicas at once,
// rather than at the schedule's next due time:
//   - a node lost after its workload stopped loses nothing: the replica a
//     failover promotes holds every write;
//   - the publish that moves the volume to a replica's node, which Nomad
//     sends after the unpublish, finds that replica up to date, and the
//     move's final step sends only what the flush had not.
//
// A flush is an ordinary push, the schedule's for another reason: it
// fences, promotes, demotes and reserves nothing, so it keeps every
// invariant a scheduled push keeps (docs/safety.md). It is best effort:
// one that fails (a node down, another transfer of the volume under way)
// leaves the replica to the schedule. A move of the volume goes first: a
// flush pushes nothing once a move job of the volume runs here, and the
// move cancels the flush's push under way unless it goes to the move's
// target, whose end it waits for before its own push (yieldFlush).

// DefaultMaxFlushes bounds the flushes pushing from one source node at
// once: a drain unpublishes many volumes together, and their moves'
// catch-ups and final steps share the source's stream with them.
const DefaultMaxFlushes = 2

// flushTimeout bounds one flush, from its look to its last push.
const flushTimeout = 30 * time.Minute

// flushes are the flushes this controller instance runs, by volume ID,
// and the slots of each source node (DefaultMaxFlushes).
type flushes struct {
	mu      sync.Mutex
	running map[string]*flushRun
	slots   map[string]chan struct{}
	wg      sync.WaitGroup
}

// flushRun is one volume's flush.
type flushRun struct {
	cancel context.CancelFunc
	done   chan struct{}
	target string // the node its push under way goes to; "" between pushes
}

// start records a flush of volumeID unless one runs; its context ends
// with parent or when a move cancels it.
func (f *flushes) start(parent context.Context, volumeID string) (context.Context, *flushRun, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.running[volumeID]; ok {
		return nil, nil, false
	}
	if f.running == nil {
		f.running = map[string]*flushRun{}
	}
	ctx, cancel := context.WithCancel(parent)
	r := &flushRun{cancel: cancel, done: make(chan struct{})}
	f.running[volumeID] = r
	f.wg.Add(1)
	return ctx, r, true
}

func (f *flushes) end(volumeID string, r *flushRun) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.running, volumeID)
	r.cancel()
	close(r.done)
	f.wg.Done()
}

// pushingTo records the node r's next push goes to ("" once it ended).
func (f *flushes) pushingTo(r *flushRun, target string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r.target = target
}

// slot waits for one of source's flush slots; release gives it back.
func (f *flushes) slot(ctx context.Context, source string) (release func(), err error) {
	f.mu.Lock()
	if f.slots == nil {
		f.slots = map[string]chan struct{}{}
	}
	s, ok := f.slots[source]
	if !ok {
		s = make(chan struct{}, DefaultMaxFlushes)
		f.slots[source] = s
	}
	f.mu.Unlock()
	select {
	case s <- struct{}{}:
		return func() { <-s }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Flush pushes volume id's primary, unpublished from nodeID, to each of
// its replicas in the background (see above); it returns at once. It
// does nothing when a flush of the volume runs here already, or with
// NoFlush.
func (m *Migrator) Flush(id, nodeID string) {
	if m.NoFlush {
		return
	}
	ctx, run, ok := m.flushes.start(m.background.context(), id)
	if !ok {
		return
	}
	m.background.spawn(func() {
		defer m.flushes.end(id, run)
		m.flush(ctx, id, nodeID, run)
	})
}

// FlushNow is Flush run in the caller's goroutine until it ends, NoFlush
// or not: for the fault simulation's explorer, whose actors make every
// call themselves.
func (m *Migrator) FlushNow(ctx context.Context, id, nodeID string) {
	ctx, run, ok := m.flushes.start(ctx, id)
	if !ok {
		return
	}
	defer m.flushes.end(id, run)
	m.flush(ctx, id, nodeID, run)
}

// WaitFlushes waits until the flushes started so far have ended: for
// tests that count what a call costs, its flush included.
func (m *Migrator) WaitFlushes() { m.flushes.wg.Wait() }

// flush pushes the primary to its replicas one by one, if it is still
// the unpublished primary on nodeID as a majority of the nodes tell.
func (m *Migrator) flush(ctx context.Context, id, nodeID string, run *flushRun) {
	ctx, cancel := context.WithTimeout(ctx, flushTimeout)
	defer cancel()
	log := m.log.With("volume_id", id, "node_id", nodeID)
	release, err := m.flushes.slot(ctx, nodeID)
	if err != nil {
		return
	}
	defer release()
	p, replicas, why := m.flushable(ctx, id, nodeID)
	if why != "" {
		log.Debug("no flush after the unpublish", "reason", why)
		return
	}
	log = log.With("name", p.copy.Name)
	log.Info("flushing the unpublished volume to its replicas", "replicas", len(replicas))
	for _, r := range replicas {
		if _, moving := m.jobs.running(id); moving {
			log.Info("flush stopped: the volume moves; its move sends what it needs")
			return
		}
		m.flushes.pushingTo(run, r.nodeID())
		began := m.now()
		last, err := cluster.Push(ctx, p.node, id, agentclient.Target{Addr: r.node.Addr, NodeID: r.nodeID()}, "flush after the unpublish", m.StallTimeout, nil)
		m.flushes.pushingTo(run, "")
		if ctx.Err() != nil {
			m.Metrics.flushed("cancelled")
			log.Info("flush stopped: a move of the volume went first, or the controller stops", "target", r.nodeID(), "error", err)
			return
		}
		if err != nil {
			m.Metrics.flushed("failed")
			log.Info("flush to a replica failed; the schedule pushes it when due", "target", r.nodeID(), "error", err)
			continue
		}
		m.Metrics.flushed("ok")
		log.Info("replica flushed", "target", r.nodeID(), "kind", last.Kind, "bytes", last.Bytes, "duration", m.now().Sub(began).Round(time.Millisecond))
	}
}

// flushable returns the primary of volume id on nodeID and its replicas
// to push to, as a publish's look decides the primary, or why there is
// nothing to flush.
func (m *Migrator) flushable(ctx context.Context, id, nodeID string) (copyOn, []copyOn, string) {
	v, err := m.gather(ctx, id)
	if err != nil {
		return copyOn{}, nil, "looking at its copies: " + err.Error()
	}
	p, ok := v.primary()
	switch {
	case !v.quorum() || v.conflict() != nil:
		return copyOn{}, nil, "no majority of the nodes agrees on its primary"
	case !ok || p.nodeID() != nodeID:
		return copyOn{}, nil, "its primary is not on the node it was unpublished from"
	case p.copy.Mounted:
		return copyOn{}, nil, "it is published there again"
	}
	var replicas []copyOn
	for _, c := range v.copies {
		if c.copy.Role == contract.RoleReplica && c.copy.Generation == p.copy.Generation {
			replicas = append(replicas, c)
		}
	}
	if len(replicas) == 0 {
		return copyOn{}, nil, "it has no replica of its generation"
	}
	return p, replicas, ""
}

// cancelFlushElsewhere makes way for a move of volume id to target: it
// cancels this instance's flush of the volume unless its push under way
// goes to target, which sends what the move would. It returns the flush,
// if one runs.
func (m *Migrator) cancelFlushElsewhere(id, target string) (*flushRun, bool) {
	m.flushes.mu.Lock()
	defer m.flushes.mu.Unlock()
	r, ok := m.flushes.running[id]
	if ok && r.target != target {
		r.cancel()
	}
	return r, ok
}

// yieldFlush is cancelFlushElsewhere, then waits for the flush to end:
// before a push of the move, which the flush's would meet on the source.
func (m *Migrator) yieldFlush(ctx context.Context, id, target string, log hclog.Logger) {
	r, ok := m.cancelFlushElsewhere(id, target)
	if !ok {
		return
	}
	log.Debug("the move's push waits for the volume's flush to end")
	select {
	case <-r.done:
	case <-ctx.Done():
	}
}
