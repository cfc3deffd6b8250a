package migration

import (
	"context"
	"fmt"
	"strings"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// ReserveDeletion has every node of nodes promise volume id's deletion
// (contract.DeletionHolder) the generation deletionGeneration chooses from
// copies, every node's answer to a look that all of them answered. From
// then on every node refuses every other reservation of the volume, so no
// copy is promoted or created while the delete removes them (docs/safety.md,
// G9). A refusal means a move, failover or creation reserved a newer
// generation since the look: the CO's retry looks again.
//
// Every generation of a volume is reserved in this package: a creation's
// first (ReserveCreation), a promotion's (reserve), a deletion's (here).
func (m *Migrator) ReserveDeletion(ctx context.Context, id string, nodes []cluster.Node, copies []agentclient.Copy) error {
	generation := deletionGeneration(copies)
	set, err := cluster.Witnesses(nodes)
	if err != nil {
		return err
	}
	r := agentclient.Reservation{VolumeID: id, Generation: generation, HolderNodeID: contract.DeletionHolder, WitnessDigest: set.Digest()}
	answers := cluster.Each(ctx, m.cluster, nodes, func(ctx context.Context, n cluster.Node) (agentclient.Promise, error) {
		return n.Agent.Reserve(ctx, r)
	})
	var refusals []string
	for _, a := range answers {
		switch {
		case a.Err != nil:
			refusals = append(refusals, fmt.Sprintf("node %s: %v", a.Node.Info.NodeID, a.Err))
		case !a.Object.Granted:
			refusals = append(refusals, fmt.Sprintf("node %s promised generation %d to %s", a.Node.Info.NodeID, a.Object.PromisedGeneration, a.Object.PromisedHolder))
		}
	}
	if len(refusals) > 0 {
		return errdefs.Wrap(errdefs.ErrAborted, "volume %s is not deleted: reserving generation %d for its deletion on every node failed (%s); a move, failover or creation of it may have raced the delete: retry the delete",
			id, generation, strings.Join(refusals, "; "))
	}
	m.log.Debug("generation reserved for the deletion", "volume_id", id, "generation", generation)
	return nil
}

// deletionGeneration is the generation a deletion reserves, given every
// node's copy and promise: one above every copy and promise, or the
// deletion's own when it is the newest already (a retried or concurrent
// delete of the volume, which every node grants again at its generation).
func deletionGeneration(copies []agentclient.Copy) uint64 {
	var top, deletion uint64 // the highest generation, and the deletion's
	for _, c := range copies {
		if c.Exists {
			top = max(top, c.Generation)
		}
		top = max(top, c.PromisedGeneration)
		if c.PromisedHolder == contract.DeletionHolder {
			deletion = max(deletion, c.PromisedGeneration)
		}
	}
	if deletion == top && top > 0 {
		return top
	}
	return top + 1
}
