// Package scalesim measures what the driver costs as a cluster grows: N
// node processes wired as zfs-node wires them (internal/node/assembly),
// each over a fake pool, and one controller wired as zfs-controller wires
// it, in one process, talking gRPC over in-memory connections that add a
// fixed latency to every message. The leases run on the real clock with
// the shipped settings, so what a node sends and receives per second is
// what a node of an N-node cluster would (docs/architecture.md, "Scale").
//
// It measures, at each size: the creates that fill the nodes, the time
// until every node holds its lease, the calls each node receives per
// second in a quiet cluster (by method), the process's CPU and memory per
// node, the latency of a publish on the volume's node, of a planned
// move and of a failover after a node's loss, and the schedule's full
// plan and a plan from its book.
package scalesim

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/test/bufconn"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/csiserver"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/migration"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/scheduler"
	"github.com/zfs-nomad/zfs-nomad/internal/node/agent"
	"github.com/zfs-nomad/zfs-nomad/internal/node/assembly"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfsfake"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
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
	// controllerName is the controller's name on the network.
	controllerName = "ctl"
)

// Config is one measurement.
type Config struct {
	Nodes          int
	VolumesPerNode int
	// Latency is added to every message, each way.
	Latency time.Duration
	// Beats is how many heartbeat intervals (a quarter of the shipped
	// lease) the quiet cluster is measured over.
	Beats int
	// Samples is how many publishes and moves are timed (their median).
	Samples int
	// Parallel is how many creates run at once while the nodes fill.
	Parallel int
	// Lease is the nodes' lease (0: the shipped 30 s), with the smallest
	// margin it allows; a beat is a quarter of it.
	Lease time.Duration
	// Dir holds the nodes' mount base directories.
	Dir string
}

// Result is what one measurement found.
type Result struct {
	Nodes, Volumes int
	// Fill is the time the creates took, all of them; CreateEach the
	// median create.
	Fill, CreateEach time.Duration
	// LeasesHeld is the time from the nodes' start until every node held
	// its lease.
	LeasesHeld time.Duration
	// CallsPerNodeSecond are the calls a node received per second while
	// the cluster was quiet, by method (short name).
	CallsPerNodeSecond map[string]float64
	// CPUPerNode is the process's CPU time per node per second of the
	// quiet window (the controller's included, which is idle then).
	CPUPerNode time.Duration
	// HeapPerNode is the live heap after a collection, over the nodes
	// (the controller's included).
	HeapPerNode uint64
	// Publish is the median ControllerPublishVolume of a volume to the
	// node that holds it; Move the median planned move, from the first
	// ControllerPublishVolume to another node to the one that succeeds.
	Publish, Move time.Duration
	// Failover is the time from a node's loss to the first publish of
	// one of its volumes on the node of its replica that succeeds (the
	// lease and its margin, then the decision); FailoverNext the median
	// of the next volumes' publishes, once the loss is attested.
	Failover, FailoverNext time.Duration
	// FullPlan is the schedule's first plan (it asks every node for
	// everything it holds); BookPlan the next, from its book.
	FullPlan, BookPlan time.Duration
}

// Run builds the cluster, measures it and tears it down.
func Run(ctx context.Context, cfg Config) (Result, error) {
	c, err := start(cfg)
	if err != nil {
		return Result{}, err
	}
	defer c.stop()
	return c.measure(ctx)
}

// simCluster is the nodes, the network between them and the controller.
type simCluster struct {
	cfg     Config
	net     *network
	nodes   []*simNode
	started time.Time
	cl      *cluster.Cluster
	mig     *migration.Migrator
	ctl     *csiserver.Controller
	sched   *scheduler.Scheduler
}

func start(cfg Config) (*simCluster, error) {
	c := &simCluster{cfg: cfg, net: &network{latency: cfg.Latency, listeners: map[string]*bufconn.Listener{}}}
	var addrs []string
	for i := 1; i <= cfg.Nodes; i++ {
		n := &simNode{id: fmt.Sprintf("n%d", i)}
		addrs = append(addrs, n.addr())
		c.nodes = append(c.nodes, n)
	}
	c.started = time.Now()
	for _, n := range c.nodes {
		if err := n.start(c.net, addrs, cfg); err != nil {
			c.stop()
			return nil, err
		}
	}
	c.startController(addrs)
	return c, nil
}

