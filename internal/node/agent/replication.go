package agent

import (
	"context"
	"fmt"

	"google.golang.org/grpc"

	"github.com/zfs-nomad/zfs-nomad/internal/node/replication"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/connpool"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// ReplicationServer serves a receiving end to the nodes that push to it
// (pb.ReplicationServer): a node's replication.Receiver, or a backup
// target's replication.TargetReceiver. It names each sender by its
// verified node certificate, which the receiver holds the stream's
// header to.
type ReplicationServer struct {
	pb.UnimplementedReplicationServer
	Receiver Receiving
}

// Receiving is what ReplicationServer serves.
type Receiving interface {
	ReplicaState(ctx context.Context, volumeID string) (replication.ReplicaState, error)
	Receive(ctx context.Context, sender string, in replication.Incoming) (replication.Received, error)
}

func (s *ReplicationServer) ReplicaState(ctx context.Context, req *pb.ReplicaStateRequest) (*pb.ReplicaStateResponse, error) {
	state, err := s.Receiver.ReplicaState(ctx, req.GetVolumeId())
	if err != nil {
		return nil, errdefs.ToStatus(err)
	}
	return &pb.ReplicaStateResponse{Exists: state.Exists, Role: state.Role, SnapshotGuids: state.SnapshotGUIDs,
		ResumeToken: state.ResumeToken, NodeId: state.NodeID, Generation: state.Generation}, nil
}

func (s *ReplicationServer) Receive(stream pb.Replication_ReceiveServer) error {
	ctx := stream.Context()
	sender, verified := tlsconfig.NameOf(ctx)
	if verified && sender == "" {
		// The receiver checks a named sender only: a certificate that
		// names no node could claim any.
		return errdefs.ToStatus(errdefs.Wrap(errdefs.ErrPermissionDenied,
			"the sender's certificate names no node (its common name is empty): each node needs a certificate with its node ID as the common name"))
	}
	got, err := s.Receiver.Receive(ctx, sender, &incoming{stream: stream})
	if err != nil {
		return errdefs.ToStatus(err)
	}
	return stream.SendAndClose(&pb.ReceiveResult{SnapshotGuid: got.SnapshotGUID, Bytes: got.Bytes})
}

// incoming reads a Receive stream as replication.Incoming: its first
// message is the header, every later one a chunk of data.
type incoming struct {
	stream pb.Replication_ReceiveServer
	rest   []byte // of the last chunk, not read yet
}

func (in *incoming) Header() (replication.Header, error) {
	msg, err := in.stream.Recv()
	if err != nil {
		return replication.Header{}, err
	}
	h := msg.GetHeader()
	if h == nil {
		return replication.Header{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "a receive stream starts with a header")
	}
	return headerFromPB(h), nil
}

func (in *incoming) Read(p []byte) (int, error) {
	return readData(&in.rest, p, func() ([]byte, error) {
		msg, err := in.stream.Recv()
		if err != nil {
			return nil, err // io.EOF after the last chunk
		}
		if msg.GetHeader() != nil {
			return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "a receive stream carries one header, at its start")
		}
		return msg.GetData(), nil
	})
}

// readData reads a stream of data messages into p: what is left of the
// last message (rest) first, else the next message's data (next).
func readData(rest *[]byte, p []byte, next func() ([]byte, error)) (int, error) {
	for len(*rest) == 0 {
		data, err := next()
		if err != nil {
			return 0, err
		}
		*rest = data
	}
	n := copy(p, *rest)
	*rest = (*rest)[n:]
	return n, nil
}

// ReplicationPeers reaches the peers' replication service for
// replication.Pusher, over one connection per address kept between
// pushes.
type ReplicationPeers struct {
	conns *connpool.Pool
}

// NewReplicationPeers returns peers that connect with dial.
func NewReplicationPeers(dial func(addr string) (*grpc.ClientConn, error)) *ReplicationPeers {
	return &ReplicationPeers{conns: connpool.New(dial)}
}

