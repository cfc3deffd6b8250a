package agent

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/test/bufconn"

	"github.com/zfs-nomad/zfs-nomad/internal/node/lease"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// peerOverTLS serves a lease server for node says behind a certificate
// naming node cert, and returns node n1's client of it.
func peerOverTLS(t *testing.T, cert string, server *lease.Server) *PeerClient {
	t.Helper()
	ca, err := tlsconfig.NewCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	serverTLS, err := ca.Material(cert, tlsconfig.RoleNode)
	if err != nil {
		t.Fatal(err)
	}
	clientTLS, err := ca.Material("n1", tlsconfig.RoleNode)
	if err != nil {
		t.Fatal(err)
	}
	lis := bufconn.Listen(1 << 16)
	srv := grpc.NewServer(grpc.Creds(serverTLS.ServerCredentials()))
	pb.RegisterPeersServer(srv, &PeersServer{Lease: server})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	c := NewPeerClient(func(addr string) (*grpc.ClientConn, error) {
		return grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(clientTLS.ClientCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	})
	t.Cleanup(c.Close)
	return c
}

// TestPeerClientHoldsAnswersToTheirNode: every node certificate carries
// the same server name, so without a check a node could answer a ping as
// another node, and count for the caller's lease as that node, or vouch
// for another node's promises. The client refuses both with
// PermissionDenied (lease.Heartbeat then counts nothing).
func TestPeerClientHoldsAnswersToTheirNode(t *testing.T) {
	for _, tc := range []struct {
		name, cert, says string
		want             error
	}{
		{"as itself", "n2", "n2", nil},
		{"as another node", "liar", "n2", errdefs.ErrPermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := peerOverTLS(t, tc.cert, &lease.Server{NodeID: tc.says, Domain: "d",
				Promised: func(context.Context, string) (uint64, error) { return 1, nil }})
			ctx := context.Background()
			nodeID, err := c.Ping(ctx, "n2:7670")
			if !errors.Is(err, tc.want) {
				t.Fatalf("Ping: %q, %v; want error %v", nodeID, err, tc.want)
			}
			if err == nil && nodeID != tc.says {
				t.Errorf("Ping answered %q, want %q", nodeID, tc.says)
			}
			gens, err := c.Promises(ctx, "n2:7670", "n2", []string{"vol-1"})
			if !errors.Is(err, tc.want) {
				t.Fatalf("Promises asked of n2: %v, %v; want error %v", gens, err, tc.want)
			}
			if err == nil && gens["vol-1"] != 1 {
				t.Errorf("Promises asked of n2: %v, want vol-1 at 1", gens)
			}
		})
	}
}

// TestPeersServerRecordsTheCallerByItsCertificate: a peer's call counts
// as hearing the node its certificate names, so this node attests no
// silence of a peer that calls it (a link dialled one way only;
// docs/safety.md).
func TestPeersServerRecordsTheCallerByItsCertificate(t *testing.T) {
	now := time.Unix(1000, 0)
	m := lease.NewMonitor(time.Minute, func() time.Time { return now })
	m.SetPeers([]string{"n1:7670"})
	now = now.Add(time.Hour)
	if err := m.Attest([]string{"n1:7670"}, time.Minute); err != nil {
		t.Fatalf("before any call: %v, want n1 attested silent", err)
	}
	c := peerOverTLS(t, "n2", &lease.Server{NodeID: "n2", Domain: "d", Monitor: m,
		Promised: func(context.Context, string) (uint64, error) { return 0, nil }})
	if _, err := c.Ping(context.Background(), "n2:7670"); err != nil {
		t.Fatal(err)
	}
	if err := m.Attest([]string{"n1:7670"}, time.Minute); err == nil {
		t.Error("n1 called, yet the server attests it silent: the call was not recorded as n1's")
	}
}
