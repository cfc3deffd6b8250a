package scalesim

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/test/bufconn"

	"github.com/zfs-nomad/zfs-nomad/internal/node/agent"
	"github.com/zfs-nomad/zfs-nomad/internal/node/assembly"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfsfake"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/csiplugin"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/peers"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/protocol"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/memnet"
)

const (
	rootDataset = "tank/nomad"
	poolSize    = 1 << 40
	// connBuffer is each in-memory connection's buffer per direction:
	// a cluster of N nodes holds about N² connections.
	connBuffer = 16 << 10
)

// simNode is one node process: its parts, its agent port's server and
// the calls it received.
type simNode struct {
	id    string
	parts *assembly.Parts
	srv   *grpc.Server
	calls *counter
	beats context.CancelFunc // ends the heartbeat
}

func (n *simNode) addr() string { return "passthrough:///" + n.id }

// start wires the node as zfs-node does, over a fake pool, with the
// configured lease, and starts its heartbeat.
func (n *simNode) start(nw *network, addrs, witnesses []string, sc Config) error {
	ctx, cancel := context.WithCancel(context.Background())
	n.beats = cancel
	pool := zfsfake.New(poolSize, "tank")
	if err := pool.CreateFilesystem(ctx, rootDataset, nil); err != nil {
		return err
	}
	base := filepath.Join(sc.Dir, n.id)
	if err := os.MkdirAll(base, 0o750); err != nil {
		return err
	}
	cfg := config.DefaultNode()
	cfg.NodeID, cfg.RootDataset, cfg.MaxQuota = n.id, rootDataset, 8<<30
	cfg.MountBaseDirs = []string{base}
	cfg.Peers, cfg.Witnesses = addrs, witnesses
	if sc.Lease > 0 {
		cfg.Lease, cfg.LeaseMargin = config.Duration(sc.Lease), config.Duration(config.MinLeaseMargin(sc.Lease))
	}
	log := hclog.NewNullLogger()
	parts := assembly.New(assembly.Deps{
		Config: cfg,
		ZFS:    pool,
		Dial: func(addr string) (*grpc.ClientConn, error) {
			if !strings.Contains(addr, ":///") { // a witness's host:port
				host, _, _ := net.SplitHostPort(addr)
				addr = "passthrough:///" + host
			}
			opts := append(agent.DialOptions(), nw.dialOptions(n.id)...)
			return grpc.NewClient(addr, opts...)
		},
		Peers:      peers.Static(addrs),
		LeaseClock: time.Now,
		Log:        log,
	})
	parts.Recover(ctx, log)
	parts.StartLease()
	n.calls = &counter{counts: map[string]uint64{}}
	opts := append(agent.ServerOptions(), protocol.ServerOptions("node "+n.id)...)
	n.srv = grpc.NewServer(append(opts, grpc.Creds(memnet.Identity{}), grpc.ChainUnaryInterceptor(n.calls.interceptor, csiplugin.LoggingInterceptor(log.Named("agent"))))...)
	parts.Register(n.srv)
	n.parts = parts
	lis := nw.listen(n.id)
	go func() { _ = n.srv.Serve(lis) }()
	go parts.Heartbeat.Run(ctx)
	return nil
}

// stop ends the node's process: its heartbeat and its agent port.
func (n *simNode) stop() {
	if n.beats != nil {
		n.beats()
	}
	if n.srv != nil {
		n.srv.Stop()
	}
}

// network connects names to in-memory listeners and delays each message.
type network struct {
	latency   time.Duration
	mu        sync.Mutex
	listeners map[string]*bufconn.Listener
}

func (nw *network) listen(name string) *bufconn.Listener {
	lis := bufconn.Listen(connBuffer)
	nw.mu.Lock()
	nw.listeners[name] = lis
	nw.mu.Unlock()
	return lis
}

// dialOptions connect as from (its identity on the serving side) and
// delay each call's request and answer by the latency.
func (nw *network) dialOptions(from string) []grpc.DialOption {
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		nw.mu.Lock()
		lis, ok := nw.listeners[addr]
		nw.mu.Unlock()
		if !ok {
			return nil, fmt.Errorf("scalesim: nothing listens at %s", addr)
		}
		return lis.DialContext(ctx)
	}
	delay := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		time.Sleep(nw.latency)
		err := invoker(ctx, method, req, reply, cc, opts...)
		time.Sleep(nw.latency)
		return err
	}
	delayStream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		time.Sleep(nw.latency)
		return streamer(ctx, desc, cc, method, opts...)
	}
	return append([]grpc.DialOption{
		grpc.WithContextDialer(dial),
		grpc.WithTransportCredentials(memnet.Identity{Name: from}),
		grpc.WithChainUnaryInterceptor(delay),
		grpc.WithChainStreamInterceptor(delayStream),
	}, protocol.DialOptions()...)
}

// counter counts the calls a node's server received, by method.
type counter struct {
	mu     sync.Mutex
	counts map[string]uint64
}

func (c *counter) interceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	c.mu.Lock()
	c.counts[shortMethod(info.FullMethod)]++
	c.mu.Unlock()
	return handler(ctx, req)
}

func (c *counter) snapshot() map[string]uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.counts)
}
