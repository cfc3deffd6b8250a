package agentcontract

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/node/agent"
	"github.com/zfs-nomad/zfs-nomad/internal/node/assembly"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/volume"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfsfake"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/csiplugin"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/peers"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/protocol"
)

const rootDataset = "tank/nomad"

// network is an in-memory network of node agents: a bufconn listener
// per address.
type network struct {
	mu        sync.Mutex
	listeners map[string]*bufconn.Listener
}

// dial connects to the agent at addr ("passthrough:///<addr>") as
// zfs-node and the controller do, but in memory and without TLS: every
// call carries the protocol version, which the node checks.
func (n *network) dial(addr string) (*grpc.ClientConn, error) {
	dialer := grpc.WithContextDialer(func(ctx context.Context, target string) (net.Conn, error) {
		n.mu.Lock()
		lis, ok := n.listeners[target]
		n.mu.Unlock()
		if !ok {
			return nil, fmt.Errorf("connection refused: %s", target)
		}
		return lis.DialContext(ctx)
	})
	opts := append(agent.DialOptions(), protocol.DialOptions()...)
	opts = append(opts, dialer, grpc.WithTransportCredentials(insecure.NewCredentials()))
	return grpc.NewClient(addr, opts...)
}

// realNode is one real node: its parts as zfs-node assembles them, over
// an in-memory pool, and a mount table the test sets.
type realNode struct {
	id     string
	pool   *zfsfake.Fake
	parts  *assembly.Parts
	mu     sync.Mutex
	mounts map[string]bool // datasets mounted on the node
}

// realWorld is nodeIDs as real nodes, each served on the in-memory
// network and reached by the controller's agent client.
type realWorld struct {
	net     *network
	nodes   map[string]*realNode
	clients map[string]*agentclient.Client
}

func (w *realWorld) agent(id string) cluster.NodeAgent { return w.clients[id] }
func (w *realWorld) addr(id string) string             { return "passthrough:///" + id + ":7670" }

// startReal starts the real nodes holding what holdings says.
func startReal(t *testing.T, holdings map[string]holding) world {
	t.Helper()
	w := &realWorld{net: &network{listeners: map[string]*bufconn.Listener{}}, nodes: map[string]*realNode{}, clients: map[string]*agentclient.Client{}}
	for _, id := range nodeIDs {
		n := w.startNode(t, id, holdings[id])
		conn, err := w.net.dial(w.addr(id))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		w.nodes[id], w.clients[id] = n, agentclient.ForNode(conn, id)
	}
	return w
}

// startNode assembles node id over a new pool, lays down what h says the
// node holds (as an earlier process left it), recovers and serves it.
func (w *realWorld) startNode(t *testing.T, id string, h holding) *realNode {
	t.Helper()
	ctx := context.Background()
	pool := zfsfake.New(64<<30, "tank")
	if err := pool.CreateFilesystem(ctx, rootDataset, nil); err != nil {
		t.Fatal(err)
	}
	cfg := config.DefaultNode()
	cfg.NodeID, cfg.RootDataset, cfg.MaxQuota = id, rootDataset, 8<<30
	log := hclog.NewNullLogger()
	n := &realNode{id: id, pool: pool, mounts: map[string]bool{}}
	n.parts = assembly.New(assembly.Deps{
		Config: cfg, ZFS: pool, Dial: w.net.dial,
		Peers: peers.Static(nil), LeaseClock: time.Now, Log: log,
		Host: volume.Host{Mounted: n.mounted},
	})
	n.arrange(t, h)
	n.parts.Recover(ctx, log)
	n.parts.StartLease()
	srvOpts := append(agent.ServerOptions(), protocol.ServerOptions("node "+id)...)
	srv := grpc.NewServer(append(srvOpts, grpc.UnaryInterceptor(csiplugin.LoggingInterceptor(log)))...)
	n.parts.Register(srv)
	lis := bufconn.Listen(1 << 20)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	w.net.mu.Lock()
	w.net.listeners[id+":7670"] = lis
	w.net.mu.Unlock()
	return n
}

func (n *realNode) mounted(dataset string) (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.mounts[dataset], nil
}

// arrange gives the node what h says: the promise first, through the
// node's own Reserve (granted: the node holds no copy yet), then the copy
// as a dataset with the driver's labels, as a create, a receive, a fence
// or a lost lease left it.
func (n *realNode) arrange(t *testing.T, h holding) {
	t.Helper()
	ctx := context.Background()
	if h.promise.generation > 0 {
		_, granted, err := n.parts.Volumes.Records().Reserve(ctx, volID, h.promise.generation, h.promise.holder)
		if err != nil || !granted {
			t.Fatalf("node %s: setting up the promise %+v: granted %v, %v", n.id, h.promise, granted, err)
		}
	}
	if h.role == "" {
		return
	}
	dataset := rootDataset + "/" + volID
	props := map[string]string{
		"mountpoint":              "legacy",
		copyrecord.PropVolumeID:   volID,
		copyrecord.PropName:       volName,
		copyrecord.PropRole:       h.role,
		copyrecord.PropGeneration: strconv.FormatUint(h.generation, 10),
		copyrecord.PropMovingTo:   copyrecord.NotMoving,
	}
	switch h.role {
	case contract.RolePrimary:
		props["refquota"] = strconv.FormatUint(capacity, 10)
		props[copyrecord.PropHistoryFrom] = strconv.FormatUint(h.generation, 10)
	case contract.RoleReplica:
		props["readonly"] = "on"
		props[copyrecord.PropCapacity] = strconv.FormatUint(capacity, 10)
	}
	if h.fencedFor != "" {
		props["readonly"] = "on"
		props[copyrecord.PropMovingTo] = h.fencedFor
		props[copyrecord.PropFencedAt] = strconv.FormatInt(fencedAt, 10)
	}
	if h.leaseFenced {
		props["readonly"] = "on"
		props[copyrecord.PropLeaseFenced] = strconv.FormatInt(fencedAt, 10)
	}
	if err := n.pool.CreateFilesystem(ctx, dataset, props); err != nil {
		t.Fatal(err)
	}
	if h.snapshotAt != 0 {
		if err := n.pool.Snapshot(ctx, dataset+"@"+snapshotName(h.snapshotAt), nil); err != nil {
			t.Fatal(err)
		}
	}
	n.mu.Lock()
	n.mounts[dataset] = h.mounted
	n.mu.Unlock()
}
