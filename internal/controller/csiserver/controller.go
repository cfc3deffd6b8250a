// Package csiserver is the CSI controller service, served by
// zfs-controller. It is an adapter: it checks each CSI request, turns it
// into a call of the controller's logic (package provision for volumes
// and snapshots, package migration for publishing) and the result back
// into CSI; the decisions are the logic's. It links no ZFS, mount or node
// code.
package csiserver

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/migration"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/provision"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/csiplugin"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/keylock"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/volumelog"
)

// Controller is the CSI Controller service. It translates CSI calls into
// the logic's (provision, migration); it holds no state of its own.
type Controller struct {
	csi.UnimplementedControllerServer
	volumes  *provision.Provisioner
	migrator *migration.Migrator
	// backupsAsSnapshots lists backups as snapshots and restores them
	// (backups_as_snapshots).
	backupsAsSnapshots bool
	// locks serialise operations per volume/snapshot name or ID; an
	// overlapping call gets Aborted, as the spec asks.
	locks keylock.Locks
}

// New returns the Controller service over the cluster's agents; m moves
// volumes to the node they are published on, and policy places new
// volumes.
func New(c *cluster.Cluster, m *migration.Migrator, policy string, log hclog.Logger) *Controller {
	return &Controller{volumes: provision.New(c, m, policy, log), migrator: m}
}

// UseTargets gives the controller the backup targets, whose backups it
// lists as snapshots and restores (a CreateVolume whose source is a
// backup's snapshot ID) when asSnapshots (backups_as_snapshots).
func (c *Controller) UseTargets(t provision.Targets, asSnapshots bool) {
	c.volumes.UseTargets(t)
	c.backupsAsSnapshots = asSnapshots
}

func (c *Controller) tryLock(key string) (func(), error) {
	unlock, ok := c.locks.TryLock(key)
	if !ok {
		return nil, errdefs.Wrap(errdefs.ErrAborted, "an operation on %s is already in progress; retry later", key)
	}
	return unlock, nil
}

func (c *Controller) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, t := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
		csi.ControllerServiceCapability_RPC_GET_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
	} {
		caps = append(caps, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}},
		})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

func (c *Controller) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	create, err := createRequest(req)
	if err != nil {
		return nil, err
	}
	if contract.IsBackupID(create.SourceSnapshotID) && !c.backupsAsSnapshots {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "snapshot %s is a backup, and this controller restores backups only by an operator's command (zfs-controller restore); backups_as_snapshots lets job submitters restore them", create.SourceSnapshotID)
	}
	id := contract.VolumeIDForName(req.GetName())
	volumelog.Learn(id, req.GetName())
	unlock, err := c.tryLock(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	v, node, err := c.volumes.Create(ctx, create)
	if err != nil {
		return nil, err
	}
	return &csi.CreateVolumeResponse{Volume: csiVolume(v, node, req.GetVolumeContentSource())}, nil
}

// createRequest checks a CSI create and translates it.
func createRequest(req *csi.CreateVolumeRequest) (provision.CreateRequest, error) {
	if err := contract.ValidateName("volume", req.GetName()); err != nil {
		return provision.CreateRequest{}, err
	}
	if err := csiplugin.CheckCapabilities(req.GetVolumeCapabilities()); err != nil {
		return provision.CreateRequest{}, err
	}
	required, limit := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()
	if required < 0 || limit < 0 {
		return provision.CreateRequest{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "capacity range must not be negative")
	}
	params, err := contract.OwnedParameters(req.GetParameters(), req.GetSecrets())
	if err != nil {
		return provision.CreateRequest{}, err
	}
	create := provision.CreateRequest{
		VolumeRequest: contract.VolumeRequest{
			Name:          req.GetName(),
			RequiredBytes: uint64(required),
			LimitBytes:    uint64(limit),
			Parameters:    params,
			Passphrase:    contract.PassphraseFrom(req.GetSecrets()),
		},
		Requisite: segments(req.GetAccessibilityRequirements().GetRequisite()),
		Preferred: segments(req.GetAccessibilityRequirements().GetPreferred()),
	}
	if src := req.GetVolumeContentSource(); src != nil {
		switch {
		case src.GetSnapshot() != nil:
			create.SourceSnapshotID = src.GetSnapshot().GetSnapshotId()
		case src.GetVolume() != nil:
			create.SourceVolumeID = src.GetVolume().GetVolumeId()
		default:
			return provision.CreateRequest{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "unsupported volume content source")
		}
	}
	return create, nil
}

