// Package scheduler is the controller's replication schedule: it keeps each
// volume's asked-for number of replicas on other nodes and no older than
// its interval, by telling the volume's node to push (the data goes node to
// node; see docs/replication.md).
//
// It keeps no state it cannot lose: a round plans from what the nodes
// report (their volumes with parameters, their replicas with the time of
// the newest received snapshot), so a restarted controller picks up where
// the last one stopped. What a full plan learned is kept for the rounds
// after it (the book), which ask each node only for its volumes' version
// and push what the book says is due, so a round's work is in proportion
// to the volumes due, not to all volumes. A node whose
// primaries changed since (its version differs) is asked again, and the
// round plans over what it answers and what the book keeps of the others
// (with the pushes made since applied); a node that came or went, a push
// refused because its source no longer holds the primary, and every
// Resync make the next round ask every node again.
//
// The driver's words (generation, promise, fence, lease, set aside,
// tombstone, ...) are defined in docs/glossary.md.
package scheduler

import (
	"context"
	"errors"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// Scheduler runs replication rounds.
type Scheduler struct {
	// Metrics, when set, records lag and pushes.
	Metrics *Metrics

	cl  *cluster.Cluster
	log hclog.Logger
	now func() time.Time
	// Settle, when set, retires the older of two primaries of a volume.
	Settle func(ctx context.Context, volumeID string) error
	// StallTimeout cancels a push that has moved no byte for that long
	// (default cluster.DefaultStallTimeout): a hung peer or stream must
	// not keep its volume's replicas from ever being updated.
	StallTimeout time.Duration

	// Resync bounds how long rounds plan from the book without a full
	// plan (default DefaultResync): replicas changed behind the
	// schedule's back (an operator's backup or remove-replica) show then.
	Resync time.Duration

	// SurplusGrace is how long a copy demoted by a move stays at least,
	// even when it is surplus (default DefaultSurplusGrace): it is a
	// whole copy of the volume while the new primary proves itself.
	SurplusGrace time.Duration

	slots  chan struct{} // one per push allowed to run at once
	pushes sync.WaitGroup
	mu     sync.Mutex
	// running maps each volume with a push under way to its target node:
	// a first push's replica is invisible until its receive completes, and
	// a full plan meanwhile must not place the volume's replica anew.
	running map[string]string
	book    *book // nil: the next round plans in full
	// surplusFound are the surplus copies the last full plan found, for
	// the next round to remove; removing is true while a round does.
	surplusFound []Removal
	removing     bool
	removed      atomic.Int64 // surplus copies removed, for SurplusRemoved
}

// DefaultSurplusGrace is SurplusGrace's default.
const DefaultSurplusGrace = 10 * time.Minute

// DefaultResync is how often a full plan runs while no node's primaries
// change.
const DefaultResync = 10 * time.Minute

// New returns a scheduler that runs at most parallel pushes at once.
func New(cl *cluster.Cluster, parallel int, log hclog.Logger) *Scheduler {
	return &Scheduler{cl: cl, log: log, now: time.Now, StallTimeout: cluster.DefaultStallTimeout, SurplusGrace: DefaultSurplusGrace,
		slots: make(chan struct{}, max(1, parallel)), running: map[string]string{}}
}

// replica is one node's copy of a volume.
type replica struct {
	node      cluster.Node
	last      time.Time
	resumable bool
	newest    string    // the newest snapshot's name
	demotedAt time.Time // when it was demoted from primary by a move; zero if not
}

// Push is one transfer a round decided on.
type Push struct {
	VolumeID string
	Source   cluster.Node
	Target   cluster.Node
	Reason   string
}

// Round plans one round and starts its pushes in the background, at most
// parallel at once across rounds, and returns the pushes it started. It
// does not wait for them: a slow or stalled push holds up only its own
// volume, which later rounds skip until the push ends. Wait waits for
// the pushes started so far.
func (s *Scheduler) Round(ctx context.Context) []Push {
	pushes, err := s.Plan(ctx)
	if err != nil {
		s.log.Warn("replication round skipped", "error", err)
		return nil
	}
	var started []Push
	for _, p := range pushes {
		if !s.claim(p.VolumeID, p.Target.Info.NodeID) {
			s.log.Debug("a push of the volume from an earlier round still runs", "volume_id", p.VolumeID, "target", p.Target.Info.NodeID)
			continue
		}
		started = append(started, p)
		s.pushes.Add(1)
		go func() {
			defer s.pushes.Done()
			defer s.unclaim(p.VolumeID)
			select {
			case s.slots <- struct{}{}:
				defer func() { <-s.slots }()
			case <-ctx.Done():
				return
			}
			s.push(ctx, p)
		}()
	}
	s.startRemovals(ctx)
	return started
}

var _ surplusRemover = (*agentclient.Client)(nil)

// SetClock sets the clock the schedule judges ages by (the wall clock by
// default): the fault simulation's own.
func (s *Scheduler) SetClock(now func() time.Time) { s.now = now }

// replicaFrom is what a full plan keeps of replica r on node n.
func replicaFrom(n cluster.Node, r agentclient.Replica) replica {
	out := replica{node: n, last: time.Unix(r.LastSnapshotUnix, 0), resumable: r.Resumable, newest: r.LastSnapshot}
	if r.DemotedAtUnix > 0 {
		out.demotedAt = time.Unix(r.DemotedAtUnix, 0)
	}
	return out
}

// Wait waits until the pushes started by earlier rounds have ended.
func (s *Scheduler) Wait() { s.pushes.Wait() }

// claim marks a volume as being pushed to target, unless it is already.
func (s *Scheduler) claim(volumeID, target string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.running[volumeID]; ok {
		return false
	}
	s.running[volumeID] = target
	return true
}

// pushingTo returns the target node of the volume's push under way, or "".
func (s *Scheduler) pushingTo(volumeID string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running[volumeID]
}

func (s *Scheduler) unclaim(volumeID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.running, volumeID)
}

