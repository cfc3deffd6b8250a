package provision

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/zfs-nomad/zfs-nomad/internal/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/vocab"
)

// Delete removes every copy of a volume, or answers an error and leaves
// what it could not remove for a retry. It answers OK only when every
// node answered: a copy on a node that did not (a primary lost with
// writes the others lack, or a replica) would outlive a delete that said
// it was gone, and a later create of the same name would adopt it
// (docs/safety.md). Older primaries are set aside, never destroyed: they
// may hold writes the newest lacks. An ID that is no volume ID of this
// driver names no volume, so there is none to delete.
//
// The replicas go before the primary, and the nodes' promises last: a
// delete that fails midway leaves the primary, so a publish before the
// CO's retry finds the volume as it was. Deleting the primary first left
// replicas without one, and such a publish failed the volume over to a
// leftover replica, bringing back a volume the CO was deleting (issue
// 35). A mounted primary is refused before anything goes.
func (p *Provisioner) Delete(ctx context.Context, id string) error {
	if !vocab.IsVolumeID(id) {
		return nil
	}
	if err := p.notMoving(id); err != nil {
		return err
	}
	answers, unreachable, err := cluster.Ask(ctx, p.cluster, func(ctx context.Context, a cluster.Agent) (agentclient.Copy, error) {
		return a.GetCopy(ctx, id)
	})
	if err != nil {
		return err
	}
	var silent []string
	var primaries []cluster.Answer[agentclient.Copy]
	for _, a := range answers {
		switch {
		case a.Err != nil:
			silent = append(silent, fmt.Sprintf("node %s: %v", a.Node.Info.NodeID, a.Err))
		case a.Object.Exists && a.Object.Role == vocab.RolePrimary:
			primaries = append(primaries, a)
		}
	}
	for _, u := range unreachable {
		silent = append(silent, fmt.Sprintf("agent %s: %v", u.Addr, u.Err))
	}
	if len(silent) > 0 {
		return fmt.Errorf("%w: volume %s is not deleted: a node that does not answer may hold a copy (%s); retry once it is back, or take it out of the controller's peers if it is gone for good",
			errdefs.ErrUnavailable, id, strings.Join(silent, "; "))
	}
	sort.Slice(primaries, func(i, j int) bool { return primaries[i].Object.Generation > primaries[j].Object.Generation })
	if len(primaries) > 0 {
		newest := primaries[0]
		if newest.Object.Mounted {
			return errdefs.Wrap(errdefs.ErrFailedPrecondition, "volume %s is mounted on node %s; unpublish it first", id, newest.Node.Info.NodeID)
		}
		for _, stale := range primaries[1:] {
			if err := p.setAside(ctx, id, stale.Node, newest.Object.Generation); err != nil {
				return err
			}
		}
	}
	var nodes []cluster.Node
	for _, a := range answers {
		nodes = append(nodes, a.Node)
	}
	if err := p.deleteReplicas(ctx, id, nodes, false); err != nil {
		return err
	}
	if len(primaries) > 0 {
		newest := primaries[0]
		cctx, cancel := p.cluster.Call(ctx)
		err := newest.Node.Agent.DeleteVolume(cctx, id)
		cancel()
		if err != nil {
			return err
		}
		p.log.Info("volume deleted", "volume_id", id, "node_id", newest.Node.Info.NodeID)
	}
	// Every copy goes before any node forgets the generation it promised:
	// a promise forgotten while a replica is left would let a failover of
	// that replica take again a generation a deleted copy held (I3; the
	// simulation found it in a sweep of 5000 seeds, docs/safety.md). A
	// replica a push landed since the first pass goes here too.
	return p.deleteReplicas(ctx, id, nodes, true)
}

// setAside retires an older primary of a volume being deleted: renamed,
// read-only, kept for an operator.
func (p *Provisioner) setAside(ctx context.Context, id string, n cluster.Node, generation uint64) error {
	cctx, cancel := p.cluster.Call(ctx)
	defer cancel()
	if _, err := n.Agent.Demote(cctx, agentclient.Demotion{VolumeID: id, Generation: generation, Aside: true}); err != nil {
		return fmt.Errorf("volume %s is not deleted: setting aside its older primary on node %s: %w", id, n.Info.NodeID, err)
	}
	p.log.Warn("an older primary of the deleted volume is set aside, not destroyed: it may hold writes the newest lacked",
		"volume_id", id, "node_id", n.Info.NodeID)
	return nil
}

// deleteReplicas removes the replicas of a deleted volume from nodes
// (every node: the caller made sure all answered), and with forget has
// each node forget the generation it promised for the volume first; it
// fails (the CO retries the delete) if one cannot be removed.
func (p *Provisioner) deleteReplicas(ctx context.Context, id string, nodes []cluster.Node, forget bool) error {
	var errs []error
	answers := cluster.Each(ctx, p.cluster, nodes, func(ctx context.Context, n cluster.Node) (bool, error) {
		return n.Agent.DeleteReplica(ctx, id, forget)
	})
	for _, a := range answers {
		switch {
		case a.Err != nil:
			errs = append(errs, fmt.Errorf("node %s: %w", a.Node.Info.NodeID, a.Err))
		case a.Object: // the node held a replica
			p.log.Info("replica deleted", "volume_id", id, "node_id", a.Node.Info.NodeID)
		}
	}
	if len(errs) > 0 && !forget {
		return fmt.Errorf("%w: volume %s is not deleted: some of its replicas could not be removed (%v); retry the delete", errdefs.ErrUnavailable, id, errors.Join(errs...))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: volume %s is deleted but some of its replicas may remain (%v); retry the delete", errdefs.ErrUnavailable, id, errors.Join(errs...))
	}
	return nil
}
