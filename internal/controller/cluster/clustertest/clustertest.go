// Package clustertest gives tests of the controller's side (cluster,
// provision, migration, scheduler, the CSI controller) node agents
// without a network: real agent servers over in-memory gRPC (Agents), or
// in-memory fakes of cluster.Agent in plain types, without gRPC (Fakes).
package clustertest

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/peers"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// Agents are node agents served over in-memory connections.
type Agents struct {
	mu        sync.Mutex
	listeners map[string]*bufconn.Listener
	servers   map[string]*grpc.Server
	peers     []string
}

// Serve starts agent as the node agent at addr until the test ends; at
// an address stopped before, the node is back.
func (a *Agents) Serve(t testing.TB, addr string, agent pb.NodeAgentServer) {
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	pb.RegisterNodeAgentServer(srv, agent)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.listeners == nil {
		a.listeners, a.servers = map[string]*bufconn.Listener{}, map[string]*grpc.Server{}
	}
	_, before := a.servers[addr]
	a.listeners[addr], a.servers[addr] = lis, srv
	if !before {
		a.peers = append(a.peers, "passthrough:///"+addr)
	}
}

// Stop takes the agent at addr down: connecting to it is refused from
// then on.
func (a *Agents) Stop(addr string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.servers[addr].Stop()
	delete(a.listeners, addr)
}

// Cluster returns a cluster of the agents served, plus peers at the extra
// addresses, which nobody serves. Each agent call is bounded by 2 s, and
// the wait for a new connection to an agent whose connection failed by
// 100 ms.
func (a *Agents) Cluster(t testing.TB, extra ...string) *cluster.Cluster {
	a.mu.Lock()
	addrs := append([]string(nil), a.peers...)
	a.mu.Unlock()
	for _, e := range extra {
		addrs = append(addrs, "passthrough:///"+e)
	}
	dialer := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		a.mu.Lock()
		lis, ok := a.listeners[addr]
		a.mu.Unlock()
		if !ok {
			return nil, fmt.Errorf("connection refused: %s", addr)
		}
		return lis.DialContext(ctx)
	})
	c := cluster.New(peers.Static(addrs), 2*time.Second, hclog.NewNullLogger(), dialer, grpc.WithTransportCredentials(insecure.NewCredentials()))
	// In memory, an agent that is back answers a new connection at once:
	// the tests need not wait the two seconds a network may take.
	c.ReconnectWait = 100 * time.Millisecond
	t.Cleanup(c.Close)
	return c
}