// Plan decides which volumes to push where: from the book while every
// node's primaries are as the book knows them, else from what the nodes
// report.
func (s *Scheduler) Plan(ctx context.Context) ([]Push, error) {
	nodes, _, err := s.cl.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	healthy := cluster.Healthy(nodes)
	b, changed := s.currentBook(healthy)
	if b != nil && len(changed) == 0 {
		return s.planFromBook(b), nil
	}
	return s.planInFull(ctx, healthy, b, changed)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// sourceGone reports whether a push failed because its source does not
// hold the volume's primary (any more): the book is out of date.
func sourceGone(err error) bool {
	return errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrFailedPrecondition)
}

// planInFull decides which volumes to push where from what the nodes
// hold, and keeps what it learned in the book. It asks the nodes of
// changed (all, when old is nil): for what changed since the version old
// saw, when they can tell (changedHolding), else for everything. What the
// others hold it takes from old: their primaries as old saw them, with
// the replicas pushed to them since applied (recordPush). So a round
// after a create on one node reads that volume, not every node's.
func (s *Scheduler) planInFull(ctx context.Context, healthy []cluster.Node, old *book, changed map[string]bool) ([]Push, error) {
	next := &book{planned: s.now(), versions: map[string]string{}, held: map[string]cluster.Holding{}, volumes: map[string]*booked{}}
	if old != nil {
		next.planned = old.planned // Resync counts from the last plan that asked every node
	}
	h, complete := s.holdings(ctx, healthy, old, changed, next)
	pushes, surplus, settled := s.planVolumes(ctx, h, healthy, next)
	if !complete || settled {
		// What a skipped node holds is unknown, and a settled volume
		// waits: the next round plans in full again.
		next = nil
	}
	s.mu.Lock()
	s.book = next
	s.surplusFound = surplus
	s.mu.Unlock()
	return pushes, nil
}

// seen is what the nodes hold, as a round sees it.
type seen struct {
	primaries []primary
	replicas  map[string][]replica // by volume ID
}

// primary is a volume's primary on a node.
type primary struct {
	node cluster.Node
	vol  agentclient.Volume
}

// holdings learns what the healthy nodes hold, from old for those that
// did not change and by asking the others, and records it in next. It
// reports false when a node did not answer: the round is not complete.
func (s *Scheduler) holdings(ctx context.Context, healthy []cluster.Node, old *book, changed map[string]bool, next *book) (seen, bool) {
	var ask []cluster.Node
	answers := []cluster.Answer[cluster.Holding]{}
	for _, n := range healthy {
		next.versions[n.Info.NodeID] = n.Info.VolumesVersion
		if h, ok := s.knownHolding(ctx, old, changed, n); ok {
			answers = append(answers, cluster.Answer[cluster.Holding]{Node: n, Object: h})
		} else {
			ask = append(ask, n)
		}
	}
	answers = append(answers, cluster.Holdings(ctx, s.cl, ask)...)
	h := seen{replicas: map[string][]replica{}}
	complete := true
	for _, a := range answers {
		n := a.Node
		if a.Err != nil {
			s.log.Warn("node skipped this round", "node_id", n.Info.NodeID, "error", a.Err)
			complete = false
			continue
		}
		next.held[n.Info.NodeID] = a.Object
		for _, v := range a.Object.Volumes {
			h.primaries = append(h.primaries, primary{n, v})
		}
		for _, r := range a.Object.Status.Replicas {
			h.replicas[r.VolumeID] = append(h.replicas[r.VolumeID], replicaFrom(n, r))
		}
	}
	return h, complete
}

