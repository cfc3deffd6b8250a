// Package controller is the CSI controller service, served by
// zfs-controller: it creates, deletes, snapshots and publishes volumes by
// asking the nodes' agents (package cluster) and deciding from their
// answers (package migration). It links no ZFS, mount or node code.
package controller

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/zfs-nomad/zfs-nomad/internal/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/config"
	"github.com/zfs-nomad/zfs-nomad/internal/csi/plugin"
	"github.com/zfs-nomad/zfs-nomad/internal/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/keylock"
	"github.com/zfs-nomad/zfs-nomad/internal/migration"
	"github.com/zfs-nomad/zfs-nomad/internal/vocab"
)

// Controller is the CSI Controller service. It decides where volumes go and
// asks the node agents to act; it holds no state of its own.
type Controller struct {
	csi.UnimplementedControllerServer
	cluster  *cluster.Cluster
	migrator *migration.Migrator
	policy   string
	log      hclog.Logger
	// locks serialise operations per volume/snapshot name or ID; an
	// overlapping call gets Aborted, as the spec asks.
	locks keylock.Locks
}

// New returns the Controller service; m moves volumes to the
// node they are published on.
func New(c *cluster.Cluster, m *migration.Migrator, policy string, log hclog.Logger) *Controller {
	return &Controller{cluster: c, migrator: m, policy: policy, log: log}
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
	v, node, err := c.createVolume(ctx, req)
	if err != nil {
		return nil, err
	}
	return &csi.CreateVolumeResponse{Volume: c.csiVolume(v, node, req.GetVolumeContentSource())}, nil
}

func (c *Controller) createVolume(ctx context.Context, req *csi.CreateVolumeRequest) (agentclient.Volume, cluster.Node, error) {
	if err := vocab.ValidateName("volume", req.GetName()); err != nil {
		return agentclient.Volume{}, cluster.Node{}, err
	}
	if err := plugin.CheckCapabilities(req.GetVolumeCapabilities()); err != nil {
		return agentclient.Volume{}, cluster.Node{}, err
	}
	required, limit := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()
	if required < 0 || limit < 0 {
		return agentclient.Volume{}, cluster.Node{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "capacity range must not be negative")
	}
	id := vocab.VolumeIDForName(req.GetName())
	log := c.log.With("volume_id", id, "name", req.GetName())
	unlock, err := c.tryLock(id)
	if err != nil {
		return agentclient.Volume{}, cluster.Node{}, err
	}
	defer unlock()

	agentReq := agentclient.NewVolume{
		Name:          req.GetName(),
		RequiredBytes: uint64(required),
		LimitBytes:    uint64(limit),
		Parameters:    req.GetParameters(),
	}
	// A volume of this name may exist already (a retried call): its node
	// decides whether the request is compatible.
	existing, err := c.findVolume(ctx, id)
	if err == nil {
		return c.createOn(ctx, existing.Node, agentReq, log)
	}
	if !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrUnavailable) {
		return agentclient.Volume{}, cluster.Node{}, err
	}

	candidates, err := c.candidates(ctx, req, &agentReq)
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
	node, err := c.migrator.ReserveCreation(ctx, id, ids)
	if err != nil {
		return agentclient.Volume{}, cluster.Node{}, err
	}
	return c.createOn(ctx, node, agentReq, log)
}

func (c *Controller) createOn(ctx context.Context, n cluster.Node, req agentclient.NewVolume, log hclog.Logger) (agentclient.Volume, cluster.Node, error) {
	cctx, cancel := c.cluster.Call(ctx)
	defer cancel()
	v, err := n.Agent.CreateVolume(cctx, req)
	if err != nil {
		return agentclient.Volume{}, n, err
	}
	log.Info("volume ready", "node_id", n.Info.NodeID, "capacity", v.CapacityBytes)
	return v, n, nil
}

