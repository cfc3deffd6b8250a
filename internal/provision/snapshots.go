package provision

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/zfs-nomad/zfs-nomad/internal/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/vocab"
)

// FindSnapshot finds a copy of the snapshot on any node. NotFound only
// when every node answered that it holds none.
func (p *Provisioner) FindSnapshot(ctx context.Context, id string) (cluster.Located[agentclient.Snapshot], error) {
	copies, err := p.SnapshotCopies(ctx, id)
	if err != nil {
		return cluster.Located[agentclient.Snapshot]{}, err
	}
	return copies[0], nil
}

// SnapshotCopies finds every copy of the snapshot: replication takes a
// CSI snapshot to each replica of its volume (docs/replication.md, "CSI
// snapshots"). They are sorted by node ID. An error when a node could
// not answer (it may hold one) and none did; NotFound only when every
// node answered that it holds none.
func (p *Provisioner) SnapshotCopies(ctx context.Context, id string) ([]cluster.Located[agentclient.Snapshot], error) {
	copies, _, err := p.snapshotCopies(ctx, id)
	return copies, err
}

// snapshotCopies is SnapshotCopies, with the errors of the nodes that did
// not answer even when others hold copies.
func (p *Provisioner) snapshotCopies(ctx context.Context, id string) ([]cluster.Located[agentclient.Snapshot], []error, error) {
	if !vocab.IsSnapshotID(id) {
		return nil, nil, errdefs.Wrap(errdefs.ErrNotFound, "snapshot %q does not exist (not a snapshot ID of this driver)", id)
	}
	found, errs, err := cluster.FindAll(ctx, p.cluster, func(ctx context.Context, a cluster.Agent) (agentclient.Snapshot, error) {
		snaps, err := a.ListSnapshots(ctx, agentclient.SnapshotQuery{SnapshotID: id})
		if err != nil {
			return agentclient.Snapshot{}, err
		}
		for _, s := range snaps {
			if s.SnapshotID == id {
				return s, nil
			}
		}
		return agentclient.Snapshot{}, errdefs.Wrap(errdefs.ErrNotFound, "snapshot %s", id)
	})
	switch {
	case err != nil:
		return nil, nil, err
	case len(found) == 0 && len(errs) > 0:
		return nil, errs, fmt.Errorf("%w: cannot tell where snapshot %s is: %v", errdefs.ErrUnavailable, id, errors.Join(errs...))
	case len(found) == 0:
		return nil, nil, errdefs.Wrap(errdefs.ErrNotFound, "snapshot %s", id)
	}
	sort.Slice(found, func(i, j int) bool { return found[i].Node.Info.NodeID < found[j].Node.Info.NodeID })
	return found, errs, nil
}

// CreateSnapshot snapshots the volume's current primary, or answers the
// snapshot of that name an earlier attempt made. Snapshot names are
// unique across the cluster, not per volume: the name taken by another
// volume's snapshot is AlreadyExists.
func (p *Provisioner) CreateSnapshot(ctx context.Context, name, sourceVolumeID string) (agentclient.Snapshot, error) {
	id := vocab.SnapshotIDForName(name)
	existing, err := p.FindSnapshot(ctx, id)
	if err == nil && existing.Object.SourceVolumeID != sourceVolumeID {
		return agentclient.Snapshot{}, errdefs.Wrap(errdefs.ErrAlreadyExists, "snapshot %q exists for volume %s, not %s", name, existing.Object.SourceVolumeID, sourceVolumeID)
	}
	if err == nil {
		return existing.Object, nil
	}
	if !errors.Is(err, errdefs.ErrNotFound) {
		return agentclient.Snapshot{}, err
	}
	found, err := p.CurrentVolume(ctx, sourceVolumeID)
	if err != nil {
		return agentclient.Snapshot{}, err
	}
	cctx, cancel := p.cluster.Call(ctx)
	defer cancel()
	snap, err := found.Node.Agent.CreateSnapshot(cctx, sourceVolumeID, name)
	if err != nil {
		return agentclient.Snapshot{}, err
	}
	p.log.Info("snapshot created", "volume_id", sourceVolumeID, "snapshot_id", snap.SnapshotID, "node_id", found.Node.Info.NodeID)
	return snap, nil
}

