// Package agent is the node's gRPC adapter for the agent protocol
// (proto/agentpb), and the only node package that speaks it (hack/edges.sh
// checks): Server serves the node agent service, the node's volumes (the
// volume package's Manager, Index, Records and Fences) and replication, to
// the controller; between nodes, ReplicationServer and
// ReplicationPeers carry replication's streams, PeersServer and PeerClient
// the lease's calls. The node's logic speaks the plain types of volume,
// replication and lease; ServerOptions and DialOptions tune the agent
// port for bulk streams.
package agent

import (
	"cmp"
	"context"
	"errors"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/lease"
	"github.com/zfs-nomad/zfs-nomad/internal/node/replication"
	"github.com/zfs-nomad/zfs-nomad/internal/node/volume"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/version"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/witnesses"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/worklease"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// Server implements pb.NodeAgentServer on a node.
type Server struct {
	pb.UnimplementedNodeAgentServer
	// AttestSilence, when set, checks that the nodes at the addresses a
	// failover's reservation names, and every other peer of this node's
	// lease that is not among the node IDs answering, have been silent
	// for the lease and its margin (lease.Monitor.AttestFailover); the
	// reservation is refused otherwise.
	AttestSilence func(addrs, answering []string) error
	// KnownNodes, when set, is how many nodes this node's lease counts,
	// itself included (lease.Monitor.Members), reported by GetNode.
	KnownNodes func() int
	// Witnesses is the node's witness set (empty: every node counts),
	// reported by GetNode: the controller counts a generation's majorities
	// over it, and a reservation counted over another set is refused.
	Witnesses witnesses.Set
	// Retire, when set, makes this node's lease stop counting a stopped
	// node (lease.Monitor.Retire); without it RetirePeer is refused.
	// RetiredNodes, reported by GetNode, lists those it retired.
	Retire       func(nodeID string) error
	RetiredNodes func() []string
	// OpenZFS is the release of the node's kernel module, reported by
	// GetNode.
	OpenZFS string
	// LeaseHeld and CertificateNotAfter, when set, report whether the
	// node holds its lease (unset: it keeps none, so it holds it) and
	// when its agent certificate expires.
	LeaseHeld           func() bool
	CertificateNotAfter func() time.Time
	// WorkLease is this node's part of the controllers' work lease
	// (package worklease); NewServer starts it on the wall clock.
	WorkLease *worklease.Grants

	volumes  Volumes
	copies   Copies
	index    Index
	records  Records
	forcing  Forcing
	replicas *copyrecord.Replicas
	pusher   *replication.Pusher
	receiver *replication.Receiver
	cfg      config.Node
	log      hclog.Logger
}

// NewServer returns the agent service of node n, described by cfg.
func NewServer(n Node, cfg config.Node, log hclog.Logger) *Server {
	return &Server{volumes: n.Volumes, copies: n.Copies, index: n.Index, records: n.Records, forcing: n.Forcing,
		replicas: n.Replicas, pusher: n.Pusher, receiver: n.Receiver, cfg: cfg, log: log, WorkLease: worklease.NewGrants(time.Now)}
}

// DeleteReplica destroys this node's replica of a volume, if any.
func (s *Server) DeleteReplica(ctx context.Context, req *pb.DeleteReplicaRequest) (*pb.DeleteReplicaResponse, error) {
	if req.GetVolumeDeleted() {
		if err := s.copies.Forget(ctx, req.GetVolumeId()); err != nil {
			return nil, err
		}
	}
	deleted, err := false, error(nil)
	if newest := req.GetSurplusNewest(); newest != "" {
		deleted, err = s.copies.DeleteSurplus(ctx, req.GetVolumeId(), newest, req.GetSnapshotsElsewhere())
	} else {
		deleted, err = s.copies.DeleteReplica(ctx, req.GetVolumeId())
	}
	if err != nil {
		return nil, err
	}
	return &pb.DeleteReplicaResponse{Deleted: deleted}, nil
}

// maxChanges bounds the volumes one Changes call reads: a caller further
// behind asks for everything, a page at a time.
const maxChanges = 200

// Changes tells what became of the volumes whose copy here changed since
// the node reported a volumes version: for each, its primary or its
// replica here now, if any.
func (s *Server) Changes(ctx context.Context, req *pb.ChangesRequest) (*pb.ChangesResponse, error) {
	ids, ok := s.index.ChangedSince(req.GetSince(), maxChanges)
	if !ok {
		return &pb.ChangesResponse{}, nil
	}
	resp := &pb.ChangesResponse{Known: true, VolumeIds: ids}
	for _, id := range ids {
		v, err := s.volumes.Get(ctx, id)
		switch {
		case err == nil:
			resp.Volumes = append(resp.Volumes, s.volumeToPB(v))
		case !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrFailedPrecondition):
			return nil, err
		}
		if s.replicas == nil {
			continue
		}
		r, held, err := s.replicas.ReplicaOf(ctx, id)
		if err != nil {
			return nil, err
		}
		if held {
			resp.Replicas = append(resp.Replicas, replicaToPB(r))
		}
	}
	return resp, nil
}

