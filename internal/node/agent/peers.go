package agent

import (
	"context"

	"google.golang.org/grpc"
	grpcpeer "google.golang.org/grpc/peer"

	"github.com/zfs-nomad/zfs-nomad/internal/node/lease"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/connpool"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// PeersServer serves a node's lease.Server to its peers (pb.PeersServer).
// It names each caller by its verified node certificate; a call without
// one is answered but not recorded as the caller's.
type PeersServer struct {
	pb.UnimplementedPeersServer
	Lease *lease.Server
}

func (s *PeersServer) Ping(ctx context.Context, req *pb.PingRequest) (*pb.PingResponse, error) {
	nodeID, domain, err := s.Lease.Ping(callerOf(ctx), req.GetWitnessDigest())
	if err != nil {
		return nil, errdefs.ToStatus(err)
	}
	return &pb.PingResponse{NodeId: nodeID, Domain: domain}, nil
}

func (s *PeersServer) Promises(ctx context.Context, req *pb.PromisesRequest) (*pb.PromisesResponse, error) {
	generations, err := s.Lease.Promises(ctx, callerOf(ctx), req.GetVolumeIds())
	if err != nil {
		return nil, errdefs.ToStatus(err)
	}
	return &pb.PromisesResponse{Generations: generations}, nil
}

// callerOf is the node the caller's verified certificate names, "" for
// none.
func callerOf(ctx context.Context) string {
	name, _ := tlsconfig.NameOf(ctx)
	return name
}

// PeerClient calls the peers' lease service for lease.Heartbeat, over one
// connection per address, and holds each answer to the node it names: a
// node may answer only as itself.
type PeerClient struct {
	conns *connpool.Pool
	// WitnessDigest is sent with every ping: the digest of this node's
	// witness set ("" for none). A peer counting another set refuses.
	WitnessDigest string
}

// NewPeerClient returns a client that connects to the peers with dial.
// Its connections are its own, apart from replication's
// (ReplicationPeers): a ping must not wait behind a bulk stream's flow
// control on a shared connection, where a busy link could cost the lease.
func NewPeerClient(dial func(addr string) (*grpc.ClientConn, error)) *PeerClient {
	return &PeerClient{conns: connpool.New(dial)}
}

// Ping asks the agent at addr which node it is, and checks the answer
// against the node its certificate names.
func (c *PeerClient) Ping(ctx context.Context, addr string) (string, error) {
	conn, err := c.conns.Get(addr)
	if err != nil {
		return "", err
	}
	var server grpcpeer.Peer
	resp, err := pb.NewPeersClient(conn).Ping(ctx, &pb.PingRequest{WitnessDigest: c.WitnessDigest}, grpc.Peer(&server))
	if err != nil {
		return "", errdefs.FromStatus(err)
	}
	if err := tlsconfig.CheckClaim(&server, resp.GetNodeId()); err != nil {
		return "", errdefs.FromStatus(err)
	}
	return resp.GetNodeId(), nil
}

// Promises asks node nodeID, at addr, for its promises of ids.
func (c *PeerClient) Promises(ctx context.Context, addr, nodeID string, ids []string) (map[string]uint64, error) {
	conn, err := c.conns.Get(addr)
	if err != nil {
		return nil, err
	}
	resp, err := pb.NewPeersClient(tlsconfig.Bind(conn, nodeID)).Promises(ctx, &pb.PromisesRequest{VolumeIds: ids})
	if err != nil {
		return nil, errdefs.FromStatus(err)
	}
	return resp.GetGenerations(), nil
}

// Close closes the connections; a later call dials again.
func (c *PeerClient) Close() { c.conns.Close() }
