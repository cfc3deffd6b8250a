// Package agentclient is the controller's client of the node agents: one
// method per agent RPC the controller uses, taking and returning plain Go
// types, and failing with the error kinds of internal/shared/errdefs.
//
// Protobuf stops here. The agent protocol (proto/agentpb) is spoken by
// this client and by the agent server (internal/node/agent); the controller's
// logic (cluster, provision, migration, scheduler, operator) and the CSI
// adapter (controller/csiserver) see only the types of this package.
//
//	controller logic ──plain types──► agentclient ──agentpb/gRPC──► internal/node/agent
package agentclient

import (
	"context"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/worklease"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// Client calls one node agent.
type Client struct {
	rpc   pb.NodeAgentClient
	bound *tlsconfig.Bound // nil: any node may answer (New)
}

// New returns a client of the agent at the other end of conn. Any node's
// certificate may answer its calls; GetNode's answer must still name the
// node the certificate names.
func New(conn grpc.ClientConnInterface) *Client {
	return &Client{rpc: pb.NewNodeAgentClient(conn)}
}

// ForNode returns a client of the agent at the other end of conn whose
// every call must be answered by the node nodeID's certificate
// (tlsconfig.Bind); with nodeID "", by the node whose certificate
// answers first, which GetNode must then name.
func ForNode(conn grpc.ClientConnInterface, nodeID string) *Client {
	b := tlsconfig.Bind(conn, nodeID)
	return &Client{rpc: pb.NewNodeAgentClient(b), bound: b}
}

// GetNode asks the agent about its node.
func (c *Client) GetNode(ctx context.Context, opts GetNodeOptions) (NodeInfo, error) {
	var server peer.Peer
	callOpts := []grpc.CallOption{grpc.Peer(&server)}
	if opts.WaitForReady {
		callOpts = append(callOpts, grpc.WaitForReady(true))
	}
	n, err := c.rpc.GetNode(ctx, &pb.GetNodeRequest{WithoutCapacity: opts.WithoutCapacity, WithoutHealth: opts.WithoutHealth}, callOpts...)
	if err != nil {
		return NodeInfo{}, fromStatus(err)
	}
	// A node says who it is, and its certificate must say the same:
	// otherwise any node's certificate could answer as any node.
	if err := tlsconfig.CheckClaim(&server, n.GetNodeId()); err != nil {
		return NodeInfo{}, fromStatus(err)
	}
	if c.bound != nil {
		if err := c.bound.Claims(n.GetNodeId()); err != nil {
			return NodeInfo{}, fromStatus(err)
		}
	}
	return nodeInfoFromPB(n), nil
}

// CreateVolume creates a volume on the node, or returns the one an
// earlier attempt created.
func (c *Client) CreateVolume(ctx context.Context, v NewVolume) (Volume, error) {
	got, err := c.rpc.CreateVolume(ctx, &pb.CreateVolumeRequest{
		Name:                 v.Name,
		RequiredBytes:        v.RequiredBytes,
		LimitBytes:           v.LimitBytes,
		Parameters:           v.Parameters,
		SourceSnapshotId:     v.SourceSnapshotID,
		SourceVolumeId:       v.SourceVolumeID,
		EncryptionPassphrase: v.Passphrase,
		RestoreGrant:         v.RestoreGrant,
	})
	if err != nil {
		return Volume{}, fromStatus(err)
	}
	return volumeFromPB(got), nil
}

// DeleteVolume deletes the node's primary of a volume.
func (c *Client) DeleteVolume(ctx context.Context, volumeID string) error {
	_, err := c.rpc.DeleteVolume(ctx, &pb.DeleteVolumeRequest{VolumeId: volumeID})
	return fromStatus(err)
}

// GetVolume returns the node's primary of a volume; NotFound when the
// node holds none.
func (c *Client) GetVolume(ctx context.Context, volumeID string) (Volume, error) {
	v, err := c.rpc.GetVolume(ctx, &pb.GetVolumeRequest{VolumeId: volumeID})
	if err != nil {
		return Volume{}, fromStatus(err)
	}
	return volumeFromPB(v), nil
}

// ListVolumes returns a page of the node's primaries, by volume ID.
func (c *Client) ListVolumes(ctx context.Context, page Page) ([]Volume, error) {
	resp, err := c.rpc.ListVolumes(ctx, &pb.ListVolumesRequest{From: page.From, MaxEntries: page.MaxEntries})
	if err != nil {
		return nil, fromStatus(err)
	}
	return convertAll(resp.GetVolumes(), volumeFromPB), nil
}

// ExpandVolume grows a volume's quota and returns its new capacity.
func (c *Client) ExpandVolume(ctx context.Context, volumeID string, requiredBytes, limitBytes uint64) (capacityBytes uint64, err error) {
	resp, err := c.rpc.ExpandVolume(ctx, &pb.ExpandVolumeRequest{VolumeId: volumeID, RequiredBytes: requiredBytes, LimitBytes: limitBytes})
	if err != nil {
		return 0, fromStatus(err)
	}
	return resp.GetCapacityBytes(), nil
}

// CreateSnapshot snapshots a volume on the node that holds its primary,
// in a second after createdAfterUnix (0: any).
func (c *Client) CreateSnapshot(ctx context.Context, sourceVolumeID, name string, createdAfterUnix int64) (Snapshot, error) {
	s, err := c.rpc.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{SourceVolumeId: sourceVolumeID, Name: name, CreatedAfterUnix: createdAfterUnix})
	if err != nil {
		return Snapshot{}, fromStatus(err)
	}
	return snapshotFromPB(s), nil
}