// startController wires the controller as zfs-controller does with the
// shipped settings; the schedule does not run by itself (measure plans).
func (c *simCluster) startController(addrs []string) {
	log := hclog.NewNullLogger()
	shipped := config.DefaultController()
	c.cl = cluster.New(peers.Static(addrs), time.Duration(shipped.AgentTimeout), log, c.net.dialOptions(controllerName)...)
	c.mig = migration.New(c.cl, log)
	c.mig.MaxCatchUps = shipped.MoveCatchUps
	c.mig.PublishAheadWithin = time.Duration(shipped.MovePublishAhead)
	c.ctl = csiserver.New(c.cl, c.mig, shipped.Placement, log)
	c.sched = scheduler.New(c.cl, shipped.ParallelPushes, log)
	c.sched.Settle = c.mig.Settle
}

func (c *simCluster) stop() {
	if c.mig != nil {
		c.mig.Stop()
	}
	if c.cl != nil {
		c.cl.Close()
	}
	for _, n := range c.nodes {
		n.stop()
	}
}

func (c *simCluster) measure(ctx context.Context) (Result, error) {
	r := Result{Nodes: c.cfg.Nodes}
	if err := c.waitForLeases(ctx, &r); err != nil {
		return r, err
	}
	vols, err := c.fill(ctx, &r)
	if err != nil {
		return r, err
	}
	c.quiet(&r)
	if r.Publish, err = c.publishes(ctx, vols); err != nil {
		return r, err
	}
	moved := spread(vols, c.cfg.Samples)
	if r.Move, err = c.moves(ctx, moved); err != nil {
		return r, err
	}
	if err := c.plans(ctx, &r); err != nil {
		return r, err
	}
	return r, c.failover(ctx, vols, moved, &r)
}

