package tlsconfig

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
)

// serve serves the health service on an in-memory listener with creds
// and returns a connection to it dialled with dial.
func serve(t *testing.T, creds, dial credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 16)
	srv := grpc.NewServer(grpc.Creds(creds))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///agent", grpc.WithTransportCredentials(dial),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestBindHoldsTheServerToItsNode(t *testing.T) {
	ca, err := NewCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	material := func(name, role string) *Material {
		m, err := ca.Material(name, role)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	client := material("controller", RoleController).ClientCredentials()
	n2 := material("n2", RoleNode).ServerCredentials()
	liar := material("liar", RoleNode).ServerCredentials()
	for _, tc := range []struct {
		name      string
		server    credentials.TransportCredentials
		dial      credentials.TransportCredentials
		bind      string
		wantNode  string // Node() after a call
		wantRefus bool
	}{
		{name: "the expected node answers", server: n2, dial: client, bind: "n2", wantNode: "n2"},
		{name: "another node's certificate answers", server: liar, dial: client, bind: "n2", wantNode: "n2", wantRefus: true},
		{name: "unbound: the first answer decides", server: liar, dial: client, bind: "", wantNode: "liar"},
		{name: "no TLS: unchecked", server: insecure.NewCredentials(), dial: insecure.NewCredentials(), bind: "n2", wantNode: "n2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := Bind(serve(t, tc.server, tc.dial), tc.bind)
			hc := healthpb.NewHealthClient(b)
			_, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{})
			if got := status.Code(err); (got == codes.PermissionDenied) != tc.wantRefus || (!tc.wantRefus && err != nil) {
				t.Fatalf("unary call: %v, want refused %v", err, tc.wantRefus)
			}
			stream, err := hc.Watch(context.Background(), &healthpb.HealthCheckRequest{})
			if err == nil {
				_, err = stream.Recv()
			}
			if got := status.Code(err); (got == codes.PermissionDenied) != tc.wantRefus || (!tc.wantRefus && err != nil) {
				t.Fatalf("stream: %v, want refused %v", err, tc.wantRefus)
			}
			if got := b.Node(); got != tc.wantNode {
				t.Fatalf("Node() = %q, want %q", got, tc.wantNode)
			}
		})
	}
}

func TestClaims(t *testing.T) {
	for _, tc := range []struct {
		bound, claim string
		ok           bool
	}{
		{"n2", "n2", true},
		{"liar", "n2", false},
		{"", "n2", true}, // no certificate seen: nothing to hold it to
	} {
		err := Bind(nil, tc.bound).Claims(tc.claim)
		if (err == nil) != tc.ok || (err != nil && status.Code(err) != codes.PermissionDenied) {
			t.Errorf("bound to %q, claims %q: %v, want ok %v", tc.bound, tc.claim, err, tc.ok)
		}
	}
}