// candidates returns the nodes a new volume may go to, best first. A volume
// made from a snapshot or another volume must live where its source does.
func (c *Controller) candidates(ctx context.Context, req *csi.CreateVolumeRequest, agentReq *agentclient.NewVolume) ([]cluster.Node, error) {
	sourceNode := ""
	if src := req.GetVolumeContentSource(); src != nil {
		switch {
		case src.GetSnapshot() != nil:
			id := src.GetSnapshot().GetSnapshotId()
			snap, err := c.findSnapshot(ctx, id)
			if err != nil {
				return nil, err
			}
			agentReq.SourceSnapshotID = id
			sourceNode = snap.Node.Info.NodeID
		case src.GetVolume() != nil:
			id := src.GetVolume().GetVolumeId()
			v, err := c.currentVolume(ctx, id)
			if err != nil {
				return nil, err
			}
			agentReq.SourceVolumeID = id
			sourceNode = v.Node.Info.NodeID
		default:
			return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "unsupported volume content source")
		}
	}
	pinned := req.GetParameters()[vocab.ParamNode]
	if sourceNode != "" && pinned != "" && pinned != sourceNode {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "parameter node=%s conflicts with the source, which lives on node %s (clones are made on the source's node)", pinned, sourceNode)
	}
	if sourceNode != "" {
		pinned = sourceNode
	}

	nodes, _, err := c.cluster.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	size := agentReq.RequiredBytes
	if size == 0 {
		size = 1 // the node applies its default size; placement only needs a node with room
	}
	return cluster.PlaceNodes(cluster.Healthy(nodes), cluster.Requirement{
		Bytes:     size,
		Requisite: segments(req.GetAccessibilityRequirements().GetRequisite()),
		Preferred: segments(req.GetAccessibilityRequirements().GetPreferred()),
		Node:      pinned,
		Policy:    c.policy,
	})
}

func segments(topos []*csi.Topology) []map[string]string {
	var out []map[string]string
	for _, t := range topos {
		out = append(out, t.GetSegments())
	}
	return out
}

func (c *Controller) csiVolume(v agentclient.Volume, n cluster.Node, src *csi.VolumeContentSource) *csi.Volume {
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
	if vocab.Pinned(v.Parameters) || !ok {
		return []*csi.Topology{{Segments: n.Info.Topology}}
	}
	return []*csi.Topology{{Segments: map[string]string{config.TopologyDomainKey: domain}}}
}

func (c *Controller) findVolume(ctx context.Context, id string) (cluster.Located[agentclient.Volume], error) {
	if !vocab.IsVolumeID(id) {
		return cluster.Located[agentclient.Volume]{}, errdefs.Wrap(errdefs.ErrNotFound, "volume %q does not exist (not a volume ID of this driver)", id)
	}
	// Between a move's promotion and the demotion of the old copy, two
	// nodes hold a primary: the newest generation is the volume.
	return cluster.Find(ctx, c.cluster, "volume "+id, func(ctx context.Context, a cluster.Agent) (agentclient.Volume, error) {
		return a.GetVolume(ctx, id)
	}, func(a, b agentclient.Volume) bool { return a.Generation > b.Generation })
}

// currentVolume finds the volume on the node of its current primary, as a
// publish decides it (Migrator.Current): with the newest copy's node
// silent it answers Unavailable instead of a stale copy. Everything that
// acts on the volume's data or reports its state uses it.
func (c *Controller) currentVolume(ctx context.Context, id string) (cluster.Located[agentclient.Volume], error) {
	if !vocab.IsVolumeID(id) {
		return cluster.Located[agentclient.Volume]{}, errdefs.Wrap(errdefs.ErrNotFound, "volume %q does not exist (not a volume ID of this driver)", id)
	}
	node, _, err := c.migrator.Current(ctx, id)
	if err != nil {
		return cluster.Located[agentclient.Volume]{}, err
	}
	cctx, cancel := c.cluster.Call(ctx)
	defer cancel()
	v, err := node.Agent.GetVolume(cctx, id)
	if err != nil {
		return cluster.Located[agentclient.Volume]{}, err
	}
	return cluster.Located[agentclient.Volume]{Node: node, Object: v}, nil
}

