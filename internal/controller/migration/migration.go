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
	// target up in the background (runner.go). Zero means
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
	// NoFlush: an unpublish starts no flush (Flush does nothing), and the
	// replicas wait for the schedule.
	NoFlush bool
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
	flushes         flushes       // the flushes after an unpublish (flush.go)
	aheadRetryPause time.Duration // zero: aheadRetryPause
	background      lifecycle     // the moves and demotions that outlive their publish
}

// New returns a Migrator over the cluster's node agents.
func New(c *cluster.Cluster, log hclog.Logger) *Migrator {
	return &Migrator{cluster: c, log: log, now: time.Now}
}

// settle retires primaries older than the current one: a copy fenced for a
// move to the current primary's node, whose history holds the copy's
// generation (the move's final snapshot promoted it), becomes a replica;
// any other (a primary that was lost and came back, or the source of a
// move whose target a failover promoted instead, which may hold writes
// after the target's newest snapshot) is set aside.
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
		aside := c.copy.MovingTo != p.nodeID() || p.copy.HistoryFrom > c.copy.Generation
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