// DeleteSnapshot deletes the node's copy of a snapshot, and remembers or
// forgets its deletion as d asks.
func (c *Client) DeleteSnapshot(ctx context.Context, d SnapshotDeletion) error {
	_, err := c.rpc.DeleteSnapshot(ctx, &pb.DeleteSnapshotRequest{
		SnapshotId:      d.SnapshotID,
		CreatedUpToUnix: d.CreatedUpToUnix,
		Remember:        d.Remember,
		SourceVolumeId:  d.SourceVolumeID,
		Forget:          d.Forget,
	})
	return fromStatus(err)
}

// ListSnapshots returns the node's snapshots that q selects.
func (c *Client) ListSnapshots(ctx context.Context, q SnapshotQuery) ([]Snapshot, error) {
	resp, err := c.rpc.ListSnapshots(ctx, &pb.ListSnapshotsRequest{
		SnapshotId:     q.SnapshotID,
		SourceVolumeId: q.SourceVolumeID,
		From:           q.From,
		MaxEntries:     q.MaxEntries,
		WithDeleted:    q.WithDeleted,
		DeletedOnly:    q.DeletedOnly,
	})
	if err != nil {
		return nil, fromStatus(err)
	}
	return convertAll(resp.GetSnapshots(), snapshotFromPB), nil
}

// Target is the node a push goes to: its agent's address and its node ID,
// which the pushing node requires of the certificate that answers there
// (tlsconfig.Bind). Without a node ID, the first certificate to answer
// must be the node its answers name.
type Target struct {
	Addr   string
	NodeID string
	// Backup names a backup target in the pushing node's own
	// configuration (docs/backups.md), which gives its address; Addr and
	// NodeID are then empty.
	Backup string
}

// Replicate asks the agent to push a volume to the agent of node to now,
// calls each (if set) with every progress report, and returns the last
// one; a push that completed ends with Done set. purpose says why, in the
// source node's Status ("schedule", "backup", "catch-up for the move to
// n2").
func (c *Client) Replicate(ctx context.Context, volumeID string, to Target, purpose string, each func(Progress)) (Progress, error) {
	return c.replicate(ctx, &pb.ReplicateRequest{VolumeId: volumeID, TargetAddress: to.Addr, TargetNodeId: to.NodeID, BackupTarget: to.Backup, Purpose: purpose}, each)
}