// Status lists the node's replicas and running transfers.
func (s *Server) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.NodeStatus, error) {
	out := &pb.NodeStatus{}
	if s.replicas == nil || s.pusher == nil {
		return out, nil
	}
	replicas, setAside, err := s.replicas.Holdings(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range replicas {
		out.Replicas = append(out.Replicas, replicaToPB(r))
	}
	out.SetAside = setAside
	for _, t := range s.pusher.Transfers() {
		out.Transfers = append(out.Transfers, &pb.Transfer{VolumeId: t.VolumeID, Peer: t.Peer, Kind: t.Kind,
			Bytes: t.Bytes, TotalBytes: t.Total, StartedUnix: t.Started.Unix(), Purpose: t.Purpose})
	}
	for _, f := range s.pusher.BackupFailures() {
		out.BackupFailures = append(out.BackupFailures, &pb.BackupFailure{VolumeId: f.VolumeID, Target: f.Target, Error: f.Err, AtUnix: f.At.Unix()})
	}
	return out, nil
}

// unixOrZero is t in unix seconds, or 0 for the zero time.
func unixOrZero(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.Unix()
}

func replicaToPB(r copyrecord.Replica) *pb.Replica {
	return &pb.Replica{VolumeId: r.VolumeID, Name: r.Name, LastSnapshot: r.LastSnapshot,
		LastSnapshotUnix: r.LastSnapshotTime.Unix(), Resumable: r.Resumable, DemotedAtUnix: unixOrZero(r.DemotedAt)}
}

// Replicate pushes a volume to a peer now and streams progress.
func (s *Server) Replicate(req *pb.ReplicateRequest, stream pb.NodeAgent_ReplicateServer) error {
	// A stream passes no unary interceptor: its error is converted here.
	if s.pusher == nil {
		return errdefs.ToStatus(errdefs.Wrap(errdefs.ErrFailedPrecondition, "replication is not configured on node %s", s.cfg.NodeID))
	}
	report := func(p replication.Progress) {
		_ = stream.Send(&pb.ReplicateProgress{Kind: p.Kind, Snapshot: p.Snapshot, Base: p.Base, Bytes: p.Bytes, TotalBytes: p.Total, Done: p.Done,
			FencedUnixNano: p.FencedAt})
	}
	if target := req.GetBackupTarget(); target != "" {
		if req.GetTargetAddress() != "" || req.GetTargetNodeId() != "" || req.GetFenceForNodeId() != "" {
			return errdefs.ToStatus(errdefs.Wrap(errdefs.ErrInvalidArgument,
				"replicate %s: backup_target %q names where the push goes; target_address, target_node_id and fence_for_node_id must be empty", req.GetVolumeId(), target))
		}
		_, err := s.pusher.PushBackup(stream.Context(), req.GetVolumeId(), target, req.GetPurpose(), time.Second, report)
		return errdefs.ToStatus(err)
	}
	expected, fenceFor := req.GetTargetNodeId(), req.GetFenceForNodeId()
	if expected != "" && fenceFor != "" && expected != fenceFor {
		return errdefs.ToStatus(errdefs.Wrap(errdefs.ErrInvalidArgument,
			"replicate %s: target_node_id %q and fence_for_node_id %q differ: a move's final push goes to the node it fences for", req.GetVolumeId(), expected, fenceFor))
	}
	var fence replication.Fence
	if fenceFor != "" {
		id := req.GetVolumeId()
		fence = func(ctx context.Context, at int64) (int64, error) { return s.copies.FenceHeld(ctx, id, fenceFor, at) }
	}
	// A caller that knows the target node (the controller always does):
	// only that node's certificate may answer at the target address.
	_, err := s.pusher.PushFenced(stream.Context(), req.GetVolumeId(), req.GetTargetAddress(), cmp.Or(expected, fenceFor), req.GetPurpose(), time.Second, report, fence)
	return errdefs.ToStatus(err)
}

func (s *Server) GetNode(ctx context.Context, req *pb.GetNodeRequest) (*pb.Node, error) {
	n := &pb.Node{
		NodeId:        s.cfg.NodeID,
		Topology:      s.cfg.Segments(),
		MaxQuotaBytes: uint64(s.cfg.MaxQuota),
		MaxVolumes:    s.cfg.MaxVolumes,
		Version:       version.Version,
		// Before the health check: the version says what the node's
		// primaries are, whatever its health.
		VolumesVersion: s.index.VolumesVersion(),
	}
	if s.RetiredNodes != nil {
		n.RetiredNodeIds = s.RetiredNodes()
	}
	if s.KnownNodes != nil {
		n.KnownNodes = uint32(s.KnownNodes())
	}
	n.Witnesses = s.Witnesses.Entries()
	n.OpenzfsVersion = s.OpenZFS
	// Without a lease the node holds it always (pb.Node.lease_held).
	n.LeaseHeld = s.LeaseHeld == nil || s.LeaseHeld()
	if s.CertificateNotAfter != nil {
		n.CertificateNotAfter = s.CertificateNotAfter().Unix()
	}
	for _, a := range s.copies.AwaitedPromotions() {
		n.AwaitedPromotions = append(n.AwaitedPromotions, &pb.AwaitedPromotion{VolumeId: a.VolumeID, AfterGeneration: a.AfterGeneration,
			WaitingMillis: time.Since(a.Since).Milliseconds()})
	}
	if req.GetWithoutHealth() {
		return n, nil
	}
	if err := s.volumes.Health(ctx); err != nil {
		n.UnhealthyReason = err.Error()
		return n, nil
	}
	if req.GetWithoutCapacity() {
		return n, nil
	}
	c, err := s.volumes.Capacity(ctx)
	if err != nil {
		n.UnhealthyReason = err.Error()
		return n, nil
	}
	n.AvailableBytes = c.Available
	n.Volumes = int64(c.Volumes)
	return n, nil
}

func (s *Server) CreateVolume(ctx context.Context, req *pb.CreateVolumeRequest) (*pb.Volume, error) {
	v, err := s.volumes.Create(ctx, volume.CreateRequest{
		Name:             req.GetName(),
		RequiredBytes:    req.GetRequiredBytes(),
		LimitBytes:       req.GetLimitBytes(),
		Parameters:       req.GetParameters(),
		SourceSnapshotID: req.GetSourceSnapshotId(),
		RestoreGrant:     req.GetRestoreGrant(),
		SourceVolumeID:   req.GetSourceVolumeId(),
		Passphrase:       req.GetEncryptionPassphrase(),
	})
	if err != nil {
		return nil, err
	}
	return s.volumeToPB(v), nil
}

func (s *Server) DeleteVolume(ctx context.Context, req *pb.DeleteVolumeRequest) (*pb.DeleteVolumeResponse, error) {
	if err := s.volumes.Delete(ctx, req.GetVolumeId()); err != nil {
		return nil, err
	}
	return &pb.DeleteVolumeResponse{}, nil
}

func (s *Server) GetVolume(ctx context.Context, req *pb.GetVolumeRequest) (*pb.Volume, error) {
	v, err := s.volumes.Get(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	return s.volumeToPB(v), nil
}

func (s *Server) ListVolumes(ctx context.Context, req *pb.ListVolumesRequest) (*pb.ListVolumesResponse, error) {
	list := s.volumes.List
	if req.GetFrom() != "" || req.GetMaxEntries() > 0 {
		list = func(ctx context.Context) ([]volume.Volume, error) {
			return s.index.ListPage(ctx, req.GetFrom(), int(req.GetMaxEntries()))
		}
	}
	vols, err := list(ctx)
	if err != nil {
		return nil, err
	}
	resp := &pb.ListVolumesResponse{}
	for _, v := range vols {
		resp.Volumes = append(resp.Volumes, s.volumeToPB(v))
	}
	return resp, nil
}

func (s *Server) ExpandVolume(ctx context.Context, req *pb.ExpandVolumeRequest) (*pb.ExpandVolumeResponse, error) {
	capacity, err := s.volumes.Expand(ctx, req.GetVolumeId(), req.GetRequiredBytes(), req.GetLimitBytes())
	if err != nil {
		return nil, err
	}
	return &pb.ExpandVolumeResponse{CapacityBytes: capacity}, nil
}

func (s *Server) CreateSnapshot(ctx context.Context, req *pb.CreateSnapshotRequest) (*pb.Snapshot, error) {
	snap, err := s.volumes.CreateSnapshotAfter(ctx, req.GetSourceVolumeId(), req.GetName(), req.GetCreatedAfterUnix())
	if err != nil {
		return nil, err
	}
	return s.snapshotToPB(snap), nil
}

// DeleteSnapshot remembers the deletion first when asked, so that a copy
// the delete then fails to remove is hidden all the same, and forgets it
// last, once the copy is gone.
func (s *Server) DeleteSnapshot(ctx context.Context, req *pb.DeleteSnapshotRequest) (*pb.DeleteSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if req.GetRemember() {
		d := copyrecord.DeletedSnapshot{ID: id, SourceVolumeID: req.GetSourceVolumeId(), CreatedUnix: req.GetCreatedUpToUnix()}
		if err := s.records.RememberDeleted(ctx, d); err != nil {
			return nil, err
		}
	}
	if err := s.volumes.DeleteSnapshotUpTo(ctx, id, req.GetCreatedUpToUnix()); err != nil {
		return nil, err
	}
	if req.GetForget() {
		if err := s.volumes.ForgetDeleted(ctx, id); err != nil {
			return nil, err
		}
	}
	return &pb.DeleteSnapshotResponse{}, nil
}

func (s *Server) ListSnapshots(ctx context.Context, req *pb.ListSnapshotsRequest) (*pb.ListSnapshotsResponse, error) {
	var snaps []volume.Snapshot
	var err error
	switch id := req.GetSnapshotId(); {
	case req.GetDeletedOnly(): // the records alone
	case id != "":
		var snap volume.Snapshot
		if snap, err = s.volumes.GetSnapshot(ctx, id); err == nil {
			snaps = append(snaps, snap)
		} else if errors.Is(err, errdefs.ErrNotFound) {
			err = nil
		}
	default:
		snaps, err = s.index.SnapshotPage(ctx, req.GetFrom(), int(req.GetMaxEntries()), req.GetSourceVolumeId())
	}
	if err != nil {
		return nil, err
	}
	resp := &pb.ListSnapshotsResponse{}
	for _, sn := range snaps {
		resp.Snapshots = append(resp.Snapshots, s.snapshotToPB(sn))
	}
	if req.GetWithDeleted() || req.GetDeletedOnly() {
		records, err := s.deletedSnapshots(ctx, req.GetSnapshotId(), req.GetSourceVolumeId())
		if err != nil {
			return nil, err
		}
		resp.Snapshots = append(resp.Snapshots, records...)
	}
	return resp, nil
}

// deletedSnapshots answers the node's records of deleted snapshots, of
// snapshot id or of source volume when given.
func (s *Server) deletedSnapshots(ctx context.Context, id, source string) ([]*pb.Snapshot, error) {
	records, err := s.records.DeletedSnapshots(ctx)
	if err != nil {
		return nil, err
	}
	var out []*pb.Snapshot
	for _, d := range records {
		if (id == "" || d.ID == id) && (source == "" || d.SourceVolumeID == source) {
			out = append(out, &pb.Snapshot{SnapshotId: d.ID, SourceVolumeId: d.SourceVolumeID, CreatedUnix: d.CreatedUnix, NodeId: s.cfg.NodeID, Deleted: true})
		}
	}
	return out, nil
}

func (s *Server) volumeToPB(v volume.Volume) *pb.Volume {
	return &pb.Volume{
		VolumeId:             v.ID,
		Name:                 v.Name,
		CapacityBytes:        v.Capacity,
		UsedBytes:            v.Used,
		Parameters:           v.Parameters,
		Source:               v.Source,
		NodeId:               s.cfg.NodeID,
		CreatedUnix:          v.Created.Unix(),
		Generation:           v.Generation,
		MovingTo:             v.MovingTo,
		FailoverFromSnapshot: v.FailoverFrom,
	}
}

func (s *Server) snapshotToPB(sn volume.Snapshot) *pb.Snapshot {
	return &pb.Snapshot{
		SnapshotId:     sn.ID,
		Name:           sn.Name,
		SourceVolumeId: sn.SourceVolumeID,
		SizeBytes:      sn.Size,
		CreatedUnix:    sn.Created.Unix(),
		NodeId:         s.cfg.NodeID,
		OwnerDigest:    sn.OwnerDigest,
	}
}

// GetCopy describes this node's copy of a volume, whatever its role.
func (s *Server) GetCopy(ctx context.Context, req *pb.GetCopyRequest) (*pb.Copy, error) {
	c, err := s.copyOf(ctx, req.GetVolumeId())
	return c, err
}

func (s *Server) copyOf(ctx context.Context, id string) (*pb.Copy, error) {
	c, err := s.copies.Copy(ctx, id)
	if err != nil {
		return nil, err
	}
	out := s.copyToPB(c)
	promised, err := s.records.Promised(ctx, id)
	if err != nil {
		return nil, err
	}
	out.PromisedGeneration, out.PromisedHolder = promised.Generation, promised.Holder
	if c.Exists && c.Role == contract.RoleReplica {
		out.SnapshotGuids = c.SnapshotGUIDs
		if s.receiver != nil {
			if out.Resumable, err = s.receiver.Resumable(ctx, id); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// Reserve promises a generation of a volume to one promotion.
func (s *Server) Reserve(ctx context.Context, req *pb.ReserveRequest) (*pb.ReserveResponse, error) {
	if got, own := req.GetWitnessDigest(), s.Witnesses.Digest(); got != own {
		return nil, errdefs.Wrap(errdefs.ErrUnavailable, "node %s counts the witness set %s and the controller counted this reservation over %s: no generation of volume %s is granted until the controller and every node list the same witnesses (a controller older than witnesses counts every node: upgrade it; docs/operations.md, \"Witnesses\")",
			s.cfg.NodeID, witnesses.Describe(s.Witnesses.Entries(), own), witnesses.Describe(nil, got), req.GetVolumeId())
	}
	if (req.GetFailover() || len(req.GetFailoverFrom()) > 0) && s.AttestSilence != nil {
		if err := s.attest(req); err != nil {
			return nil, err
		}
	}
	reserve := s.records.Reserve
	if req.GetFailover() {
		reserve = s.records.ReserveForFailover
	}
	p, granted, err := reserve(ctx, req.GetVolumeId(), req.GetGeneration(), req.GetHolderNodeId())
	if err != nil {
		return nil, err
	}
	return &pb.ReserveResponse{Granted: granted, PromisedGeneration: p.Generation, PromisedHolder: p.Holder}, nil
}

// RetirePeer stops counting a stopped node, at the operator's word
// (zfs-controller retire-node; the agent port lets only an operator's
// certificate call it).
func (s *Server) RetirePeer(ctx context.Context, req *pb.RetirePeerRequest) (*pb.RetirePeerResponse, error) {
	if s.Retire == nil {
		return nil, errdefs.Wrap(errdefs.ErrFailedPrecondition, "node %s keeps no lease, so it counts no node to retire", s.cfg.NodeID)
	}
	if err := s.Retire(req.GetNodeId()); err != nil {
		return nil, err
	}
	known := 0
	if s.KnownNodes != nil {
		known = s.KnownNodes()
	}
	s.log.Warn("node retired at the operator's word: this node's lease no longer counts it, and its calls are refused until this node restarts",
		"retired_node", req.GetNodeId(), "known_nodes", known)
	return &pb.RetirePeerResponse{KnownNodes: uint32(known)}, nil
}

// attest checks a failover's reservation against this node's lease. A
// node without peers keeps no lease, and neither do the silent nodes (the
// same configuration), so nothing made their primaries read-only: it
// grants the operator's promotion, on the operator's word, and refuses
// the controller's automatic failover.
func (s *Server) attest(req *pb.ReserveRequest) error {
	err := s.AttestSilence(req.GetFailoverFrom(), req.GetAnsweringNodeIds())
	switch {
	case err == nil:
		return nil
	case errors.Is(err, lease.ErrNoLease) && req.GetOperator():
		s.log.Warn("failover granted on the operator's word: this node keeps no lease (no peers configured) and cannot tell whether the silent nodes stopped writing",
			"volume_id", req.GetVolumeId(), "generation", req.GetGeneration(), "silent", strings.Join(req.GetFailoverFrom(), ","))
		return nil
	case errors.Is(err, lease.ErrNoLease):
		return errdefs.Wrap(errdefs.ErrUnavailable, "node %s refuses generation %d of volume %s for an automatic failover: %v",
			s.cfg.NodeID, req.GetGeneration(), req.GetVolumeId(), err)
	}
	return errdefs.Wrap(errdefs.ErrUnavailable, "node %s does not grant generation %d of volume %s for a failover yet: %v",
		s.cfg.NodeID, req.GetGeneration(), req.GetVolumeId(), err)
}

func (s *Server) copyToPB(c volume.Copy) *pb.Copy {
	return &pb.Copy{
		VolumeId: c.VolumeID, NodeId: s.cfg.NodeID, Exists: c.Exists, Role: c.Role, Name: c.Name,
		Generation: c.Generation, MovingTo: c.MovingTo, FencedUnixNano: c.FencedAt, Mounted: c.Mounted,
		LastSnapshot: c.LastSnapshot, LastSnapshotUnixNano: c.LastSnapshotAt,
		Parameters: c.Parameters, CapacityBytes: c.Capacity, FailoverFromSnapshot: c.FailoverFrom,
		ForcedGeneration: c.Forced, LeaseFenced: c.LeaseFenced, WrittenSince: c.WrittenSince, HistoryFrom: c.HistoryFrom,
	}
}

// Fence makes this node's primary read-only for a move to another node.
func (s *Server) Fence(ctx context.Context, req *pb.FenceRequest) (*pb.FenceResponse, error) {
	if req.GetTargetNodeId() == "" || req.GetTargetNodeId() == s.cfg.NodeID {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "fence: target_node_id must name another node")
	}
	at, err := s.copies.Fence(ctx, req.GetVolumeId(), req.GetTargetNodeId())
	if err != nil {
		return nil, err
	}
	return &pb.FenceResponse{FencedUnixNano: at}, nil
}

// Unfence lifts a fence after an abandoned move.
func (s *Server) Unfence(ctx context.Context, req *pb.UnfenceRequest) (*pb.Copy, error) {
	if err := s.copies.Unfence(ctx, req.GetVolumeId(), req.GetGeneration()); err != nil {
		return nil, err
	}
	return s.GetCopy(ctx, &pb.GetCopyRequest{VolumeId: req.GetVolumeId()})
}

// Promote turns this node's replica into the primary.
func (s *Server) Promote(ctx context.Context, req *pb.PromoteRequest) (*pb.Copy, error) {
	if req.GetGeneration() == 0 {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "promote: generation is required")
	}
	c, err := s.copies.Promote(ctx, req.GetVolumeId(), req.GetGeneration(), req.GetNotBeforeUnixNano(), req.GetSourceNodeId(), req.GetFailover())
	if err != nil {
		return nil, err
	}
	if req.GetForced() {
		if err := s.forcing.MarkForced(ctx, req.GetVolumeId(), req.GetGeneration()); err != nil {
			return nil, err
		}
		c.Forced = req.GetGeneration()
	}
	return s.copyToPB(c), nil
}

// Demote retires this node's stale primary: to a replica, or aside.
func (s *Server) Demote(ctx context.Context, req *pb.DemoteRequest) (*pb.Copy, error) {
	if err := s.copies.Demote(ctx, req.GetVolumeId(), req.GetGeneration(), req.GetAside()); err != nil {
		return nil, err
	}
	return s.GetCopy(ctx, &pb.GetCopyRequest{VolumeId: req.GetVolumeId()})
}

// AcquireWorkLease grants, renews or releases this node's part of the
// work lease.
func (s *Server) AcquireWorkLease(_ context.Context, req *pb.WorkLeaseRequest) (*pb.WorkLease, error) {
	in := instanceFromPB(req.GetInstance())
	l, err := s.WorkLease.Acquire(in, req.GetRelease())
	if err != nil {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "work lease: %v", err)
	}
	return workLeaseToPB(l), nil
}

// WorkLeases tells who holds this node's part of the work lease.
func (s *Server) WorkLeases(context.Context, *pb.WorkLeasesRequest) (*pb.WorkLease, error) {
	return workLeaseToPB(s.WorkLease.Look()), nil
}

func instanceFromPB(in *pb.ControllerInstance) worklease.Instance {
	return worklease.Instance{ID: in.GetId(), Host: in.GetHost(), Address: in.GetAddress(), Version: in.GetVersion(), Started: timeOfUnix(in.GetStartedUnix()), NomadAlloc: in.GetNomadAllocId()}
}

func instanceToPB(in worklease.Instance) *pb.ControllerInstance {
	return &pb.ControllerInstance{Id: in.ID, Host: in.Host, Address: in.Address, Version: in.Version, StartedUnix: unixOrZero(in.Started), NomadAllocId: in.NomadAlloc}
}

func workLeaseToPB(l worklease.Lease) *pb.WorkLease {
	out := &pb.WorkLease{
		Granted:           l.Granted,
		HolderSinceUnix:   unixOrZero(l.HolderSince),
		RemainingMillis:   l.Remaining.Milliseconds(),
		GrantsAfterMillis: l.GrantsAfter.Milliseconds(),
	}
	if l.Holder.ID != "" {
		out.Holder = instanceToPB(l.Holder)
	}
	for _, seen := range l.Seen {
		out.Seen = append(out.Seen, &pb.SeenInstance{Instance: instanceToPB(seen.Instance), LastSeenMillisAgo: seen.Ago.Milliseconds()})
	}
	return out
}

// timeOfUnix is the time of unix seconds, zero for 0.
func timeOfUnix(sec int64) time.Time {
	if sec == 0 {
		return time.Time{}
	}
	return time.Unix(sec, 0)
}