func segments(topos []*csi.Topology) []map[string]string {
	var out []map[string]string
	for _, t := range topos {
		out = append(out, t.GetSegments())
	}
	return out
}

func csiVolume(v agentclient.Volume, n cluster.Node, src *csi.VolumeContentSource) *csi.Volume {
	return &csi.Volume{
		VolumeId:      v.VolumeID,
		CapacityBytes: int64(v.CapacityBytes),
		// Informational only: nodes never trust the context, which a
		// submitter can forge with `nomad volume register`.
		VolumeContext:      map[string]string{config.TopologyNodeKey: n.Info.NodeID},
		ContentSource:      src,
		AccessibleTopology: accessibleTopology(v, n),
	}
}

// accessibleTopology is the node's for a pinned volume, and for a
// migratable one its replication domain: ControllerPublishVolume brings the
// data to whichever node of the domain the CO picks (docs/migration.md).
func accessibleTopology(v agentclient.Volume, n cluster.Node) []*csi.Topology {
	domain, ok := n.Info.Topology[config.TopologyDomainKey]
	if contract.Pinned(v.Parameters) || !ok {
		return []*csi.Topology{{Segments: n.Info.Topology}}
	}
	return []*csi.Topology{{Segments: map[string]string{config.TopologyDomainKey: domain}}}
}

func (c *Controller) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := csiplugin.Required("volume_id", id); err != nil {
		return nil, err
	}
	if !contract.IsVolumeID(id) {
		return &csi.DeleteVolumeResponse{}, nil // names no volume, so none to delete
	}
	if err := c.checkOwner(ctx, id, req.GetSecrets()); err != nil {
		return nil, err
	}
	if err := c.deleteLocked(ctx, id, c.volumes.Delete); err != nil {
		return nil, err
	}
	return &csi.DeleteVolumeResponse{}, nil
}

// deleteLocked is what the two deletes share: del of id, a volume's or a
// snapshot's, under the call's lock on id.
func (c *Controller) deleteLocked(ctx context.Context, id string, del func(ctx context.Context, id string) error) error {
	unlock, err := c.tryLock(id)
	if err != nil {
		return err
	}
	defer unlock()
	return del(ctx, id)
}

func (c *Controller) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if err := csiplugin.Required("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "volume capabilities are required")
	}
	// Nomad validates every volume it registers: a volume with an owner
	// secret is registered only with it, in whatever namespace.
	found, err := c.volumes.FindVolume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if err := contract.CheckOwner("volume "+found.Object.VolumeID, found.Object.Parameters, req.GetSecrets()); err != nil {
		return nil, err
	}
	if err := csiplugin.CheckCapabilities(req.GetVolumeCapabilities()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

func (c *Controller) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	page, err := c.volumes.ListVolumes(ctx, provision.Page{StartingToken: req.GetStartingToken(), MaxEntries: req.GetMaxEntries()})
	if err != nil {
		return nil, err
	}
	resp := &csi.ListVolumesResponse{NextToken: page.NextToken}
	for _, v := range page.Volumes {
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{Volume: csiVolume(v.Object, v.Node, sourceOf(v.Object))})
	}
	return resp, nil
}

// sourceOf turns a stored source ("snapshot:ID", "volume:ID") back into CSI.
func sourceOf(v agentclient.Volume) *csi.VolumeContentSource {
	kind, id, _ := strings.Cut(v.Source, ":")
	switch kind {
	case "snapshot":
		return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
	case "volume":
		return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
	}
	return nil
}