func (c *Controller) findSnapshot(ctx context.Context, id string) (cluster.Located[agentclient.Snapshot], error) {
	if !vocab.IsSnapshotID(id) {
		return cluster.Located[agentclient.Snapshot]{}, errdefs.Wrap(errdefs.ErrNotFound, "snapshot %q does not exist (not a snapshot ID of this driver)", id)
	}
	return cluster.Find(ctx, c.cluster, "snapshot "+id, func(ctx context.Context, a cluster.Agent) (agentclient.Snapshot, error) {
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

func (c *Controller) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := plugin.Required("volume_id", id); err != nil {
		return nil, err
	}
	if !vocab.IsVolumeID(id) {
		return &csi.DeleteVolumeResponse{}, nil // names no volume, so none to delete
	}
	unlock, err := c.tryLock(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := c.deleteVolume(ctx, id); err != nil {
		return nil, err
	}
	return &csi.DeleteVolumeResponse{}, nil
}

// deleteVolume removes every copy of a volume, or answers an error and
// leaves what it could not remove for a retry. It answers OK only when
// every node answered: a copy on a node that did not (a primary lost with
// writes the others lack, or a replica) would outlive a delete that said
// it was gone, and a later create of the same name would adopt it
// (docs/safety.md). Older primaries are set aside, never destroyed: they
// may hold writes the newest lacks.
func (c *Controller) deleteVolume(ctx context.Context, id string) error {
	answers, unreachable, err := cluster.Ask(ctx, c.cluster, func(ctx context.Context, a cluster.Agent) (agentclient.Copy, error) {
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
		for _, stale := range primaries[1:] {
			if err := c.setAside(ctx, id, stale.Node, newest.Object.Generation); err != nil {
				return err
			}
		}
		cctx, cancel := c.cluster.Call(ctx)
		err := newest.Node.Agent.DeleteVolume(cctx, id)
		cancel()
		if err != nil {
			return err
		}
		c.log.Info("volume deleted", "volume_id", id, "node_id", newest.Node.Info.NodeID)
	}
	var nodes []cluster.Node
	for _, a := range answers {
		nodes = append(nodes, a.Node)
	}
	return c.deleteReplicas(ctx, id, nodes)
}

// setAside retires an older primary of a volume being deleted: renamed,
// read-only, kept for an operator.
func (c *Controller) setAside(ctx context.Context, id string, n cluster.Node, generation uint64) error {
	cctx, cancel := c.cluster.Call(ctx)
	defer cancel()
	if _, err := n.Agent.Demote(cctx, agentclient.Demotion{VolumeID: id, Generation: generation, Aside: true}); err != nil {
		return fmt.Errorf("volume %s is not deleted: setting aside its older primary on node %s: %w", id, n.Info.NodeID, err)
	}
	c.log.Warn("an older primary of the deleted volume is set aside, not destroyed: it may hold writes the newest lacked",
		"volume_id", id, "node_id", n.Info.NodeID)
	return nil
}

// deleteReplicas removes the replicas of a deleted volume from nodes
// (every node: the caller made sure all answered), and fails (the CO
// retries the delete) if one cannot be removed.
func (c *Controller) deleteReplicas(ctx context.Context, id string, nodes []cluster.Node) error {
	var errs []error
	answers := cluster.Each(ctx, c.cluster, nodes, func(ctx context.Context, n cluster.Node) (bool, error) {
		return n.Agent.DeleteReplica(ctx, id, true)
	})
	for _, a := range answers {
		switch {
		case a.Err != nil:
			errs = append(errs, fmt.Errorf("node %s: %w", a.Node.Info.NodeID, a.Err))
		case a.Object: // the node held a replica
			c.log.Info("replica deleted", "volume_id", id, "node_id", a.Node.Info.NodeID)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: volume %s is deleted but some of its replicas may remain (%v); retry the delete", errdefs.ErrUnavailable, id, errors.Join(errs...))
	}
	return nil
}

func (c *Controller) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if err := plugin.Required("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "volume capabilities are required")
	}
	if _, err := c.findVolume(ctx, req.GetVolumeId()); err != nil {
		return nil, err
	}
	if err := plugin.CheckCapabilities(req.GetVolumeCapabilities()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// volumesFrom lists the nodes' primaries as req asks (all, or a page from
// an ID on), sorted by ID, the newest generation of each.
func (c *Controller) volumesFrom(ctx context.Context, page agentclient.Page) ([]cluster.Located[agentclient.Volume], error) {
	out, err := fromEveryNode(ctx, c, "volumes", func(ctx context.Context, n cluster.Node) ([]agentclient.Volume, error) {
		return n.Agent.ListVolumes(ctx, page)
	})
	if err != nil {
		return nil, err
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Object.VolumeID < out[j].Object.VolumeID })
	return newestGenerations(out), nil
}

// fromEveryNode asks every node for a list at once and joins the lists,
// each item with its node. A node that does not answer is logged and left
// out: listings are informational (what names the items in the log).
func fromEveryNode[T any](ctx context.Context, c *Controller, what string, list func(context.Context, cluster.Node) ([]T, error)) ([]cluster.Located[T], error) {
	nodes, _, err := c.cluster.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	var out []cluster.Located[T]
	for _, a := range cluster.Each(ctx, c.cluster, nodes, list) {
		if a.Err != nil {
			c.log.Warn("listing the "+what+" of a node failed; the list is incomplete", "node_id", a.Node.Info.NodeID, "error", a.Err)
			continue
		}
		for _, item := range a.Object {
			out = append(out, cluster.Located[T]{Node: a.Node, Object: item})
		}
	}
	return out, nil
}

// newestGenerations keeps, of a volume listed by two nodes (the moment
// between a move's promotion and the old copy's demotion), the newest
// generation. items are sorted by volume ID.
func newestGenerations(items []cluster.Located[agentclient.Volume]) []cluster.Located[agentclient.Volume] {
	var out []cluster.Located[agentclient.Volume]
	for _, it := range items {
		last := len(out) - 1
		if last >= 0 && out[last].Object.VolumeID == it.Object.VolumeID {
			if it.Object.Generation > out[last].Object.Generation {
				out[last] = it
			}
			continue
		}
		out = append(out, it)
	}
	return out
}

// ListVolumes answers a page from each node's page: every node lists its
// first max_entries+1 primaries from the token on, which holds the first
// max_entries+1 distinct volumes of all nodes (a node's volumes before any
// one of them are among the cluster's before it), so a page costs each
// node in proportion to the page, not to its volumes.
func (c *Controller) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "max_entries must not be negative")
	}
	if token := req.GetStartingToken(); token != "" && !vocab.IsVolumeID(token) {
		return nil, errdefs.Wrap(errdefs.ErrAborted, "starting_token %q is not a token this plugin issued; list again from the start", token)
	}
	nodeReq := agentclient.Page{From: req.GetStartingToken()}
	if req.GetMaxEntries() > 0 {
		nodeReq.MaxEntries = uint32(req.GetMaxEntries()) + 1
	}
	all, err := c.volumesFrom(ctx, nodeReq)
	if err != nil {
		return nil, err
	}
	page, next, err := paginate(all, func(v cluster.Located[agentclient.Volume]) string { return v.Object.VolumeID },
		req.GetStartingToken(), req.GetMaxEntries(), vocab.IsVolumeID)
	if err != nil {
		return nil, err
	}
	resp := &csi.ListVolumesResponse{NextToken: next}
	for _, v := range page {
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{Volume: c.csiVolume(v.Object, v.Node, sourceOf(v.Object))})
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

// paginate returns one page of items sorted by key. The token is the key of
// the first item of the next page; a token that is not a key of this
// driver is refused with Aborted, as the spec asks.
func paginate[T any](items []T, key func(T) string, token string, maxEntries int32, validToken func(string) bool) ([]T, string, error) {
	if maxEntries < 0 {
		return nil, "", errdefs.Wrap(errdefs.ErrInvalidArgument, "max_entries must not be negative")
	}
	start := 0
	if token != "" {
		if !validToken(token) {
			return nil, "", errdefs.Wrap(errdefs.ErrAborted, "starting_token %q is not a token this plugin issued; list again from the start", token)
		}
		start = sort.Search(len(items), func(i int) bool { return key(items[i]) >= token })
	}
	end := len(items)
	if maxEntries > 0 && start+int(maxEntries) < end {
		end = start + int(maxEntries)
	}
	next := ""
	if end < len(items) {
		next = key(items[end])
	}
	return items[start:end], next, nil
}

func (c *Controller) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	for _, capability := range req.GetVolumeCapabilities() {
		if err := plugin.CheckCapability(capability); err != nil {
			return &csi.GetCapacityResponse{}, nil // no capacity for what cannot be served
		}
	}
	nodes, _, err := c.cluster.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	var available, largest uint64
	for _, n := range cluster.Healthy(nodes) {
		if seg := req.GetAccessibleTopology().GetSegments(); seg != nil && !cluster.Matches(n.Info.Topology, seg) {
			continue
		}
		if pin := req.GetParameters()[vocab.ParamNode]; pin != "" && pin != n.Info.NodeID {
			continue
		}
		available += n.Info.AvailableBytes
		largest = max(largest, min(n.Info.AvailableBytes, n.Info.MaxQuotaBytes))
	}
	return &csi.GetCapacityResponse{
		AvailableCapacity: int64(available),
		MaximumVolumeSize: wrapperspb.Int64(int64(largest)),
	}, nil
}

func (c *Controller) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	if err := plugin.Required("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	found, err := c.currentVolume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeResponse{
		Volume: c.csiVolume(found.Object, found.Node, sourceOf(found.Object)),
		Status: &csi.ControllerGetVolumeResponse_VolumeStatus{},
	}, nil
}

func (c *Controller) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := plugin.Required("volume_id", id); err != nil {
		return nil, err
	}
	if req.GetCapacityRange() == nil {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "capacity_range is required")
	}
	if vc := req.GetVolumeCapability(); vc != nil {
		if err := plugin.CheckCapability(vc); err != nil {
			return nil, err
		}
	}
	unlock, err := c.tryLock(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	found, err := c.currentVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	cctx, cancel := c.cluster.Call(ctx)
	defer cancel()
	capacity, err := found.Node.Agent.ExpandVolume(cctx, id,
		uint64(max(0, req.GetCapacityRange().GetRequiredBytes())),
		uint64(max(0, req.GetCapacityRange().GetLimitBytes())))
	if err != nil {
		return nil, err
	}
	// A quota change is effective at once, mounted or not.
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: int64(capacity), NodeExpansionRequired: false}, nil
}