// MoveFinal is a planned move's final push: the agent fences its primary
// for a move to targetNodeID (read-only, marked as moving there) and pushes a snapshot taken
// after the fence to the agent at targetAddr. The last progress report
// carries the fence's time.
func (c *Client) MoveFinal(ctx context.Context, volumeID, targetAddr, targetNodeID string) (Progress, error) {
	return c.replicate(ctx, &pb.ReplicateRequest{VolumeId: volumeID, TargetAddress: targetAddr, FenceForNodeId: targetNodeID, TargetNodeId: targetNodeID,
		Purpose: "final step of the move to " + targetNodeID}, nil)
}

func (c *Client) replicate(ctx context.Context, req *pb.ReplicateRequest, each func(Progress)) (Progress, error) {
	stream, err := c.rpc.Replicate(ctx, req)
	if err != nil {
		return Progress{}, fromStatus(err)
	}
	var last Progress
	for {
		p, err := stream.Recv()
		if err == io.EOF {
			return last, nil
		}
		if err != nil {
			return last, fromStatus(err)
		}
		last = progressFromPB(p)
		if each != nil {
			each(last)
		}
	}
}

// Status returns the node's replicas, transfers and copies set aside.
func (c *Client) Status(ctx context.Context) (NodeStatus, error) {
	st, err := c.rpc.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		return NodeStatus{}, fromStatus(err)
	}
	return nodeStatusFromPB(st), nil
}

// Changes asks the node what became of the volumes whose copy there
// changed since it reported the volumes version since.
func (c *Client) Changes(ctx context.Context, since string) (Changes, error) {
	resp, err := c.rpc.Changes(ctx, &pb.ChangesRequest{Since: since})
	if status.Code(err) == codes.Unimplemented {
		return Changes{}, nil // a node from before the call: it cannot tell
	}
	if err != nil {
		return Changes{}, fromStatus(err)
	}
	return Changes{
		Known:     resp.GetKnown(),
		VolumeIDs: resp.GetVolumeIds(),
		Volumes:   convertAll(resp.GetVolumes(), volumeFromPB),
		Replicas:  convertAll(resp.GetReplicas(), replicaFromPB),
	}, nil
}

// DeleteReplica deletes the node's replica of a volume (volumeDeleted: the
// volume itself was deleted) and reports whether there was one.
func (c *Client) DeleteReplica(ctx context.Context, volumeID string, volumeDeleted bool) (deleted bool, err error) {
	resp, err := c.rpc.DeleteReplica(ctx, &pb.DeleteReplicaRequest{VolumeId: volumeID, VolumeDeleted: volumeDeleted})
	if err != nil {
		return false, fromStatus(err)
	}
	return resp.GetDeleted(), nil
}

// DeleteSurplus deletes the node's replica of a volume as a surplus copy:
// only if it was demoted from primary after a move, its newest snapshot
// is newest, and it holds no snapshot but the driver's replication
// snapshots and the CSI snapshots named in elsewhere (the IDs found on
// the volume's primary and the replicas kept); errdefs.ErrFailedPrecondition
// otherwise. It reports whether there was one.
func (c *Client) DeleteSurplus(ctx context.Context, volumeID, newest string, elsewhere []string) (deleted bool, err error) {
	resp, err := c.rpc.DeleteReplica(ctx, &pb.DeleteReplicaRequest{VolumeId: volumeID, SurplusNewest: newest, SnapshotsElsewhere: elsewhere})
	if err != nil {
		return false, fromStatus(err)
	}
	return resp.GetDeleted(), nil
}

// GetCopy describes the node's copy of a volume (Exists false when it
// holds none) and the generation it promised for it.
func (c *Client) GetCopy(ctx context.Context, volumeID string) (Copy, error) {
	cp, err := c.rpc.GetCopy(ctx, &pb.GetCopyRequest{VolumeId: volumeID})
	if err != nil {
		return Copy{}, fromStatus(err)
	}
	return copyFromPB(cp), nil
}

