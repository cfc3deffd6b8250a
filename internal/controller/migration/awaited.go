package migration

import (
	"context"
	"errors"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// A publish granted ahead of a move's end gets no retry from the CO: its
// node's stage waits for the promotion instead. The move runs in the
// memory of the controller instance that granted it; if that instance
// dies (or, with one instance, restarts), nothing would finish the move
// and the stage would wait until Nomad gave the allocation up. So the
// nodes report their stages that wait (NodeInfo.AwaitedPromotions), and
// the instance that holds the work lease finishes a move awaited for
// longer than AdoptAwaitedAfter: it publishes the volume on the waiting
// node as the CO's retry would, which resumes what the dead instance
// sent, and lets the move try again itself, as a move granted ahead does.

// AdoptAwaitedAfter is how long a stage must have waited for a move's
// promotion before the instance holding the work lease finishes the move
// itself: a move that runs shows its push on the source meanwhile, and
// one that ended would have promoted the copy.
const AdoptAwaitedAfter = 20 * time.Second

// FinishAwaitedMoves finishes the moves that stages wait for and no
// instance runs (see above). It is the background work of the instance
// holding the work lease, run every few seconds.
func (m *Migrator) FinishAwaitedMoves(ctx context.Context) {
	nodes, err := cluster.Waiting(ctx, m.cluster)
	if err != nil {
		return
	}
	for _, n := range nodes {
		for _, w := range n.Info.AwaitedPromotions {
			if w.Waiting < AdoptAwaitedAfter {
				continue
			}
			if _, running := m.jobs.running(w.VolumeID); running {
				continue // this instance moves it
			}
			m.finishAwaited(ctx, w.VolumeID, n.Info.NodeID, w.Waiting)
		}
	}
}

// finishAwaited publishes volume id on nodeID, whose stage has waited for
// its move's promotion that long, unless another instance's push of the
// volume still runs on its primary's node.
func (m *Migrator) finishAwaited(ctx context.Context, id, nodeID string, waited time.Duration) {
	log := m.log.With("volume_id", id, "node_id", nodeID)
	source, _, err := m.Current(ctx, id)
	if err != nil {
		log.Debug("a stage waits for the volume's move, whose primary cannot be decided now", "error", err)
		return
	}
	if source.Info.NodeID == nodeID {
		return // promoted: the stage finds it at its next look
	}
	if busy, err := pushing(ctx, m.cluster, source, id); err != nil || busy {
		return // the instance that started the move still runs it
	}
	log.Info("a stage has waited for the volume's move here, and no controller instance runs it: finishing it as the publish's retry would",
		"waited", waited.Round(time.Second), "from_node", source.Info.NodeID)
	_, running, err := m.publish(ctx, id, nodeID)
	if j := m.findJob(id, nodeID); j != nil {
		j.grantedAhead(m.now()) // no retry will start it again: it tries again itself
	}
	switch {
	case err == nil:
		log.Info("the awaited move ended: the node's stage finds the volume promoted")
	case running != nil:
		log.Info("the awaited move runs in the background", "progress", err)
	case errors.Is(err, errdefs.ErrFailedPrecondition), errdefs.Temporary(err):
		log.Info("the awaited move cannot be finished yet; the next pass tries again", "error", err)
	default:
		log.Warn("the awaited move failed", "error", err)
	}
}

// pushing reports whether node is pushing volume id now (a catch-up, a
// final step, the schedule's or an operator's push).
func pushing(ctx context.Context, c *cluster.Cluster, node cluster.Node, id string) (bool, error) {
	transfers, err := transfersOf(ctx, c, node, id)
	return len(transfers) > 0, err
}

// transfersOf returns node's pushes of volume id running now.
func transfersOf(ctx context.Context, c *cluster.Cluster, node cluster.Node, id string) ([]agentclient.Transfer, error) {
	ctx, cancel := c.Call(ctx)
	defer cancel()
	st, err := node.Agent.Status(ctx)
	if err != nil {
		return nil, err
	}
	var out []agentclient.Transfer
	for _, t := range st.Transfers {
		if t.VolumeID == id {
			out = append(out, t)
		}
	}
	return out, nil
}
