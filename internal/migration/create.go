package migration

import (
	"context"
	"errors"

	"github.com/zfs-nomad/zfs-nomad/internal/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/errdefs"
)

// ReserveCreation chooses the node a new volume is created on, and has a
// majority of the nodes promise that node generation 1 before anything is
// created: a create whose answer was lost, retried while that node is
// silent, or one racing another controller, can then never make a second
// primary of generation 1 on another node (I3, docs/safety.md
// "Generations"; the fault-injection simulation found it). candidates are
// the node IDs the placement allows, best first.
//
// A node an earlier attempt was promised is the only choice: while it is
// silent the create answers Unavailable, and the CO's retry finds the
// volume there once it answers. A copy that exists already (on a node
// that answered) is returned as it is.
func (m *Migrator) ReserveCreation(ctx context.Context, id string, candidates []string) (cluster.Node, error) {
	for step := 0; step < maxSteps; step++ {
		v, err := m.gather(ctx, id)
		if err != nil {
			return cluster.Node{}, err
		}
		if !v.quorum() {
			return cluster.Node{}, m.noQuorum(id, v)
		}
		if len(v.copies) > 0 {
			return v.copies[0].node, nil
		}
		n, err := v.creationNode(id, candidates)
		if err != nil {
			return cluster.Node{}, err
		}
		// A majority may not have granted an earlier attempt's promise:
		// granting the same one again is idempotent.
		err = m.reserve(ctx, id, 1, n.Info.NodeID, v, false, false, false)
		if errors.Is(err, errRetry) {
			continue
		}
		if err != nil {
			return cluster.Node{}, err
		}
		return n, nil
	}
	return cluster.Node{}, errdefs.Wrap(errdefs.ErrAborted, "creating volume %s raced other creations %d times; retry", id, maxSteps)
}

// creationNode is the node to create a volume no node holds on: the one
// an earlier attempt was promised (the holder of the highest promise),
// which must have answered, or else the first candidate that answered.
func (v view) creationNode(id string, candidates []string) (cluster.Node, error) {
	var best promised
	for _, p := range v.promises {
		if p.generation > best.generation {
			best = p
		}
	}
	if best.generation > 0 {
		n, answered := v.node(best.holder)
		if !answered {
			return cluster.Node{}, errdefs.Wrap(errdefs.ErrUnavailable, "an earlier attempt to create volume %s chose node %s, which does not answer; retry once it does (the volume may be there)", id, best.holder)
		}
		return n, nil
	}
	for _, c := range candidates {
		if n, ok := v.node(c); ok {
			return n, nil
		}
	}
	return cluster.Node{}, errdefs.Wrap(errdefs.ErrUnavailable, "none of the nodes chosen for volume %s answered; retry", id)
}
