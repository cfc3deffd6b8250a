package agentclient

import (
	"context"
	"errors"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/test/bufconn"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// serveTLS serves a over mutual TLS with a node certificate named cert,
// and returns the connection the controller dials.
func serveTLS(t *testing.T, a *agent, cert string) grpc.ClientConnInterface {
	t.Helper()
	ca, err := tlsconfig.NewCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	server, err := ca.Material(cert, tlsconfig.RoleNode)
	if err != nil {
		t.Fatal(err)
	}
	controller, err := ca.Material("controller", tlsconfig.RoleController)
	if err != nil {
		t.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.Creds(server.ServerCredentials()))
	pb.RegisterNodeAgentServer(srv, a)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///agent",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(controller.ClientCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// A node certificate answers only as its own node: GetNode naming another
// node is refused, and a client held to a node refuses another's answers.
// Every node certificate carries the same server name, so the handshake
// alone accepts any node certificate as any node.
func TestNodeAnswersOnlyAsItself(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cert    string // the server's certificate's common name
		claims  string // the node ID its GetNode answers
		bind    string // ForNode's node; "-" for New
		call    func(context.Context, *Client) error
		refused bool
	}{
		{name: "GetNode as itself", cert: "n2", claims: "n2", bind: "-", refused: false},
		{name: "GetNode as another node", cert: "liar", claims: "n2", bind: "-", refused: true},
		{name: "GetNode as another node, held to the first answer", cert: "liar", claims: "n2", bind: "", refused: true},
		{name: "a call held to the node that answers", cert: "n2", claims: "n2", bind: "n2", refused: false,
			call: func(ctx context.Context, c *Client) error { _, err := c.GetVolume(ctx, "v"); return err }},
		{name: "a call held to another node", cert: "liar", claims: "liar", bind: "n2", refused: true,
			call: func(ctx context.Context, c *Client) error { _, err := c.GetVolume(ctx, "v"); return err }},
		{name: "a stream held to another node", cert: "liar", claims: "liar", bind: "n2", refused: true,
			call: func(ctx context.Context, c *Client) error {
				_, err := c.Replicate(ctx, "v", Target{Addr: "n3:1"}, "test", nil)
				return err
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &agent{node: &pb.Node{NodeId: tc.claims}, volume: &pb.Volume{VolumeId: "v"},
				progress: []*pb.ReplicateProgress{{Done: true}}}
			conn := serveTLS(t, a, tc.cert)
			c := New(conn)
			if tc.bind != "-" {
				c = ForNode(conn, tc.bind)
			}
			call := tc.call
			if call == nil {
				call = func(ctx context.Context, c *Client) error { _, err := c.GetNode(ctx, GetNodeOptions{}); return err }
			}
			err := call(context.Background(), c)
			if got := errors.Is(err, errdefs.ErrPermissionDenied); got != tc.refused || (!tc.refused && err != nil) {
				t.Fatalf("got %v, want refused %v", err, tc.refused)
			}
		})
	}
}
