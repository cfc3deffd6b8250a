package provision

import (
	"context"
	"errors"
	"sort"

	"github.com/zfs-nomad/zfs-nomad/internal/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/vocab"
)

// FindSnapshot finds the snapshot on any node. NotFound only when every
// node answered that it holds none.
func (p *Provisioner) FindSnapshot(ctx context.Context, id string) (cluster.Located[agentclient.Snapshot], error) {
	if !vocab.IsSnapshotID(id) {
		return cluster.Located[agentclient.Snapshot]{}, errdefs.Wrap(errdefs.ErrNotFound, "snapshot %q does not exist (not a snapshot ID of this driver)", id)
	}
	return cluster.Find(ctx, p.cluster, "snapshot "+id, func(ctx context.Context, a cluster.Agent) (agentclient.Snapshot, error) {
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

// DeleteSnapshot deletes the snapshot from its node; a snapshot no node
// holds is deleted already.
func (p *Provisioner) DeleteSnapshot(ctx context.Context, id string) error {
	found, err := p.FindSnapshot(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	cctx, cancel := p.cluster.Call(ctx)
	defer cancel()
	if err := found.Node.Agent.DeleteSnapshot(cctx, id); err != nil {
		return err
	}
	p.log.Info("snapshot deleted", "snapshot_id", id, "volume_id", found.Object.SourceVolumeID)
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
	var all []agentclient.Snapshot
	for _, l := range listed {
		s := l.Object
		if (q.SnapshotID == "" || s.SnapshotID == q.SnapshotID) &&
			(q.SourceVolumeID == "" || s.SourceVolumeID == q.SourceVolumeID) {
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
