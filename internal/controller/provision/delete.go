package provision

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
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
// Before it removes anything, every node promises a generation above
// every copy and promise of the volume to its deletion
// (contract.DeletionHolder), and then refuses every other reservation: no
// copy can be promoted or created from then on, by a move's final step or
// a failover another controller instance runs, so the look taken after it
// finds every primary there will be. A look before it could miss a
// promotion landing meanwhile (another controller instance's), and the
// delete would answer OK over a primary (docs/safety.md, G9).
//
// The replicas go before the primary, and the nodes' promises last: a
// delete that fails midway leaves the primary, so the CO's retry finds
// the volume as it was (a publish before it is refused while the
// deletion's promise stands). A mounted primary is refused before
// anything is reserved.
func (p *Provisioner) Delete(ctx context.Context, id string) error {
	if !contract.IsVolumeID(id) {
		return nil
	}
	if err := p.notMoving(id); err != nil {
		return err
	}
	before, err := p.look(ctx, id)
	if err != nil {
		return err
	}
	if !before.anything {
		return nil // no copy and no promise anywhere: nothing to delete
	}
	if err := before.refuseMounted(id); err != nil {
		return err
	}
	if err := p.migrator.ReserveDeletion(ctx, id, before.nodes, before.copies); err != nil {
		return err
	}
	now, err := p.look(ctx, id)
	if err != nil {
		return err
	}
	if err := now.refuseMounted(id); err != nil {
		return fmt.Errorf("%w (the delete has reserved the volume, so nothing else is done with it until the delete is retried)", err)
	}
	if len(now.primaries) > 0 {
		newest := now.primaries[0]
		for _, stale := range now.primaries[1:] {
			if err := p.setAside(ctx, id, stale.Node, newest.Object.Generation); err != nil {
				return err
			}
		}
	}
	if err := p.deleteReplicas(ctx, id, now.nodes, false); err != nil {
		return err
	}
	if len(now.primaries) > 0 {
		newest := now.primaries[0]
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
	// that replica take again a generation a deleted copy held (I3,
	// docs/safety.md). A replica a push landed since the first pass goes
	// here too.
	return p.deleteReplicas(ctx, id, now.nodes, true)
}

// deletionLook is what every node holds of a volume being deleted.
type deletionLook struct {
	nodes     []cluster.Node
	primaries []cluster.Answer[agentclient.Copy] // newest generation first
	// copies are every node's answers: its copy and its promise.
	copies   []agentclient.Copy
	anything bool // a node holds a copy or a promise
}

// look asks every node for its copy of id; every node must answer.
func (p *Provisioner) look(ctx context.Context, id string) (deletionLook, error) {
	answers, unreachable, err := cluster.Ask(ctx, p.cluster, func(ctx context.Context, a cluster.Agent) (agentclient.Copy, error) {
		return a.GetCopy(ctx, id)
	})
	if err != nil {
		return deletionLook{}, err
	}
	var l deletionLook
	var silent []string
	for _, a := range answers {
		if a.Err != nil {
			silent = append(silent, fmt.Sprintf("node %s: %v", a.Node.Info.NodeID, a.Err))
			continue
		}
		l.nodes = append(l.nodes, a.Node)
		c := a.Object
		l.copies = append(l.copies, c)
		if c.Exists && c.Role == contract.RolePrimary {
			l.primaries = append(l.primaries, a)
		}
		l.anything = l.anything || c.Exists || c.PromisedGeneration > 0
	}
	for _, u := range unreachable {
		silent = append(silent, fmt.Sprintf("agent %s: %v", u.Addr, u.Err))
	}
	if unlisted := cluster.Unlisted(l.nodes, len(silent)); unlisted != "" {
		silent = append(silent, unlisted)
	}
	if len(silent) > 0 {
		return deletionLook{}, fmt.Errorf("%w: volume %s is not deleted: a node that does not answer may hold a copy (%s); retry once it is back, or take it out of the controller's peers if it is gone for good",
			errdefs.ErrUnavailable, id, strings.Join(silent, "; "))
	}
	sort.Slice(l.primaries, func(i, j int) bool { return l.primaries[i].Object.Generation > l.primaries[j].Object.Generation })
	return l, nil
}

// refuseMounted refuses to delete a volume whose newest primary is
// mounted: the CO unpublishes it first.
func (l deletionLook) refuseMounted(id string) error {
	if len(l.primaries) > 0 && l.primaries[0].Object.Mounted {
		return errdefs.Wrap(errdefs.ErrFailedPrecondition, "volume %s is mounted on node %s; unpublish it first", id, l.primaries[0].Node.Info.NodeID)
	}
	return nil
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
