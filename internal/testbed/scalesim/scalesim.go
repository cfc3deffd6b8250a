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
	"slices"
	"strings"
	"syscall"
	"time"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/test/bufconn"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/csiserver"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/migration"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/scheduler"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/peers"
)

// controllerName is the controller's name on the network.
const controllerName = "ctl"

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
	// Witnesses, when not 0, makes the first that many nodes the witness
	// set (docs/safety.md, "Witnesses"): the others ping only them.
	Witnesses int
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
	// With witnesses, PingsPerWitnessSecond and PingsPerOtherSecond are
	// the pings a witness and a node that is not one received per second
	// while the cluster was quiet.
	Witnesses                                  int
	PingsPerWitnessSecond, PingsPerOtherSecond float64
	// CallsPerCreate and CallsPerMove are the calls all the nodes
	// received per create of the fill and per planned move (with its
	// unpublish), by method, the heartbeat's pings apart.
	CallsPerCreate, CallsPerMove map[string]float64
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
	var addrs, witnesses []string
	for i := 1; i <= cfg.Nodes; i++ {
		n := &simNode{id: fmt.Sprintf("n%d", i)}
		addrs = append(addrs, n.addr())
		c.nodes = append(c.nodes, n)
		if i <= cfg.Witnesses {
			witnesses = append(witnesses, n.id+"@"+n.id+":7670")
		}
	}
	c.started = time.Now()
	for _, n := range c.nodes {
		if err := n.start(c.net, addrs, witnesses, cfg); err != nil {
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
	c.mig.NoFlush = !shipped.FlushOnUnpublish
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
	before := c.calls()
	vols, err := c.fill(ctx, &r)
	if err != nil {
		return r, err
	}
	r.CallsPerCreate = perOperation(before, c.calls(), len(vols))
	c.quiet(&r)
	if r.Publish, err = c.publishes(ctx, vols); err != nil {
		return r, err
	}
	moved := spread(vols, c.cfg.Samples)
	before = c.calls()
	if r.Move, err = c.moves(ctx, moved); err != nil {
		return r, err
	}
	r.CallsPerMove = perOperation(before, c.calls(), len(moved))
	if err := c.plans(ctx, &r); err != nil {
		return r, err
	}
	return r, c.failover(ctx, vols, moved, &r)
}

// calls sums the calls every node received so far, by method.
func (c *simCluster) calls() map[string]uint64 {
	sum := map[string]uint64{}
	for _, n := range c.nodes {
		for method, count := range n.calls.snapshot() {
			sum[method] += count
		}
	}
	return sum
}

// perOperation is the calls the nodes received between two sums, per
// operation of ops, the heartbeat's pings apart (they go on meanwhile).
func perOperation(before, after map[string]uint64, ops int) map[string]float64 {
	out := map[string]float64{}
	for method, count := range after {
		if method != "Peers/Ping" && ops > 0 && count > before[method] {
			out[method] = float64(count-before[method]) / float64(ops)
		}
	}
	return out
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

// unpublish is ControllerUnpublishVolume, and the flush it starts to the
// volume's replicas, to its end: the next operation measured does not
// meet it, and its calls count with the operation it ends.
func (c *simCluster) unpublish(ctx context.Context, volumeID, node string) error {
	if _, err := c.ctl.ControllerUnpublishVolume(ctx, &csispec.ControllerUnpublishVolumeRequest{VolumeId: volumeID, NodeId: node}); err != nil {
		return fmt.Errorf("ControllerUnpublishVolume %s from %s: %w", volumeID, node, err)
	}
	c.mig.WaitFlushes()
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
