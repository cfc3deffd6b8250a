package zfsfake_test

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/zfs-nomad/zfs-nomad/internal/node/agent"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copylock"
	"github.com/zfs-nomad/zfs-nomad/internal/node/replication"
	"github.com/zfs-nomad/zfs-nomad/internal/node/volume"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// TestPushGoesOnlyToTheNodeItNames: every node certificate carries the
// same server name, so the handshake alone lets any node answer at a
// peer's address. A push to a node it names (a move's final push) refuses
// a server whose certificate names another node, and any push refuses a
// server that says it is a node its certificate does not name; neither
// sends anything.
func TestPushGoesOnlyToTheNodeItNames(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cert     string // the receiving server's certificate
		says     string // the node ID its receiver answers with
		expected string // the node the push names ("" : any)
		refused  bool
	}{
		{name: "the named node", cert: "n2", says: "n2", expected: "n2"},
		{name: "any node, as itself", cert: "n3", says: "n3", expected: ""},
		{name: "another node where the move's target was expected", cert: "liar", says: "liar", expected: "n2", refused: true},
		{name: "a node saying it is another", cert: "liar", says: "n2", expected: "", refused: true},
		{name: "a node saying it is the expected one", cert: "liar", says: "n2", expected: "n2", refused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, dst, id, fs := primaryAndPeer(t)
			must(t, src.Write(fs, "a"))
			p := pusherOverTLS(t, src, dst, tc.cert, tc.says)
			_, err := p.PushFenced(ctx, id, "n2:1", tc.expected, "test", 0, func(replication.Progress) {}, nil)
			if !tc.refused {
				must(t, err)
				return
			}
			if !errors.Is(err, errdefs.ErrPermissionDenied) {
				t.Fatalf("push: %v, want PermissionDenied", err)
			}
			if _, err := dst.s.Property(ctx, fs, "guid"); !errors.Is(err, zfs.ErrNotFound) {
				t.Errorf("the refused server received the volume (%v)", err)
			}
		})
	}
}

// pusherOverTLS is a Pusher on n1 whose peer is a Receiver on dst that
// answers as node says, served with a node certificate named cert; both
// sides over mutual TLS from one CA.
func pusherOverTLS(t *testing.T, src, dst node, cert, says string) *replication.Pusher {
	ca, err := tlsconfig.NewCA(t.TempDir())
	must(t, err)
	server, err := ca.Material(cert, tlsconfig.RoleNode)
	must(t, err)
	client, err := ca.Material("n1", tlsconfig.RoleNode)
	must(t, err)
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.Creds(server.ServerCredentials()))
	pb.RegisterReplicationServer(srv, &agent.ReplicationServer{Receiver: replication.NewReceiver(dst.s, new(copylock.Locks), nil, "tank/nomad", says, 2, hclog.NewNullLogger())})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	dial := func(string) (*grpc.ClientConn, error) {
		return grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(client.ClientCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	}
	p := replication.NewPusher(src.s, new(copylock.Locks), "tank/nomad", "n1", 2, nil, agent.NewReplicationPeers(dial), hclog.NewNullLogger())
	t.Cleanup(p.Close)
	return p
}

// TestReplicateGoesOnlyToTheTargetNodeItNames: the controller's scheduled
// pushes, catch-ups and an operator's backups name the node they push to
// (target_node_id), as a move's final push does: the agent refuses a
// server at the target address whose certificate names another node,
// sending nothing; without a name, a node that answers as itself is
// pushed to; a request whose target and fence name different nodes is
// refused as wrong.
func TestReplicateGoesOnlyToTheTargetNodeItNames(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  *pb.ReplicateRequest
		want codes.Code
	}{
		{name: "the named target is another node", req: &pb.ReplicateRequest{TargetNodeId: "n2", Purpose: "schedule"}, want: codes.PermissionDenied},
		{name: "no target named", req: &pb.ReplicateRequest{Purpose: "schedule"}, want: codes.OK},
		{name: "target and fence differ", req: &pb.ReplicateRequest{TargetNodeId: "n2", FenceForNodeId: "n3"}, want: codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, dst, id, fs := primaryAndPeer(t)
			must(t, src.Write(fs, "a"))
			// The server at the target address holds node n3's
			// certificate and answers as n3.
			p := pusherOverTLS(t, src, dst, "n3", "n3")
			cfg := config.DefaultNode()
			cfg.NodeID, cfg.RootDataset = "n1", "tank/nomad"
			volumes := volume.NewManager(volume.Deps{ZFS: src, Config: cfg, Log: hclog.NewNullLogger()})
			agentServer := agent.NewServer(agent.Node{Volumes: volumes, Copies: volumes, Index: volumes.Index(), Records: volumes.Records(), Forcing: volumes.Fences(), Pusher: p}, cfg, hclog.NewNullLogger())
			lis := bufconn.Listen(1 << 20)
			srv := grpc.NewServer()
			pb.RegisterNodeAgentServer(srv, agentServer)
			go func() { _ = srv.Serve(lis) }()
			t.Cleanup(srv.Stop)
			conn, err := grpc.NewClient("passthrough:///agent", grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
			must(t, err)
			t.Cleanup(func() { _ = conn.Close() })
			tc.req.VolumeId, tc.req.TargetAddress = id, "n2:1"
			stream, err := pb.NewNodeAgentClient(conn).Replicate(ctx, tc.req)
			must(t, err)
			for err == nil {
				_, err = stream.Recv()
			}
			if errors.Is(err, io.EOF) {
				err = nil
			}
			if status.Code(err) != tc.want {
				t.Fatalf("replicate: %v, want %s", err, tc.want)
			}
			_, got := dst.s.Property(ctx, fs, "guid")
			if received := got == nil; received != (tc.want == codes.OK) {
				t.Errorf("the server at the target received the volume: %v, want %v", received, tc.want == codes.OK)
			}
		})
	}
}
