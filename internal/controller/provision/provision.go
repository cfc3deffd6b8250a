// Package provision is the controller's logic of volumes and snapshots:
// creating a volume where it belongs (or finding the one a retried create
// made), deleting every copy of one, listing them across the nodes, and
// snapshots and expansion. It asks the node agents through package
// cluster and decides from their answers (and from package migration's
// view of a volume's current primary), in plain Go types: the CSI
// controller service (csiserver) translates CSI requests into its
// calls and its results back, and the logic is tested against the
// in-memory agents of clustertest.Fakes.
package provision

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/migration"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// Provisioner creates, deletes and lists volumes and snapshots by asking
// the node agents; it holds no state of its own.
type Provisioner struct {
	cluster  *cluster.Cluster
	migrator *migration.Migrator
	policy   string
	log      hclog.Logger
	targets  Targets // nil: no backup targets
}

// Targets are the backup targets a volume is restored from
// (agentclient.Targets, docs/backups.md).
type Targets interface {
	Names() []string
	Backups(ctx context.Context, target, volumeID string) ([]agentclient.Backup, error)
	Backup(ctx context.Context, ref contract.BackupRef) (agentclient.Backup, error)
	GrantRestore(ctx context.Context, ref contract.BackupRef, nodeID string) (string, error)
}

// UseTargets gives the provisioner the backup targets volumes are
// restored from.
func (p *Provisioner) UseTargets(t Targets) { p.targets = t }

// New returns a Provisioner over the cluster's agents; m decides a
// volume's current primary and reserves a new volume's node, and policy
// names the placement policy of new volumes.
func New(c *cluster.Cluster, m *migration.Migrator, policy string, log hclog.Logger) *Provisioner {
	return &Provisioner{cluster: c, migrator: m, policy: policy, log: log}
}

// CreateRequest asks for a volume. At most one of SourceSnapshotID and
// SourceVolumeID is set: the volume is then a clone made on its source's
// node.
type CreateRequest struct {
	contract.VolumeRequest
	// Requisite and Preferred are topologies: the volume must go to a
	// node matching one of Requisite (when given), preferably the first
	// of Preferred it can.
	Requisite []map[string]string
	Preferred []map[string]string
}

// Create creates the volume req names, or answers the one an earlier
// attempt made (its node decides whether req is compatible), with the
// node that holds it.
func (p *Provisioner) Create(ctx context.Context, req CreateRequest) (agentclient.Volume, cluster.Node, error) {
	id := contract.VolumeIDForName(req.Name)
	log := p.log.With("volume_id", id, "name", req.Name)
	agentReq := agentclient.NewVolume{
		Name:             req.Name,
		RequiredBytes:    req.RequiredBytes,
		LimitBytes:       req.LimitBytes,
		Parameters:       req.Parameters,
		SourceSnapshotID: req.SourceSnapshotID,
		SourceVolumeID:   req.SourceVolumeID,
		Passphrase:       req.Passphrase,
	}
	// One question to each node: what it holds of the volume, and its
	// capacity. A volume of this name may exist already (a retried call):
	// its node decides whether the request is compatible, the source
	// included. Otherwise the volume is placed among the nodes that
	// answered, and its first generation reserved from what they hold.
	look, err := p.migrator.LookForCreation(ctx, id)
	if err != nil {
		return agentclient.Volume{}, cluster.Node{}, err
	}
	if existing, ok := look.Primary(); ok {
		return p.createOn(ctx, existing, agentReq, log)
	}

	ref, fromBackup := contract.ParseBackupID(req.SourceSnapshotID)
	if fromBackup {
		// Before anything is reserved: a backup that is not there is
		// NotFound, as a snapshot that is not is.
		if err := p.checkBackup(ctx, ref, req.Parameters); err != nil {
			return agentclient.Volume{}, cluster.Node{}, err
		}
	}
	candidates, err := p.candidates(ctx, req, look.Nodes())
	if silent := look.Silent(); errors.Is(err, cluster.ErrNoMatchingNode) && silent != "" {
		// The node that matches may be one that did not answer (a
		// create pinned to a node whose zfs-node restarts): a retry
		// finds it once it answers.
		return agentclient.Volume{}, cluster.Node{}, errdefs.Wrap(errdefs.ErrUnavailable, "%v; not answering: %s: retry once they answer", err, silent)
	}
	if err != nil {
		return agentclient.Volume{}, cluster.Node{}, err
	}
	ids := make([]string, 0, len(candidates))
	for _, n := range candidates {
		ids = append(ids, n.Info.NodeID)
	}
	// Generation 1 is promised to one node by a majority before it is
	// created there, so a retry after a lost answer never makes a second
	// volume on another node (a silent node answers Unavailable instead).
	node, err := p.migrator.ReserveCreation(ctx, id, ids, look)
	if err != nil {
		return agentclient.Volume{}, cluster.Node{}, err
	}
	if fromBackup {
		// The node fetches the backup from its target showing this grant.
		if agentReq.RestoreGrant, err = p.targets.GrantRestore(ctx, ref, node.Info.NodeID); err != nil {
			return agentclient.Volume{}, node, fmt.Errorf("granting node %s the restore of %s: %w", node.Info.NodeID, ref.SnapshotID(), err)
		}
	}
	return p.createOn(ctx, node, agentReq, log)
}