func (c *Controller) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	for _, capability := range req.GetVolumeCapabilities() {
		if err := csiplugin.CheckCapability(capability); err != nil {
			return &csi.GetCapacityResponse{}, nil // no capacity for what cannot be served
		}
	}
	capacity, err := c.volumes.CapacityOf(ctx, req.GetAccessibleTopology().GetSegments(), req.GetParameters()[contract.ParamNode])
	if err != nil {
		return nil, err
	}
	return &csi.GetCapacityResponse{
		AvailableCapacity: int64(capacity.AvailableBytes),
		MaximumVolumeSize: wrapperspb.Int64(int64(capacity.MaxVolumeBytes)),
	}, nil
}

func (c *Controller) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	if err := csiplugin.Required("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	found, err := c.volumes.CurrentVolume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeResponse{
		Volume: csiVolume(found.Object, found.Node, sourceOf(found.Object)),
		Status: &csi.ControllerGetVolumeResponse_VolumeStatus{},
	}, nil
}

func (c *Controller) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := csiplugin.Required("volume_id", id); err != nil {
		return nil, err
	}
	if req.GetCapacityRange() == nil {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "capacity_range is required")
	}
	if vc := req.GetVolumeCapability(); vc != nil {
		if err := csiplugin.CheckCapability(vc); err != nil {
			return nil, err
		}
	}
	unlock, err := c.tryLock(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := c.checkOwner(ctx, id, req.GetSecrets()); err != nil {
		return nil, err
	}
	capacity, err := c.volumes.Expand(ctx, id,
		uint64(max(0, req.GetCapacityRange().GetRequiredBytes())),
		uint64(max(0, req.GetCapacityRange().GetLimitBytes())))
	if err != nil {
		return nil, err
	}
	// A quota change is effective at once, mounted or not.
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: int64(capacity), NodeExpansionRequired: false}, nil
}

func (c *Controller) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	if err := contract.ValidateName("snapshot", req.GetName()); err != nil {
		return nil, err
	}
	if err := csiplugin.Required("source_volume_id", req.GetSourceVolumeId()); err != nil {
		return nil, err
	}
	unlock, err := c.tryLock(contract.SnapshotIDForName(req.GetName()))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := c.checkOwner(ctx, req.GetSourceVolumeId(), req.GetSecrets()); err != nil {
		return nil, err
	}
	snap, err := c.volumes.CreateSnapshot(ctx, req.GetName(), req.GetSourceVolumeId())
	if err != nil {
		return nil, err
	}
	return &csi.CreateSnapshotResponse{Snapshot: csiSnapshot(snap)}, nil
}

func csiSnapshot(s agentclient.Snapshot) *csi.Snapshot {
	return &csi.Snapshot{
		SnapshotId:     s.SnapshotID,
		SourceVolumeId: s.SourceVolumeID,
		SizeBytes:      int64(s.SizeBytes),
		CreationTime:   timestamppb.New(time.Unix(s.CreatedUnix, 0)),
		ReadyToUse:     true, // a ZFS snapshot is complete when it exists
	}
}

func (c *Controller) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if err := csiplugin.Required("snapshot_id", id); err != nil {
		return nil, err
	}
	if contract.IsBackupID(id) {
		// A backup outlives what a job submitter can delete: its grid
		// ages it out, or an operator deletes it (docs/backups.md).
		return nil, errdefs.Wrap(errdefs.ErrFailedPrecondition, "snapshot %s is a backup: its retention grid ages it out, or an operator deletes it (zfs-controller delete-backups)", id)
	}
	if err := c.checkSnapshotOwner(ctx, id, req.GetSecrets()); err != nil {
		return nil, err
	}
	if err := c.deleteLocked(ctx, id, c.volumes.DeleteSnapshot); err != nil {
		return nil, err
	}
	return &csi.DeleteSnapshotResponse{}, nil
}