func (c *Controller) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	if err := vocab.ValidateName("snapshot", req.GetName()); err != nil {
		return nil, err
	}
	if err := plugin.Required("source_volume_id", req.GetSourceVolumeId()); err != nil {
		return nil, err
	}
	id := vocab.SnapshotIDForName(req.GetName())
	unlock, err := c.tryLock(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	// Snapshot names are unique across the cluster, not per volume.
	existing, err := c.findSnapshot(ctx, id)
	if err == nil && existing.Object.SourceVolumeID != req.GetSourceVolumeId() {
		return nil, errdefs.Wrap(errdefs.ErrAlreadyExists, "snapshot %q exists for volume %s, not %s", req.GetName(), existing.Object.SourceVolumeID, req.GetSourceVolumeId())
	}
	if err == nil {
		return &csi.CreateSnapshotResponse{Snapshot: csiSnapshot(existing.Object)}, nil
	}
	if !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}
	found, err := c.currentVolume(ctx, req.GetSourceVolumeId())
	if err != nil {
		return nil, err
	}
	cctx, cancel := c.cluster.Call(ctx)
	defer cancel()
	snap, err := found.Node.Agent.CreateSnapshot(cctx, req.GetSourceVolumeId(), req.GetName())
	if err != nil {
		return nil, err
	}
	c.log.Info("snapshot created", "volume_id", req.GetSourceVolumeId(), "snapshot_id", snap.SnapshotID, "node_id", found.Node.Info.NodeID)
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
	if err := plugin.Required("snapshot_id", id); err != nil {
		return nil, err
	}
	unlock, err := c.tryLock(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	found, err := c.findSnapshot(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return &csi.DeleteSnapshotResponse{}, nil
	}
	if err != nil {
		return nil, err
	}
	cctx, cancel := c.cluster.Call(ctx)
	defer cancel()
	if err := found.Node.Agent.DeleteSnapshot(cctx, id); err != nil {
		return nil, err
	}
	c.log.Info("snapshot deleted", "snapshot_id", id, "volume_id", found.Object.SourceVolumeID)
	return &csi.DeleteSnapshotResponse{}, nil
}

