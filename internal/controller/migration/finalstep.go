package migration

import (
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

// finishMove is a move's final step: reserve the next generation for
// target, fence p and send its final snapshot (one call: the source
// fences under the same lock hold as the snapshot), promote the target,
// demote the source. A move job runs it (runFinalStep, through steps with
// inBackground set), or a foreground publish when catch-ups are off or
// the fresh target's source is still published (which it answers).
func (m *Migrator) finishMove(ctx context.Context, a *attempt, p copyOn, target cluster.Node, v view) (uint64, next, error) {
	id := a.id
	if p.copy.Mounted {
		return 0, answer, errdefs.Wrap(errdefs.ErrFailedPrecondition, "volume %s is still published on node %s; it moves to node %s once it is unpublished there", id, p.nodeID(), target.Info.NodeID)
	}
	started := m.now()
	gen := v.nextGeneration(target.Info.NodeID)
	log := a.log.With("from_node", p.nodeID(), "generation", gen)
	log.Info("moving volume")
	// The reservation comes before the fence, and the source must grant
	// it: from then on the source's own record promises gen to the target,
	// so its node refuses to lift the fence for any controller instance
	// (an Unfence is refused while the node promised a newer generation to
	// another node), and any instance that reads a majority sees the
	// promise and must supersede it before lifting the fence, which voids
	// this promotion (docs/safety.md, "A publish to the source while a
	// move runs").
	if n, err := m.reserve(ctx, id, gen, target.Info.NodeID, v, grants{also: p.nodeID()}); n != goOn {
		return 0, n, err
	}
	fencedAt, err := m.sendFinal(ctx, id, p, target, v, log)
	if err != nil {
		m.Metrics.count("move", "failed")
		return 0, answer, err
	}
	err = m.promoteTarget(ctx, target, agentclient.Promotion{VolumeID: id, Generation: gen, NotBeforeUnixNano: fencedAt, SourceNodeID: p.nodeID()}, v)
	if err != nil {
		m.Metrics.count("move", "failed")
		return 0, answer, fmt.Errorf("promoting the copy on node %s: %w", target.Info.NodeID, err)
	}
	// The target is the primary now and the source a fenced, read-only copy
	// of an older generation: the workload need not wait for its demotion.
	// If it fails, the next publish or schedule round settles it. A move
	// job demotes before it ends, so the publish's retry finds the volume
	// settled.
	if a.inBackground {
		m.demote(id, p, gen, log)
	} else {
		m.background.spawn(func() { m.demote(id, p, gen, log) })
	}
	m.Metrics.count("move", "ok")
	m.Metrics.observeMove(m.now().Sub(started))
	log.Info("volume moved", "seconds", m.now().Sub(started).Seconds())
	return gen, answer, nil
}

// promoteTarget promotes the move's target, asking again while the
// target's copy is busy (Aborted: the tidy after the final receive still
// holds it, which took over ten seconds on a node busy with a drain's
// other moves): the source is fenced by now, and giving up would leave
// the move to do again after the CO's backoff.
func (m *Migrator) promoteTarget(ctx context.Context, target cluster.Node, p agentclient.Promotion, v view) error {
	for busy := 0; ; busy++ {
		cctx, cancel := m.call(ctx, v)
		_, err := target.Agent.Promote(cctx, p)
		cancel()
		if !errors.Is(err, errdefs.ErrAborted) || busy >= maxBusyPromotions {
			return err
		}
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
	}
}

// maxBusyPromotions bounds the times a move asks a busy target again.
const maxBusyPromotions = 10

// demoteTimeout bounds the demotion that follows a move.
const demoteTimeout = time.Minute

func (m *Migrator) demote(id string, p copyOn, gen uint64, log hclog.Logger) {
	ctx, cancel := context.WithTimeout(m.background.context(), demoteTimeout)
	defer cancel()
	if _, err := p.node.Agent.Demote(ctx, agentclient.Demotion{VolumeID: id, Generation: gen}); err != nil {
		log.Warn("the old primary is not demoted yet; it stays fenced and is settled later", "error", err)
	}
}

// sendFinal fences the primary for the move and pushes it to the target
// until the target holds a snapshot taken after the fence (a push may
// first finish an older, interrupted transfer); it returns the fence's
// time. Every push fences: the first one up keeps its time.
func (m *Migrator) sendFinal(ctx context.Context, id string, p copyOn, target cluster.Node, v view, log hclog.Logger) (int64, error) {
	m.yieldFlush(ctx, id, target.Info.NodeID, log)
	busy := 0
	for attempt := 0; attempt < 3; attempt++ {
		last, err := p.node.Agent.MoveFinal(ctx, id, target.Addr, target.Info.NodeID)
		if errors.Is(err, errdefs.ErrAborted) && busy < maxBusyWaits {
			// A scheduled push of the volume holds it: it ends soon.
			busy++
			attempt--
			if err := sleep(ctx, time.Second); err != nil {
				return 0, err
			}
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("fencing volume %s on node %s and sending it to node %s: %w", id, p.nodeID(), target.Info.NodeID, err)
		}
		fencedAt := last.FencedAt
		if fencedAt == 0 {
			return 0, fmt.Errorf("%w: node %s pushed volume %s without fencing it (a zfs-node older than the controller?): upgrade zfs-node there, then retry",
				errdefs.ErrFailedPrecondition, p.nodeID(), id)
		}
		log.Info("final snapshot sent", "kind", last.Kind, "bytes", last.Bytes, "snapshot", last.Snapshot)
		if at, ok := contract.ReplicationSnapshotTime(last.Snapshot); ok && at >= fencedAt {
			return fencedAt, nil // the promotion checks it again on the target
		}
		cctx, cancel := m.call(ctx, v)
		c, err := target.Agent.GetCopy(cctx, id)
		cancel()
		if err != nil {
			return 0, err
		}
		if c.LastSnapshotUnixNano >= fencedAt {
			return fencedAt, nil
		}
	}
	return 0, errdefs.Wrap(errdefs.ErrAborted, "node %s has no snapshot of volume %s newer than its fence after 3 pushes; retry", target.Info.NodeID, id)
}

// maxBusyWaits bounds the seconds a move waits for other transfers of the
// volume to end.
const maxBusyWaits = 60

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (m *Migrator) unfence(ctx context.Context, id string, p copyOn, log hclog.Logger) error {
	cctx, cancel := m.cluster.Call(ctx)
	defer cancel()
	if _, err := p.node.Agent.Unfence(cctx, id, p.copy.Generation); err != nil {
		return fmt.Errorf("lifting the fence on node %s: %w", p.nodeID(), err)
	}
	if p.copy.MovingTo != "" {
		log.Info("move abandoned: the volume is published where it was")
	} else {
		log.Info("a majority shows the copy current: its lease's read-only lifted", "generation", p.copy.Generation)
	}
	return nil
}