// checkBackup checks that the backup a volume is restored from is on its
// target, and that the restore presents its volume's owner secret, if the
// volume had one (params carry the secret's digest): a restored volume
// has its backup's owner, as a clone has its source's.
func (p *Provisioner) checkBackup(ctx context.Context, ref contract.BackupRef, params map[string]string) error {
	if p.targets == nil {
		return errdefs.Wrap(errdefs.ErrNotFound, "snapshot %s is a backup on target %s, and this controller knows no backup targets (backup_targets, docs/backups.md)", ref.SnapshotID(), ref.Target)
	}
	b, err := p.targets.Backup(ctx, ref)
	if err != nil {
		return err
	}
	return contract.CheckSameOwner("backup "+ref.SnapshotID(), b.Parameters, params)
}

func (p *Provisioner) createOn(ctx context.Context, n cluster.Node, req agentclient.NewVolume, log hclog.Logger) (agentclient.Volume, cluster.Node, error) {
	cctx, cancel := p.cluster.CallCreate(ctx)
	defer cancel()
	v, err := n.Agent.CreateVolume(cctx, req)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return agentclient.Volume{}, n, fmt.Errorf("creating volume %q on node %s did not finish in time (%w); the node may still finish it: retry, and the create answers the volume once it exists",
			req.Name, n.Info.NodeID, err)
	case err != nil:
		return agentclient.Volume{}, n, fmt.Errorf("creating volume %q on node %s: %w", req.Name, n.Info.NodeID, err)
	}
	log.Info("volume ready", "node_id", n.Info.NodeID, "capacity", v.CapacityBytes)
	return v, n, nil
}

// candidates returns the nodes among nodes (those that answered, with
// their capacity) a new volume may go to, best first. A volume made from
// a snapshot or another volume must live where its source does: on a
// node holding a copy of the snapshot (replicas hold them too), on the
// node of the volume's primary.
func (p *Provisioner) candidates(ctx context.Context, req CreateRequest, nodes []cluster.Node) ([]cluster.Node, error) {
	var holders []string // nil: no source
	switch {
	case contract.IsBackupID(req.SourceSnapshotID):
		// A backup is restored onto any node: its target sends it there.
	case req.SourceSnapshotID != "":
		copies, err := p.SnapshotCopies(ctx, req.SourceSnapshotID)
		if err != nil {
			return nil, err
		}
		for _, c := range copies {
			holders = append(holders, c.Node.Info.NodeID)
		}
	case req.SourceVolumeID != "":
		v, err := p.CurrentVolume(ctx, req.SourceVolumeID)
		if err != nil {
			return nil, err
		}
		holders = []string{v.Node.Info.NodeID}
	}
	pinned := req.Parameters[contract.ParamNode]
	if holders != nil && pinned != "" && !slices.Contains(holders, pinned) {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "parameter node=%s conflicts with the source, which lives on node %s (clones are made where their source is)", pinned, strings.Join(holders, ", "))
	}

	size := req.RequiredBytes
	if size == 0 {
		size = 1 // the node applies its default size; placement only needs a node with room
	}
	return cluster.PlaceNodes(cluster.Healthy(nodes), cluster.Requirement{
		Bytes:     size,
		Requisite: req.Requisite,
		Preferred: req.Preferred,
		Node:      pinned,
		Among:     holders,
		Policy:    p.policy,
	})
}