// ListSnapshots pages like ListVolumes: each node answers its first
// max_entries+1 snapshots from the token on, of the source volume when
// one is given (or the one snapshot asked for).
func (c *Controller) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	if token := req.GetStartingToken(); token != "" && !vocab.IsSnapshotID(token) {
		return nil, errdefs.Wrap(errdefs.ErrAborted, "starting_token %q is not a token this plugin issued; list again from the start", token)
	}
	nodeReq := agentclient.SnapshotQuery{SnapshotID: req.GetSnapshotId(), From: req.GetStartingToken(), SourceVolumeID: req.GetSourceVolumeId()}
	if req.GetMaxEntries() > 0 {
		nodeReq.MaxEntries = uint32(req.GetMaxEntries()) + 1
	}
	listed, err := fromEveryNode(ctx, c, "snapshots", func(ctx context.Context, n cluster.Node) ([]agentclient.Snapshot, error) {
		return n.Agent.ListSnapshots(ctx, nodeReq)
	})
	if err != nil {
		return nil, err
	}
	var all []agentclient.Snapshot
	for _, l := range listed {
		s := l.Object
		if (req.GetSnapshotId() == "" || s.SnapshotID == req.GetSnapshotId()) &&
			(req.GetSourceVolumeId() == "" || s.SourceVolumeID == req.GetSourceVolumeId()) {
			all = append(all, s)
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].SnapshotID < all[j].SnapshotID })
	page, next, err := paginate(all, func(s agentclient.Snapshot) string { return s.SnapshotID }, req.GetStartingToken(), req.GetMaxEntries(), vocab.IsSnapshotID)
	if err != nil {
		return nil, err
	}
	resp := &csi.ListSnapshotsResponse{NextToken: next}
	for _, s := range page {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: csiSnapshot(s)})
	}
	return resp, nil
}

