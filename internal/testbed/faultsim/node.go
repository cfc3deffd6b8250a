package faultsim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"

	"github.com/zfs-nomad/zfs-nomad/internal/node/agent"
	"github.com/zfs-nomad/zfs-nomad/internal/node/assembly"
	csinode "github.com/zfs-nomad/zfs-nomad/internal/node/csiserver"
	"github.com/zfs-nomad/zfs-nomad/internal/node/lease"
	"github.com/zfs-nomad/zfs-nomad/internal/node/mount"
	"github.com/zfs-nomad/zfs-nomad/internal/node/replication"
	"github.com/zfs-nomad/zfs-nomad/internal/node/volume"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfsfake"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/csiplugin"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/peers"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/protocol"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/worklease"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/memnet"
)

const (
	rootDataset = "tank/nomad"
	poolSize    = 64 << 30
	lockWait    = 100 * time.Millisecond
)

// errCrashed is what a dead process's calls into its pool get.
var errCrashed = errors.New("sim: the process has crashed")

// simNode is one machine: a pool and a mount table that outlive its
// zfs-node process, and the process itself (an incarnation), which may
// crash and be started again.
type simNode struct {
	id      string
	w       *world
	pool    *zfsfake.Fake
	mounts  *mount.Fake // its kernel mount table: it survives the process
	handoff *handoff
	base    string  // the base directory of its staging and target paths
	domain  string  // its replication domain
	rate    float64 // its clock's rate against the simulation's (0: the same)
	// skew is its wall clock's offset, in nanoseconds: it names
	// replication snapshots and dates fences. The wall clock runs in real
	// time, so that names taken within one step differ, and it steps
	// (stepWallClock) as NTP or an operator's date steps it.
	skew atomic.Int64

	// calls is held (read) by every call of an incarnation into the
	// pool, and taken by start: see livezfs.go.
	calls     sync.RWMutex
	inc       *incarnation // nil while the process is down
	incs      int          // incarnations started so far
	restartAt int          // the step at which a down process starts again
	// lost are the volumes a promote -force declared it lost for: their
	// copies are set aside before its process starts again
	// (returnEmptyHanded).
	lost []string
}

// incarnation is one run of a node's zfs-node process.
type incarnation struct {
	n         *simNode
	num       int
	dead      atomic.Bool
	srv       *grpc.Server
	lis       *incarnationListener
	node      *csinode.Node
	volumes   *volume.Manager
	pusher    *replication.Pusher
	heartbeat *lease.Heartbeat
}

func (n *simNode) addr() string { return "passthrough:///" + addrOf(n.id) }

func (n *simNode) config() config.Node {
	cfg := config.DefaultNode()
	cfg.NodeID, cfg.RootDataset, cfg.MaxQuota = n.id, rootDataset, 8<<30
	cfg.MountBaseDirs = []string{n.base}
	cfg.Domain = n.domain
	cfg.Lease, cfg.LeaseMargin = config.Duration(n.w.cfg.Lease), config.Duration(n.w.cfg.LeaseMargin)
	cfg.ReceiveIdleTimeout = config.Duration(5 * time.Second)
	for _, m := range n.w.nodes {
		cfg.Peers = append(cfg.Peers, m.addr())
	}
	if n.w.cfg.Aliases {
		// Its own alias too: a node that does not know the address as its
		// own pings itself, and must not count its own answer twice.
		for _, m := range n.w.nodes {
			if n.w.dice.roll("alias/"+n.id+"/"+m.id, 0) < 0.5 {
				cfg.Peers = append(cfg.Peers, "passthrough:///"+addrOf(aliasOf(m.id)))
			}
		}
	}
	if n.w.cfg.NodePeers != nil {
		cfg.Peers = n.w.cfg.NodePeers(n.id, cfg.Peers)
	}
	for _, id := range n.w.cfg.Witnesses {
		cfg.Witnesses = append(cfg.Witnesses, id+"@"+addrOf(id))
	}
	return cfg
}