// Peer returns the node at addr, held to node nodeID (tlsconfig.Bind).
func (p *ReplicationPeers) Peer(addr, nodeID string) (replication.Peer, error) {
	conn, err := p.conns.Get(addr)
	if err != nil {
		return nil, err
	}
	// A connection that has failed dials again at once: a peer that is
	// back is reached now, not after gRPC's reconnect backoff.
	p.conns.ResetBackoff(addr)
	bound := tlsconfig.Bind(conn, nodeID)
	return &replicationPeer{addr: addr, bound: bound, client: pb.NewReplicationClient(bound)}, nil
}

// Close closes the connections.
func (p *ReplicationPeers) Close() { p.conns.Close() }

type replicationPeer struct {
	addr   string
	bound  *tlsconfig.Bound
	client pb.ReplicationClient
}

// ReplicaState asks the peer, which must answer as the node its
// certificate names.
func (p *replicationPeer) ReplicaState(ctx context.Context, volumeID string) (replication.ReplicaState, error) {
	resp, err := p.client.ReplicaState(ctx, &pb.ReplicaStateRequest{VolumeId: volumeID})
	if err != nil {
		return replication.ReplicaState{}, errdefs.FromStatus(err)
	}
	if err := p.bound.Claims(resp.GetNodeId()); err != nil {
		return replication.ReplicaState{}, fmt.Errorf("peer %s: %w", p.addr, errdefs.FromStatus(err))
	}
	return replication.ReplicaState{Exists: resp.GetExists(), Role: resp.GetRole(), SnapshotGUIDs: resp.GetSnapshotGuids(),
		ResumeToken: resp.GetResumeToken(), NodeID: resp.GetNodeId(), Generation: resp.GetGeneration()}, nil
}

func (p *replicationPeer) Receive(ctx context.Context, h replication.Header) (replication.Outgoing, error) {
	stream, err := p.client.Receive(ctx)
	if err != nil {
		return nil, errdefs.FromStatus(err)
	}
	if err := stream.Send(&pb.ReceiveMessage{Msg: &pb.ReceiveMessage_Header{Header: headerToPB(h)}}); err != nil {
		return nil, fmt.Errorf("%w: sending the header to %s: %v", errdefs.ErrUnavailable, p.addr, err)
	}
	return outgoing{stream}, nil
}

// outgoing sends a stream's chunks as data messages.
type outgoing struct {
	stream pb.Replication_ReceiveClient
}

func (o outgoing) Send(chunk []byte) error {
	return o.stream.Send(&pb.ReceiveMessage{Msg: &pb.ReceiveMessage_Data{Data: chunk}})
}

func (o outgoing) CloseAndRecv() (replication.Received, error) {
	res, err := o.stream.CloseAndRecv()
	if err != nil {
		return replication.Received{}, errdefs.FromStatus(err)
	}
	return replication.Received{SnapshotGUID: res.GetSnapshotGuid(), Bytes: res.GetBytes()}, nil
}

func headerToPB(h replication.Header) *pb.ReceiveHeader {
	out := &pb.ReceiveHeader{VolumeId: h.VolumeID, VolumeName: h.VolumeName, SourceNodeId: h.SourceNodeID, Kind: h.Kind,
		Snapshot: h.Snapshot, Generation: h.Generation, Parameters: h.Parameters, CapacityBytes: h.CapacityBytes, HistoryFrom: h.HistoryFrom}
	for _, b := range h.PeerBases {
		out.PeerBases = append(out.PeerBases, &pb.PeerBase{Guid: b.GUID, NodeId: b.NodeID})
	}
	return out
}

func headerFromPB(h *pb.ReceiveHeader) replication.Header {
	out := replication.Header{VolumeID: h.GetVolumeId(), VolumeName: h.GetVolumeName(), SourceNodeID: h.GetSourceNodeId(), Kind: h.GetKind(),
		Snapshot: h.GetSnapshot(), Generation: h.GetGeneration(), Parameters: h.GetParameters(), CapacityBytes: h.GetCapacityBytes(),
		HistoryFrom: h.GetHistoryFrom()}
	for _, b := range h.GetPeerBases() {
		out.PeerBases = append(out.PeerBases, replication.PeerBase{GUID: b.GetGuid(), NodeID: b.GetNodeId()})
	}
	return out
}
