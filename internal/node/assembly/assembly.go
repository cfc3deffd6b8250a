// Package assembly wires the parts of one zfs-node process together: the
// volume manager, the replication sender and receiver, the lease's
// monitor and heartbeat, and the node agent service that the controller
// and the peers call. zfs-node and the fault simulation both build their
// nodes here, so the simulation runs the node as it ships; what differs
// between them (real ZFS or a fake pool, the system's mounts or a table,
// TLS or an in-memory network, the clocks) comes in as Deps, or is set on
// the parts before Recover.
//
// A process starts in three steps: New wires the parts (no pool access),
// Recover finishes what a crash interrupted and fills the indexes, and
// StartLease makes the lease, whose monitor counts a peer never heard as
// silent since that moment: it must not count the recovery, when this
// node pinged nobody (docs/safety.md, "Leases").
package assembly

import (
	"context"
	"errors"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"

	"github.com/zfs-nomad/zfs-nomad/internal/node/agent"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copylock"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/lease"
	"github.com/zfs-nomad/zfs-nomad/internal/node/replication"
	"github.com/zfs-nomad/zfs-nomad/internal/node/volume"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/peers"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// errLeaseNotStarted answers a call that needs the lease before
// StartLease, which a process serves no call before.
var errLeaseNotStarted = errors.New("this node's lease has not started yet: retry")

// Deps are what a node process brings to its parts.
type Deps struct {
	Config config.Node
	// ZFS is the pool: libzfs, or a fake.
	ZFS zfs.Interface
	// Dial connects to a peer's agent port (replication and the lease's
	// pings).
	Dial func(addr string) (*grpc.ClientConn, error)
	// DialTarget connects to a backup target's port (Config's
	// BackupTargets), verifying it as a target, never as a node; nil
	// when the node pushes no backups.
	DialTarget func(addr string) (*grpc.ClientConn, error)
	// Peers says where the peers' agents are; LeaseClock is the clock
	// the lease counts on (monotonic: time.Now).
	Peers      peers.Source
	LeaseClock func() time.Time
	// Host is the node's mounts, volume root directories and keys.
	Host volume.Host
	Log  hclog.Logger
}

// Parts are one node process's parts, wired together.
type Parts struct {
	Volumes *volume.Manager
	// Replicas reads and removes the replicas under the node's root.
	Replicas *copyrecord.Replicas
	Pusher   *replication.Pusher
	Receiver *replication.Receiver
	Agent    *agent.Server
	// Monitor and Heartbeat are the lease's, from StartLease on.
	Monitor   *lease.Monitor
	Heartbeat *lease.Heartbeat
	peers     *agent.PeersServer
	deps      Deps
}

// New wires a node's parts but its lease; it touches no pool (Recover
// does).
func New(d Deps) *Parts {
	replicas := copyrecord.NewReplicas(d.ZFS, d.Config.RootDataset)
	p := &Parts{Replicas: replicas, deps: d}
	locks := new(copylock.Locks)
	p.newPusher(d, locks)
	vd := volume.Deps{ZFS: d.ZFS, Config: d.Config, Log: d.Log.Named("volumes"), Replicas: replicas, Locks: locks, Host: d.Host}
	if pushesBackups(d) {
		vd.Restore = p.Pusher.Restore
	}
	p.Volumes = volume.NewManager(vd)
	p.newReceiver(d, locks)
	p.newAgent(d)
	return p
}

// The sender and the receiver of replica streams change copies under
// the node's copy locks, which the volume manager takes too: one lock per
// copy, whichever part of the node changes it.

// newPusher makes the sender of replica streams, and of backups to the
// configured targets.
func (p *Parts) newPusher(d Deps, locks *copylock.Locks) {
	cfg := d.Config
	p.Pusher = replication.NewPusher(d.ZFS, locks, cfg.RootDataset, cfg.NodeID, cfg.ReplicationSnapshots,
		replication.NewLimiter(uint64(cfg.ReplicationBandwidth)), agent.NewReplicationPeers(d.Dial), d.Log.Named("replication"))
	if pushesBackups(d) {
		p.Pusher.UseTargets(cfg.BackupTargets, agent.NewReplicationPeers(d.DialTarget))
	}
}

// pushesBackups tells whether the node pushes backups to, and restores
// them from, backup targets: it is configured with some and can dial
// them.
func pushesBackups(d Deps) bool {
	return d.DialTarget != nil && len(d.Config.BackupTargets) > 0
}

// newReceiver makes the receiver of replica streams. It tells the index
// of the node's copies what it received, so the indexes stay exact.
func (p *Parts) newReceiver(d Deps, locks *copylock.Locks) {
	cfg := d.Config
	r := replication.NewReceiver(d.ZFS, locks, p.Volumes.Index(), cfg.RootDataset, cfg.NodeID, cfg.ReplicationSnapshots, d.Log.Named("replication"))
	r.MaxQuota, r.QuotaProperty = uint64(cfg.MaxQuota), cfg.QuotaProperty
	r.IdleTimeout = time.Duration(cfg.ReceiveIdleTimeout)
	r.MaxReplicasPerPeer = cfg.MaxReplicasPerPeer
	p.Receiver = r
}

// StartLease makes the node's lease on its primaries: a monitor of the
// peers' answers and the heartbeat that asks them every quarter lease
// (Run it). Without peers the node keeps no lease, and so grants no
// automatic failover (docs/safety.md, "Leases").
func (p *Parts) StartLease() {
	d := p.deps
	cfg, log := d.Config, d.Log.Named("lease")
	p.Monitor = lease.NewMonitor(time.Duration(cfg.Lease), d.LeaseClock)
	fences := p.Volumes.Fences()
	fences.FollowLease(func() bool { return p.Monitor.Held(cfg.NodeID) })
	// Validated with the configuration.
	witnessSet, _ := cfg.WitnessSet()
	if !witnessSet.Empty() {
		p.Monitor.UseWitnesses(cfg.NodeID, witnessSet)
		log.Info("the lease counts the witnesses", "witnesses", witnessSet.String(), "digest", witnessSet.Digest())
	}
	if len(cfg.Peers) > 0 || cfg.PeersFile != "" || !witnessSet.Empty() {
		// No lease and no attested silence before the peers are known;
		// after a start or a lost lease, an unmounted primary is staged
		// only once a majority confirmed it current (docs/safety.md).
		p.Monitor.RequirePeers()
		fences.RequireConfirmation()
	} else {
		log.Warn("no peers configured: this node keeps no lease, so its mounted primaries are never made read-only when it is cut off, " +
			"and it refuses to grant an automatic failover (only zfs-controller promote fails a volume over); configure peers or peers_file (docs/safety.md, \"Leases\")")
	}
	client := agent.NewPeerClient(d.Dial)
	client.WitnessDigest = witnessSet.Digest()
	p.Heartbeat = &lease.Heartbeat{Monitor: p.Monitor, NodeID: cfg.NodeID, Interval: time.Duration(cfg.Lease) / 4,
		Peers: d.Peers.Peers, Client: client, Volumes: fences, Log: log}
	// The peers' calls count as hearing them when this node attests
	// their silence (the caller is its verified node certificate).
	p.peers = &agent.PeersServer{Lease: &lease.Server{NodeID: cfg.NodeID, Domain: cfg.Domain, Promised: fences.Promised, Monitor: p.Monitor,
		WitnessDigest: witnessSet.Digest()}}
}

// newAgent makes the node agent service the controller calls. What it
// asks of the lease is read when called: from StartLease on.
func (p *Parts) newAgent(d Deps) {
	cfg := d.Config
	v := p.Volumes
	a := agent.NewServer(agent.Node{Volumes: v, Copies: v, Index: v.Index(), Records: v.Records(), Forcing: v.Fences(),
		Replicas: p.Replicas, Pusher: p.Pusher, Receiver: p.Receiver}, cfg, d.Log.Named("agent"))
	a.AttestSilence = func(addrs, answering []string) error {
		if p.Monitor == nil {
			return errLeaseNotStarted
		}
		return p.Monitor.AttestFailover(cfg.NodeID, addrs, answering, time.Duration(cfg.Lease+cfg.LeaseMargin))
	}
	a.Retire = func(nodeID string) error {
		if p.Monitor == nil {
			return errLeaseNotStarted
		}
		return p.Monitor.Retire(cfg.NodeID, nodeID, time.Duration(cfg.Lease+cfg.LeaseMargin))
	}
	a.RetiredNodes = func() []string {
		if p.Monitor == nil {
			return nil
		}
		return p.Monitor.RetiredNodes()
	}
	a.KnownNodes = func() int {
		if p.Monitor == nil {
			return 0
		}
		return p.Monitor.Members(cfg.NodeID)
	}
	a.LeaseHeld = p.Volumes.Fences().Held
	// Validated with the configuration.
	a.Witnesses, _ = cfg.WitnessSet()
	p.Agent = a
}

// Register serves the node's services on the agent port's server: the
// node agent (for the controller), replication and the lease's pings
// (for the peers). Call it after StartLease.
func (p *Parts) Register(srv *grpc.Server) {
	pb.RegisterNodeAgentServer(srv, p.Agent)
	pb.RegisterReplicationServer(srv, &agent.ReplicationServer{Receiver: p.Receiver})
	pb.RegisterPeersServer(srv, p.peers)
}

// Recover finishes at the start what a crash interrupted (replica
// replacements, keys left loaded on copies that are not staged), finds
// promise records an older node kept on the root, and starts filling the
// manager's indexes. Nothing here is fatal: the next receive of a volume
// retries its replacement, each listing of the node sweeps the keys
// again, and without the check the node keeps looking on the root too;
// it logs what failed.
func (p *Parts) Recover(ctx context.Context, log hclog.Logger) {
	if err := p.Receiver.Recover(ctx); err != nil {
		log.Error("finishing replica replacements a crash interrupted failed", "error", err)
	}
	if err := p.Volumes.SweepKeys(ctx); err != nil {
		log.Error("unloading the keys left loaded on copies that are not staged failed", "error", err)
	}
	if err := p.Volumes.Records().CheckLegacyPromises(ctx); err != nil {
		log.Error("looking for promise records on the root dataset failed", "error", err)
	}
	p.Volumes.Index().WarmIndexes()
}