// start runs a new incarnation of the node's process over its pool.
func (n *simNode) start(ctx context.Context) {
	// A barrier: taking the lock waits until every pool call of the last
	// incarnation has ended (livezfs.go).
	n.calls.Lock()
	n.calls.Unlock() //lint:ignore SA2001 the lock is a barrier here
	n.incs++
	inc := &incarnation{n: n, num: n.incs}
	cfg := n.config()
	log := hclog.NewNullLogger()
	if n.w.cfg.Verbose {
		log = hclog.New(&hclog.LoggerOptions{Name: n.id, Level: hclog.Debug})
	}
	node := assembly.New(assembly.Deps{
		Config: cfg,
		ZFS:    liveZFS{z: n.pool, enter: inc.enter},
		Dial: func(addr string) (*grpc.ClientConn, error) {
			if !strings.Contains(addr, ":///") { // a witness's address, host:port as configured
				addr = "passthrough:///" + addr
			}
			opts := append(agent.DialOptions(), protocol.DialOptions()...)
			return grpc.NewClient(addr, append(opts, n.w.net.dialOptions(n.id, inc.isAlive)...)...)
		},
		Peers:      peers.Static(cfg.Peers),
		LeaseClock: func() time.Time { return n.w.nodeNow(n.rate) },
		Host:       volume.Host{Mounted: func(dataset string) (bool, error) { return n.mounts.Mounted(dataset), nil }},
		Log:        log,
	})
	inc.volumes, inc.pusher = node.Volumes, node.Pusher
	// A beat's fence, a stage, a promote wait for a busy lock within
	// their step, as a node's wait (copylock.DefaultWait) ends within a
	// beat of its lease: a lock that a stalled stream holds makes them
	// Aborted in the step, not ten seconds of real time later.
	inc.volumes.Locks().Wait = lockWait
	wall := func() time.Time { return time.Now().Add(time.Duration(n.skew.Load())) }
	inc.volumes.UseClock(wall)
	inc.pusher.UseClock(wall)
	node.Recover(ctx, log) // not fatal, as in zfs-node: the next receive retries
	node.StartLease()
	inc.heartbeat = node.Heartbeat
	// The work lease counts on the node's monotonic clock, as the lease
	// does. A node's first process cannot have granted anything before;
	// a restarted one may have, and grants nothing for a term.
	clock := func() time.Time { return n.w.nodeNow(n.rate) }
	node.Agent.WorkLease = worklease.NewGrants(clock)
	if inc.num == 1 {
		node.Agent.WorkLease = worklease.NewGrantsAtOnce(clock)
	}
	// As zfs-node serves it: the interceptor maps the handlers' errors to
	// their gRPC status.
	srvOpts := append(agent.ServerOptions(), protocol.ServerOptions("node "+n.id)...)
	if n.w.cfg.SmallBuffers {
		srvOpts = append(srvOpts, grpc.ReadBufferSize(smallBuffer), grpc.WriteBufferSize(smallBuffer))
	}
	inc.srv = grpc.NewServer(append(srvOpts, grpc.Creds(memnet.Identity{}),
		grpc.UnaryInterceptor(csiplugin.LoggingInterceptor(log.Named("agent"))))...)
	node.Register(inc.srv)
	inc.lis = n.handoff.listener()
	go func() { _ = inc.srv.Serve(inc.lis) }()
	inc.node = csinode.New(inc.volumes, n.mounts, cfg, log.Named("csi"))
	inc.node.PromotionWait = time.Nanosecond // the simulation's clock is its own: a stage looks once
	n.inc = inc
	n.w.net.setUp(n.id, true)
	rate := n.rate
	if rate == 0 {
		rate = 1
	}
	n.w.tracef("%s: process started (incarnation %d, clock rate %.2f, wall clock %+v)", n.id, inc.num, rate, time.Duration(n.skew.Load()))
}

func (inc *incarnation) isAlive() bool { return !inc.dead.Load() }

// enter lets a call into the pool through while the incarnation lives,
// and crashes it there when the dice say so; the call holds the node's
// calls lock until done.
func (inc *incarnation) enter(op, name string) (done func(), err error) {
	inc.n.calls.RLock()
	if err := inc.alive(op, name); err != nil {
		inc.n.calls.RUnlock()
		return nil, err
	}
	return inc.n.calls.RUnlock, nil
}

// alive lets a call into the pool through while the incarnation lives,
// and crashes it there when the dice say so.
func (inc *incarnation) alive(op, name string) error {
	if inc.dead.Load() {
		return errCrashed
	}
	w := inc.n.w
	w.checker.lockedChange(inc, op, name)
	// Keyed by what is called, in this step: which call the dice stop
	// at does not depend on how goroutines interleaved. Snapshot names
	// carry the wall clock (zn-<nanos>), so only the filesystem counts.
	fs, _, _ := strings.Cut(name, "@")
	key := fmt.Sprintf("crash/%d/%s/%d/%s/%s", w.stepNow.Load(), inc.n.id, inc.num, op, fs)
	if w.crashing.Load() && w.dice.roll(key, w.net.count(key)) < w.cfg.Rates.Crash {
		w.tracef("%s: process crashes at %s %s", inc.n.id, op, name)
		inc.die()
		return errCrashed
	}
	return nil
}

// die marks the process dead: from now on its calls into the pool and
// its messages fail. stop, run by the simulation's loop, cleans up.
func (inc *incarnation) die() {
	inc.dead.Store(true)
	inc.n.w.net.setUp(inc.n.id, false)
}

// stop ends the incarnation: its server, its connections.
func (n *simNode) stop() {
	inc := n.inc
	if inc == nil {
		return
	}
	inc.die()
	inc.srv.Stop()
	_ = inc.lis.Close()
	inc.pusher.Close()
	inc.heartbeat.Close()
	n.inc = nil
}