// Unfence lifts the fence of the node's primary of generation.
func (c *Client) Unfence(ctx context.Context, volumeID string, generation uint64) (Copy, error) {
	cp, err := c.rpc.Unfence(ctx, &pb.UnfenceRequest{VolumeId: volumeID, Generation: generation})
	if err != nil {
		return Copy{}, fromStatus(err)
	}
	return copyFromPB(cp), nil
}

// Promote makes the node's copy the volume's primary.
func (c *Client) Promote(ctx context.Context, p Promotion) (Copy, error) {
	cp, err := c.rpc.Promote(ctx, &pb.PromoteRequest{
		VolumeId:          p.VolumeID,
		Generation:        p.Generation,
		NotBeforeUnixNano: p.NotBeforeUnixNano,
		Failover:          p.Failover,
		Forced:            p.Forced,
		SourceNodeId:      p.SourceNodeID,
	})
	if err != nil {
		return Copy{}, fromStatus(err)
	}
	return copyFromPB(cp), nil
}

// Demote retires the node's older primary.
func (c *Client) Demote(ctx context.Context, d Demotion) (Copy, error) {
	cp, err := c.rpc.Demote(ctx, &pb.DemoteRequest{VolumeId: d.VolumeID, Generation: d.Generation, Aside: d.Aside})
	if err != nil {
		return Copy{}, fromStatus(err)
	}
	return copyFromPB(cp), nil
}

// Reserve asks the node to promise a generation of a volume.
func (c *Client) Reserve(ctx context.Context, r Reservation) (Promise, error) {
	resp, err := c.rpc.Reserve(ctx, &pb.ReserveRequest{
		VolumeId:         r.VolumeID,
		Generation:       r.Generation,
		HolderNodeId:     r.HolderNodeID,
		FailoverFrom:     r.FailoverFrom,
		Operator:         r.Operator,
		Failover:         r.Failover,
		AnsweringNodeIds: r.Answering,
		WitnessDigest:    r.WitnessDigest,
	})
	if err != nil {
		return Promise{}, fromStatus(err)
	}
	return Promise{Granted: resp.GetGranted(), PromisedGeneration: resp.GetPromisedGeneration(), PromisedHolder: resp.GetPromisedHolder()}, nil
}

// AcquireWorkLease asks the node for its part of the work lease for self
// (or, release, gives it up). A node older than the lease answers
// worklease.ErrNodeTooOld.
func (c *Client) AcquireWorkLease(ctx context.Context, self worklease.Instance, release bool) (worklease.Lease, error) {
	l, err := c.rpc.AcquireWorkLease(ctx, &pb.WorkLeaseRequest{Instance: instanceToPB(self), Release: release})
	return workLeaseOrError(l, err)
}

// WorkLeases tells who holds the node's part of the work lease.
func (c *Client) WorkLeases(ctx context.Context) (worklease.Lease, error) {
	l, err := c.rpc.WorkLeases(ctx, &pb.WorkLeasesRequest{})
	return workLeaseOrError(l, err)
}

// RetirePeer makes the node stop counting nodeID, a stopped node, for its
// lease; it returns how many nodes the node's lease counts then.
func (c *Client) RetirePeer(ctx context.Context, nodeID string) (knownNodes int, err error) {
	resp, err := c.rpc.RetirePeer(ctx, &pb.RetirePeerRequest{NodeId: nodeID})
	if err != nil {
		return 0, fromStatus(err)
	}
	return int(resp.GetKnownNodes()), nil
}

func workLeaseOrError(l *pb.WorkLease, err error) (worklease.Lease, error) {
	if status.Code(err) == codes.Unimplemented {
		return worklease.Lease{}, fmt.Errorf("%w: %v", worklease.ErrNodeTooOld, err)
	}
	if err != nil {
		return worklease.Lease{}, fromStatus(err)
	}
	return workLeaseFromPB(l), nil
}
