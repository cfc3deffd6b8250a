package lease

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/test/bufconn"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// TestPingCountsOnlyANodeAnsweringAsItself (issue 35): every node
// certificate carries the same server name, so without a check a node
// could answer a ping as another node and count for this node's lease
// as that node. A ping is counted only when the answer names the node
// the server's certificate names.
func TestPingCountsOnlyANodeAnsweringAsItself(t *testing.T) {
	for _, tc := range []struct {
		name, cert, says string
		counted          bool
	}{
		{"as itself", "n2", "n2", true},
		{"as another node", "liar", "n2", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ca, err := tlsconfig.NewCA(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			server, err := ca.Material(tc.cert, tlsconfig.RoleNode)
			if err != nil {
				t.Fatal(err)
			}
			client, err := ca.Material("n1", tlsconfig.RoleNode)
			if err != nil {
				t.Fatal(err)
			}
			lis := bufconn.Listen(1 << 16)
			srv := grpc.NewServer(grpc.Creds(server.ServerCredentials()))
			pb.RegisterPeersServer(srv, &Server{NodeID: tc.says, Domain: "d",
				Promised: func(context.Context, string) (uint64, error) { return 0, nil }})
			go srv.Serve(lis)
			t.Cleanup(srv.Stop)
			h := &Heartbeat{
				Monitor:  NewMonitor(time.Minute, time.Now),
				NodeID:   "n1",
				Interval: 2 * time.Second,
				Peers:    func() ([]string, error) { return []string{"n2:7670"}, nil },
				Dial: func(string) (*grpc.ClientConn, error) {
					return grpc.NewClient("passthrough:///n2:7670", grpc.WithTransportCredentials(client.ClientCredentials()),
						grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
				},
				Volumes: &fakeVolumes{},
				Log:     hclog.NewNullLogger(),
			}
			defer h.closeConns()
			h.beat(context.Background())
			if got := h.Monitor.nodeOf("n2:7670") != ""; got != tc.counted {
				t.Fatalf("the ping was counted: %v, want %v", got, tc.counted)
			}
			if got := h.Monitor.Held("n1"); got != tc.counted {
				t.Errorf("lease held: %v, want %v", got, tc.counted)
			}
		})
	}
}