// DeleteSnapshot deletes every copy of the snapshot; a snapshot no node
// holds is deleted already. It answers OK only when every node answered:
// a copy on a node that did not would outlive a delete that said it was
// gone (Unavailable: the CO retries).
func (p *Provisioner) DeleteSnapshot(ctx context.Context, id string) error {
	copies, silent, err := p.snapshotCopies(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	nodes := make([]cluster.Node, 0, len(copies))
	for _, c := range copies {
		nodes = append(nodes, c.Node)
	}
	answers := cluster.Each(ctx, p.cluster, nodes, func(ctx context.Context, n cluster.Node) (struct{}, error) {
		return struct{}{}, n.Agent.DeleteSnapshot(ctx, id)
	})
	var errs []error
	for _, a := range answers {
		if a.Err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", a.Node.Info.NodeID, a.Err))
			continue
		}
		p.log.Info("snapshot deleted", "snapshot_id", id, "volume_id", copies[0].Object.SourceVolumeID, "node_id", a.Node.Info.NodeID)
	}
	if len(errs) > 0 {
		return fmt.Errorf("snapshot %s is not deleted everywhere; retry the delete: %w", id, errors.Join(errs...))
	}
	if len(silent) > 0 {
		return fmt.Errorf("%w: snapshot %s is deleted on the nodes that hold it, but a node that does not answer may hold a copy (%v); retry once it is back, or take it out of the controller's peers if it is gone for good",
			errdefs.ErrUnavailable, id, errors.Join(silent...))
	}
	return nil
}

// SnapshotQuery selects snapshots: one by ID, those of a source volume,
// or all (empty fields select all), a page of them.
type SnapshotQuery struct {
	SnapshotID     string
	SourceVolumeID string
	Page
}

// SnapshotPage is one page of the cluster's snapshots, sorted by ID;
// NextToken starts the next page (empty after the last).
type SnapshotPage struct {
	Snapshots []agentclient.Snapshot
	NextToken string
}

// ListSnapshots pages like ListVolumes: each node answers its first
// MaxEntries+1 snapshots from the token on, of the source volume when
// one is given (or the one snapshot asked for).
func (p *Provisioner) ListSnapshots(ctx context.Context, q SnapshotQuery) (SnapshotPage, error) {
	if token := q.StartingToken; token != "" && !vocab.IsSnapshotID(token) {
		return SnapshotPage{}, errBadToken(token)
	}
	nodeReq := agentclient.SnapshotQuery{SnapshotID: q.SnapshotID, From: q.StartingToken, SourceVolumeID: q.SourceVolumeID}
	if q.MaxEntries > 0 {
		nodeReq.MaxEntries = uint32(q.MaxEntries) + 1
	}
	listed, err := fromEveryNode(ctx, p, "snapshots", func(ctx context.Context, n cluster.Node) ([]agentclient.Snapshot, error) {
		return n.Agent.ListSnapshots(ctx, nodeReq)
	})
	if err != nil {
		return SnapshotPage{}, err
	}
	// A snapshot is listed once, however many nodes hold a copy: the
	// copies are the same snapshot (same data, size and creation time).
	var all []agentclient.Snapshot
	seen := map[string]bool{}
	for _, l := range listed {
		s := l.Object
		if (q.SnapshotID == "" || s.SnapshotID == q.SnapshotID) &&
			(q.SourceVolumeID == "" || s.SourceVolumeID == q.SourceVolumeID) && !seen[s.SnapshotID] {
			seen[s.SnapshotID] = true
			all = append(all, s)
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].SnapshotID < all[j].SnapshotID })
	page, next, err := paginate(all, func(s agentclient.Snapshot) string { return s.SnapshotID }, q.StartingToken, q.MaxEntries, vocab.IsSnapshotID)
	if err != nil {
		return SnapshotPage{}, err
	}
	return SnapshotPage{Snapshots: page, NextToken: next}, nil
}