// FindVolume finds the volume on any node: the newest generation when two
// hold a primary. NotFound only when every node answered that it holds
// none.
func (p *Provisioner) FindVolume(ctx context.Context, id string) (cluster.Located[agentclient.Volume], error) {
	if !contract.IsVolumeID(id) {
		return cluster.Located[agentclient.Volume]{}, errdefs.Wrap(errdefs.ErrNotFound, "volume %q does not exist (not a volume ID of this driver)", id)
	}
	return cluster.Find(ctx, p.cluster, "volume "+id, getVolume(id), newestGeneration)
}

// getVolume asks a node for its primary of volume id.
func getVolume(id string) func(context.Context, cluster.Agent) (agentclient.Volume, error) {
	return func(ctx context.Context, a cluster.Agent) (agentclient.Volume, error) { return a.GetVolume(ctx, id) }
}

// newestGeneration picks the newest of two primaries of a volume: between
// a move's promotion and the demotion of the old copy, two nodes hold
// one, and the newest generation is the volume.
func newestGeneration(a, b agentclient.Volume) bool { return a.Generation > b.Generation }

// CurrentVolume finds the volume on the node of its current primary, as a
// publish decides it (Migrator.Current): with the newest copy's node
// silent it answers Unavailable instead of a stale copy. Everything that
// acts on the volume's data or reports its state uses it.
func (p *Provisioner) CurrentVolume(ctx context.Context, id string) (cluster.Located[agentclient.Volume], error) {
	if !contract.IsVolumeID(id) {
		return cluster.Located[agentclient.Volume]{}, errdefs.Wrap(errdefs.ErrNotFound, "volume %q does not exist (not a volume ID of this driver)", id)
	}
	node, _, err := p.migrator.Current(ctx, id)
	if err != nil {
		return cluster.Located[agentclient.Volume]{}, err
	}
	cctx, cancel := p.cluster.Call(ctx)
	defer cancel()
	v, err := node.Agent.GetVolume(cctx, id)
	if err != nil {
		return cluster.Located[agentclient.Volume]{}, err
	}
	return cluster.Located[agentclient.Volume]{Node: node, Object: v}, nil
}

// Expand sets the volume's quota on its current primary and returns its
// new capacity. A quota change is effective at once, mounted or not.
func (p *Provisioner) Expand(ctx context.Context, id string, requiredBytes, limitBytes uint64) (uint64, error) {
	if err := p.notMoving(id); err != nil {
		return 0, err
	}
	found, err := p.CurrentVolume(ctx, id)
	if err != nil {
		return 0, err
	}
	cctx, cancel := p.cluster.Call(ctx)
	defer cancel()
	return found.Node.Agent.ExpandVolume(cctx, id, requiredBytes, limitBytes)
}

// Capacity is what the healthy nodes matching a topology (and the node a
// volume is pinned to, if any) offer new volumes: their free space in
// all, and the largest volume one of them can take.
type Capacity struct {
	AvailableBytes uint64
	MaxVolumeBytes uint64
}

// CapacityOf sums the capacity of the healthy nodes matching topology
// (nil: any) and pinnedNode (empty: any).
func (p *Provisioner) CapacityOf(ctx context.Context, topology map[string]string, pinnedNode string) (Capacity, error) {
	nodes, _, err := p.cluster.Nodes(ctx)
	if err != nil {
		return Capacity{}, err
	}
	var c Capacity
	for _, n := range cluster.Healthy(nodes) {
		if topology != nil && !cluster.Matches(n.Info.Topology, topology) {
			continue
		}
		if pinnedNode != "" && pinnedNode != n.Info.NodeID {
			continue
		}
		c.AvailableBytes += n.Info.AvailableBytes
		c.MaxVolumeBytes = max(c.MaxVolumeBytes, min(n.Info.AvailableBytes, n.Info.MaxQuotaBytes))
	}
	return c, nil
}

// notMoving refuses an operation on a volume whose move runs in the
// background (its final step would race it): Aborted, as the CSI spec
// answers an operation on a volume another one is busy with.
func (p *Provisioner) notMoving(id string) error {
	if to, moving := p.migrator.MoveRunning(id); moving {
		return errdefs.Wrap(errdefs.ErrAborted, "volume %s is moving to node %s in the background; retry once the move is done", id, to)
	}
	return nil
}