// waitForLeases waits until every node holds its lease: a majority of
// its peers answered it.
func (c *simCluster) waitForLeases(ctx context.Context, r *Result) error {
	lease := c.lease()
	deadline := time.Now().Add(2 * lease)
	for {
		held := 0
		for _, n := range c.nodes {
			if n.parts.Monitor.Held(n.id) {
				held++
			}
		}
		if held == len(c.nodes) {
			r.LeasesHeld = time.Since(c.started)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d nodes hold their lease %s after the start: want all", held, len(c.nodes), 2*lease)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// A volume is one the fill created, on the node it was created on.
type volume struct {
	id   string
	node string
}

// fill creates VolumesPerNode volumes on each node through the
// controller's CreateVolume, Parallel at a time, each with one replica
// wanted (which the plans count; no push runs) and failover auto.
func (c *simCluster) fill(ctx context.Context, r *Result) ([]volume, error) {
	type job struct {
		name, node string
	}
	jobs := make(chan job)
	var (
		mu    sync.Mutex
		vols  []volume
		each  []time.Duration
		first error
	)
	var wg sync.WaitGroup
	for range max(c.cfg.Parallel, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				began := time.Now()
				resp, err := c.ctl.CreateVolume(ctx, &csispec.CreateVolumeRequest{
					Name:               j.name,
					CapacityRange:      &csispec.CapacityRange{RequiredBytes: 1 << 20},
					VolumeCapabilities: []*csispec.VolumeCapability{mountCapability},
					Parameters:         map[string]string{contract.ParamNode: j.node, contract.ParamReplicas: "1", contract.ParamFailover: contract.FailoverAuto},
				})
				mu.Lock()
				if err != nil && first == nil {
					first = fmt.Errorf("CreateVolume %s on %s: %w", j.name, j.node, err)
				}
				if err == nil {
					vols = append(vols, volume{id: resp.GetVolume().GetVolumeId(), node: j.node})
					each = append(each, time.Since(began))
				}
				mu.Unlock()
			}
		}()
	}
	began := time.Now()
	for v := range c.cfg.VolumesPerNode {
		for _, n := range c.nodes {
			jobs <- job{name: fmt.Sprintf("%s-vol%d", n.id, v), node: n.id}
		}
	}
	close(jobs)
	wg.Wait()
	r.Fill, r.CreateEach, r.Volumes = time.Since(began), median(each), len(vols)
	return vols, first
}

// quiet measures the idle cluster over Beats heartbeat intervals: the
// calls each node receives, and the process's CPU and heap.
func (c *simCluster) quiet(r *Result) {
	window := c.lease() / 4 * time.Duration(max(c.cfg.Beats, 1))
	before := make([]map[string]uint64, len(c.nodes))
	for i, n := range c.nodes {
		before[i] = n.calls.snapshot()
	}
	cpu := cpuTime()
	time.Sleep(window)
	r.CPUPerNode = (cpuTime() - cpu) / time.Duration(len(c.nodes)) * time.Second / window
	r.CallsPerNodeSecond = map[string]float64{}
	for i, n := range c.nodes {
		for method, count := range n.calls.snapshot() {
			r.CallsPerNodeSecond[method] += float64(count-before[i][method]) / window.Seconds() / float64(len(c.nodes))
		}
	}
	// Twice: buffers pooled for reuse (gRPC's shared write buffers) are
	// free after the second collection.
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	r.HeapPerNode = m.HeapAlloc / uint64(len(c.nodes))
}

// publishes times ControllerPublishVolume of Samples volumes to the
// nodes that hold them.
func (c *simCluster) publishes(ctx context.Context, vols []volume) (time.Duration, error) {
	var times []time.Duration
	for _, v := range spread(vols, c.cfg.Samples) {
		began := time.Now()
		if _, err := c.publish(ctx, v.id, v.node); err != nil {
			return 0, fmt.Errorf("ControllerPublishVolume %s to %s, the node that holds it: %w", v.id, v.node, err)
		}
		times = append(times, time.Since(began))
		if err := c.unpublish(ctx, v.id, v.node); err != nil {
			return 0, err
		}
	}
	return median(times), nil
}

// moves times planned moves of Samples volumes, each to the next node:
// ControllerPublishVolume to it, again every 100 ms while the move runs
// (the driver's time, not the CO's retry schedule), until it succeeds.
func (c *simCluster) moves(ctx context.Context, vols []volume) (time.Duration, error) {
	var times []time.Duration
	for _, v := range vols {
		target := c.nextNode(v.node)
		began := time.Now()
		deadline := began.Add(time.Minute)
		for {
			_, err := c.publish(ctx, v.id, target)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return 0, fmt.Errorf("moving %s from %s to %s: still refused after a minute: %w", v.id, v.node, target, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		times = append(times, time.Since(began))
		if err := c.unpublish(ctx, v.id, target); err != nil {
			return 0, err
		}
	}
	return median(times), nil
}

// plans times the schedule's first plan, which asks every node for what
// it holds, and the next, which its book answers.
func (c *simCluster) plans(ctx context.Context, r *Result) error {
	began := time.Now()
	if _, err := c.sched.Plan(ctx); err != nil {
		return fmt.Errorf("the schedule's full plan: %w", err)
	}
	r.FullPlan = time.Since(began)
	began = time.Now()
	if _, err := c.sched.Plan(ctx); err != nil {
		return fmt.Errorf("the schedule's plan from its book: %w", err)
	}
	r.BookPlan = time.Since(began)
	return nil
}

// failover pushes a replica of Samples volumes of the first node (none
// of them moved) to the second, stops the first node's process, and
// publishes each volume on the second until it succeeds: the first waits
// for the lease and its margin to run out.
func (c *simCluster) failover(ctx context.Context, vols, moved []volume, r *Result) error {
	lost, target := c.nodes[0], c.nodes[1]
	var mine []volume
	for _, v := range slices.Backward(vols) {
		if v.node == lost.id && !slices.Contains(moved, v) && len(mine) < max(c.cfg.Samples, 1) {
			mine = append(mine, v)
		}
	}
	if err := c.replicate(ctx, lost, target, mine); err != nil {
		return err
	}
	lost.stop()
	lostAt := time.Now()
	deadline := lostAt.Add(3 * (c.lease() + config.MinLeaseMargin(c.lease())))
	var next []time.Duration
	for i, v := range mine {
		began := time.Now()
		for {
			_, err := c.publish(ctx, v.id, target.id)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("failing %s over from the lost %s to %s: still refused: %w", v.id, lost.id, target.id, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if i == 0 {
			r.Failover = time.Since(lostAt)
		} else {
			next = append(next, time.Since(began))
		}
	}
	r.FailoverNext = median(next)
	return nil
}

// replicate pushes each volume's replica from one node to another, as
// the schedule would.
func (c *simCluster) replicate(ctx context.Context, from, to *simNode, vols []volume) error {
	nodes, _, err := c.cl.Nodes(ctx)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(nodes, func(n cluster.Node) bool { return n.Info.NodeID == from.id })
	if i < 0 {
		return fmt.Errorf("node %s did not answer", from.id)
	}
	for _, v := range vols {
		if _, err := nodes[i].Agent.Replicate(ctx, v.id, agentclient.Target{Addr: to.addr(), NodeID: to.id}, "scale", nil); err != nil {
			return fmt.Errorf("pushing a replica of %s from %s to %s: %w", v.id, from.id, to.id, err)
		}
	}
	return nil
}

// lease is the nodes' lease.
func (c *simCluster) lease() time.Duration {
	if c.cfg.Lease > 0 {
		return c.cfg.Lease
	}
	return time.Duration(config.DefaultNode().Lease)
}

func (c *simCluster) publish(ctx context.Context, volumeID, node string) (*csispec.ControllerPublishVolumeResponse, error) {
	return c.ctl.ControllerPublishVolume(ctx, &csispec.ControllerPublishVolumeRequest{VolumeId: volumeID, NodeId: node, VolumeCapability: mountCapability})
}

func (c *simCluster) unpublish(ctx context.Context, volumeID, node string) error {
	if _, err := c.ctl.ControllerUnpublishVolume(ctx, &csispec.ControllerUnpublishVolumeRequest{VolumeId: volumeID, NodeId: node}); err != nil {
		return fmt.Errorf("ControllerUnpublishVolume %s from %s: %w", volumeID, node, err)
	}
	return nil
}

func (c *simCluster) nextNode(id string) string {
	for i, n := range c.nodes {
		if n.id == id {
			return c.nodes[(i+1)%len(c.nodes)].id
		}
	}
	return c.nodes[0].id
}

var mountCapability = &csispec.VolumeCapability{
	AccessType: &csispec.VolumeCapability_Mount{Mount: &csispec.VolumeCapability_MountVolume{}},
	AccessMode: &csispec.VolumeCapability_AccessMode{Mode: csispec.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

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
func (n *simNode) start(nw *network, addrs []string, sc Config) error {
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
	cfg.Peers = addrs
	if sc.Lease > 0 {
		cfg.Lease, cfg.LeaseMargin = config.Duration(sc.Lease), config.Duration(config.MinLeaseMargin(sc.Lease))
	}
	log := hclog.NewNullLogger()
	parts := assembly.New(assembly.Deps{
		Config:  cfg,
		ZFS:     pool,
		Streams: pool.Streams(),
		Dial: func(addr string) (*grpc.ClientConn, error) {
			opts := append(agent.DialOptions(), nw.dialOptions(n.id)...)
			return grpc.NewClient(addr, opts...)
		},
		Peers:      peers.Static(addrs),
		LeaseClock: time.Now,
		Log:        log,
	})
	parts.Volumes.Mounted = func(string) (bool, error) { return false, nil }
	parts.Recover(ctx, log)
	parts.StartLease()
	n.calls = &counter{counts: map[string]uint64{}}
	opts := append(agent.ServerOptions(), protocol.ServerOptions("node "+n.id)...)
	n.srv = grpc.NewServer(append(opts, grpc.Creds(memnet.Identity{}), grpc.ChainUnaryInterceptor(n.calls.interceptor))...)
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
	out := make(map[string]uint64, len(c.counts))
	for k, v := range c.counts {
		out[k] = v
	}
	return out
}

// shortMethod is a call's service and method: "Peers/Ping" for
// "/zfsnomad.agent.v1.Peers/Ping".
func shortMethod(full string) string {
	service, method, _ := strings.Cut(strings.TrimPrefix(full, "/"), "/")
	return service[strings.LastIndex(service, ".")+1:] + "/" + method
}

func cpuTime() time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return 0
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// spread picks n volumes spread over the list (the fill interleaves the
// nodes, so they are on different nodes).
func spread(vols []volume, n int) []volume {
	if n <= 0 || len(vols) == 0 {
		return nil
	}
	out := make([]volume, 0, n)
	for i := range n {
		out = append(out, vols[(i*len(vols)/n+i)%len(vols)])
	}
	return out
}