func (c *Controller) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	page, err := c.volumes.ListSnapshots(ctx, provision.SnapshotQuery{
		SnapshotID:     req.GetSnapshotId(),
		SourceVolumeID: req.GetSourceVolumeId(),
		Backups:        c.backupsAsSnapshots,
		Page:           provision.Page{StartingToken: req.GetStartingToken(), MaxEntries: req.GetMaxEntries()},
	})
	if err != nil {
		return nil, err
	}
	resp := &csi.ListSnapshotsResponse{NextToken: page.NextToken}
	for _, s := range page.Snapshots {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: csiSnapshot(s)})
	}
	return resp, nil
}

// checkOwner refuses a call on volume id that does not present the
// volume's owner secret (contract.CheckOwner), read from any copy of it,
// a replica's included (provision.OwnerOf).
func (c *Controller) checkOwner(ctx context.Context, id string, secrets map[string]string) error {
	owner, err := c.volumes.OwnerOf(ctx, id)
	if err != nil {
		return err
	}
	return contract.CheckOwner("volume "+id, owner, secrets)
}

// checkSnapshotOwner refuses the delete of snapshot id without the owner
// secret of the volume it was taken of. Each node that holds a copy
// answers the owner of the copy it is on (a volume, a replica, a
// tombstone: each keeps its volume's parameters), so the check needs
// neither the volume nor every node: a snapshot outlives its volume, and
// its delete succeeds with a node away (docs/replication.md). Nomad
// sends a snapshot delete only the secrets its command line gives
// (`nomad volume snapshot delete -secret owner_secret=...`).
func (c *Controller) checkSnapshotOwner(ctx context.Context, id string, secrets map[string]string) error {
	if !contract.IsSnapshotID(id) {
		return nil
	}
	page, err := c.volumes.ListSnapshots(ctx, provision.SnapshotQuery{SnapshotID: id})
	if err != nil {
		return err
	}
	for _, s := range page.Snapshots {
		if s.OwnerDigest == "" {
			continue
		}
		owned := map[string]string{contract.ParamOwnerDigest: s.OwnerDigest}
		if err := contract.CheckOwner("snapshot "+id+" of volume "+s.SourceVolumeID, owned, secrets); err != nil {
			return fmt.Errorf("%w (nomad volume snapshot delete -secret %s=...)", err, contract.SecretOwner)
		}
		return nil // every copy is of one volume, with one owner
	}
	return nil
}

// ControllerPublishVolume makes the volume's data current on the node and
// its copy there the primary: a planned move if the primary is elsewhere
// and unpublished, a failover (by the volume's policy) if the primary's
// node is lost. The publish context carries the generation the node must
// find when staging or, granted ahead of a move's end, the generation its
// copy must be newer than once promoted (docs/migration.md).
func (c *Controller) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	id, nodeID := req.GetVolumeId(), req.GetNodeId()
	if err := csiplugin.FirstError(csiplugin.Required("volume_id", id), csiplugin.Required("node_id", nodeID), csiplugin.CheckCapability(req.GetVolumeCapability())); err != nil {
		return nil, err
	}
	if !contract.IsVolumeID(id) {
		return nil, errdefs.Wrap(errdefs.ErrNotFound, "volume %q does not exist (not a volume ID of this driver)", id)
	}
	unlock, err := c.tryLock(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	p, err := c.migrator.PublishAhead(ctx, id, nodeID)
	if err != nil {
		return nil, err
	}
	key, gen := contract.PublishContextGeneration, p.Generation
	if p.After != 0 {
		key, gen = contract.PublishContextAfterGeneration, p.After
	}
	return &csi.ControllerPublishVolumeResponse{PublishContext: map[string]string{key: strconv.FormatUint(gen, 10)}}, nil
}

// ControllerUnpublishVolume has nothing to undo: the node unmounts, and the
// next publish elsewhere moves the data. With flush_on_unpublish on, it
// starts the volume's flush to its replicas in the background
// (migration.Migrator.Flush: the node unstaged it, so nothing writes it
// any more). It succeeds at once, for any volume, as Nomad retries it
// after node loss and must not be stuck on a dead node.
func (c *Controller) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := csiplugin.Required("volume_id", id); err != nil {
		return nil, err
	}
	if contract.IsVolumeID(id) && req.GetNodeId() != "" {
		c.migrator.Flush(id, req.GetNodeId())
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}