// ControllerPublishVolume makes the volume's data current on the node and
// its copy there the primary: a planned move if the primary is elsewhere
// and unpublished, a failover (by the volume's policy) if the primary's
// node is lost. The publish context carries the generation the node must
// find when staging (docs/migration.md).
func (c *Controller) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	id, nodeID := req.GetVolumeId(), req.GetNodeId()
	if err := plugin.FirstError(plugin.Required("volume_id", id), plugin.Required("node_id", nodeID), plugin.CheckCapability(req.GetVolumeCapability())); err != nil {
		return nil, err
	}
	if !vocab.IsVolumeID(id) {
		return nil, errdefs.Wrap(errdefs.ErrNotFound, "volume %q does not exist (not a volume ID of this driver)", id)
	}
	unlock, err := c.tryLock(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	gen, err := c.migrator.Publish(ctx, id, nodeID)
	if err != nil {
		return nil, err
	}
	return &csi.ControllerPublishVolumeResponse{PublishContext: map[string]string{vocab.PublishContextGeneration: strconv.FormatUint(gen, 10)}}, nil
}

// ControllerUnpublishVolume has nothing to undo: the node unmounts, and the
// next publish elsewhere moves the data. It succeeds for any volume, as
// Nomad retries it after node loss and must not be stuck on a dead node.
func (c *Controller) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	if err := plugin.Required("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}