// planVolumes decides each primary's pushes and surplus copies and books
// them in next. A volume with two primaries (a move between promotion
// and demotion, or a lost primary back after a failover) gets nothing:
// Settle retires the older, once per round, and planVolumes reports
// that it did.
func (s *Scheduler) planVolumes(ctx context.Context, h seen, healthy []cluster.Node, next *book) (pushes []Push, surplus []Removal, settled bool) {
	holders := map[string]int{}
	for _, p := range h.primaries {
		holders[p.vol.VolumeID]++
	}
	settledIDs := map[string]bool{}
	s.Metrics.reset()
	for _, p := range h.primaries {
		id := p.vol.VolumeID
		if holders[id] > 1 {
			if !settledIDs[id] && s.Settle != nil {
				if err := s.Settle(ctx, id); err != nil {
					s.log.Warn("two primaries of a volume; retiring the older failed", "volume_id", id, "error", err)
				}
			}
			settledIDs[id] = true
			continue
		}
		if p.vol.MovingTo != "" {
			continue // a move is sending it; pushes of its own would only delay it
		}
		want, interval := contract.ReplicationPolicy(p.vol.Parameters)
		var targets []replica
		if want > 0 {
			s.Metrics.observe(id, want, interval, h.replicas[id], s.now())
			targets = s.targets(p.node, p.vol, want, h.replicas[id], healthy)
		}
		surplus = append(surplus, s.surplus(p.node, id, want, targets, h.replicas[id])...)
		if want == 0 {
			continue
		}
		pushes = append(pushes, s.duePushes(p, targets, interval)...)
		next.volumes[id] = &booked{source: p.node, want: want, interval: interval, targets: targets}
	}
	return pushes, surplus, len(settledIDs) > 0
}

// duePushes are the pushes of a primary to those of its targets that are
// due, the stalest first: a round starts one push per volume (Round), so
// a target that is always due (slow pushes, a short interval) would
// otherwise starve the ones after it. It sorts targets.
func (s *Scheduler) duePushes(p primary, targets []replica, interval time.Duration) []Push {
	slices.SortStableFunc(targets, func(a, b replica) int { return a.last.Compare(b.last) })
	var pushes []Push
	for _, t := range targets {
		if reason := s.due(t, interval); reason != "" {
			pushes = append(pushes, Push{VolumeID: p.vol.VolumeID, Source: p.node, Target: t.node, Reason: reason})
		}
	}
	return pushes
}

// targets returns up to want replicas for a volume: those that exist
// (freshest first, but a copy demoted by a move after the others: it
// goes once they are as fresh, surplus), then the one a push under way
// is making, then new ones where cluster.ReplicaTargets places them.
func (s *Scheduler) targets(source cluster.Node, v agentclient.Volume, want int, existing []replica, healthy []cluster.Node) []replica {
	sort.SliceStable(existing, func(i, j int) bool {
		if a, b := existing[i].demotedAt.IsZero(), existing[j].demotedAt.IsZero(); a != b {
			return a
		}
		return existing[i].last.After(existing[j].last)
	})
	byID := map[string]replica{}
	var holders []cluster.Node
	for _, r := range existing {
		byID[r.node.Info.NodeID] = r
		holders = append(holders, r.node)
	}
	// A first push shows no replica until its receive completes: placing
	// the volume anew meanwhile (rooms change as it fills) would start a
	// second replica, which the volume did not ask for and which a
	// failover may later prefer over the one a job is rescheduled to.
	if to := s.pushingTo(v.VolumeID); to != "" {
		for _, n := range healthy {
			if _, held := byID[to]; !held && n.Info.NodeID == to {
				holders = append(holders, n)
			}
		}
	}
	nodes, err := cluster.ReplicaTargets(source, v.UsedBytes, want, holders, healthy)
	if len(nodes) < want {
		s.log.Warn("fewer replicas possible than asked for", "volume_id", v.VolumeID, "want", want, "possible", len(nodes), "error", err)
	}
	out := make([]replica, 0, len(nodes))
	for _, n := range nodes {
		r, ok := byID[n.Info.NodeID]
		if !ok {
			r = replica{node: n}
		}
		out = append(out, r)
	}
	return out
}

// due says why a replica needs a push now, or "" if it does not.
func (s *Scheduler) due(r replica, interval time.Duration) string {
	switch {
	case r.last.IsZero() || r.last.Unix() == 0:
		return "no replica yet"
	case r.resumable:
		return "an interrupted transfer waits"
	case s.now().Sub(r.last) >= interval:
		return "replica older than the interval"
	}
	return ""
}

func (s *Scheduler) push(ctx context.Context, p Push) {
	log := s.log.With("volume_id", p.VolumeID, "source", p.Source.Info.NodeID, "target", p.Target.Info.NodeID, "reason", p.Reason)
	start := s.now()
	last, err := cluster.Push(ctx, p.Source, p.VolumeID, agentclient.Target{Addr: p.Target.Addr, NodeID: p.Target.Info.NodeID}, "schedule", s.StallTimeout, nil)
	s.recordPush(p, start, err)
	if err != nil {
		log.Warn("push failed; the next round retries", "error", err)
		s.Metrics.push("failure")
		return
	}
	s.Metrics.push("success")
	log.Info("replica updated", "kind", last.Kind, "bytes", last.Bytes, "duration", s.now().Sub(start).Round(time.Millisecond))
}
