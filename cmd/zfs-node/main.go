// Command zfs-node is the driver's node plugin: the CSI Identity and Node
// services on the CSI endpoint, and the node agent service (for the
// controller) on a TCP port. It runs on every Nomad client with a ZFS pool.
//
// zfs-node serve is what Nomad runs (the command when the first argument
// is a flag); zfs-node -h lists the others.
package main

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/zfs-nomad/zfs-nomad/internal/node/agent"
	csinode "github.com/zfs-nomad/zfs-nomad/internal/node/csiserver"
	"github.com/zfs-nomad/zfs-nomad/internal/node/lease"
	"github.com/zfs-nomad/zfs-nomad/internal/node/mount"
	"github.com/zfs-nomad/zfs-nomad/internal/node/replication"
	"github.com/zfs-nomad/zfs-nomad/internal/node/volume"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/libzfs"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/openzfs"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfscmd"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/csiplugin"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/metrics"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/peers"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/protocol"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/version"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// recoverTimeout bounds the start's recovery of replica replacements a
// crash interrupted (Receiver.Recover).
const recoverTimeout = 5 * time.Minute

// rootsDir holds the mount points where new volumes are mounted for a
// moment to set their root directory's owner and mode: a directory of
// root's, not shared with other users as /tmp is.
const rootsDir = "/run/zfs-nomad/roots"

// serve runs the node plugin until SIGINT or SIGTERM.
func serve(args []string) error {
	cfg, err := config.LoadNode(args, os.Getenv, os.Stderr)
	if err != nil {
		return err
	}
	log := csiplugin.NewLogger("zfs-node", os.Getenv).With("node_id", cfg.NodeID)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	openZFS, err := checkOpenZFS(log)
	if err != nil {
		return err
	}
	z, volumes, err := openVolumes(ctx, cfg, log)
	if err != nil {
		return err
	}
	lis, err := listen(cfg)
	if err != nil {
		return err
	}
	serverOpts, dialCreds, certs, err := agentTLS(cfg, log)
	if err != nil {
		return err
	}
	dial := func(addr string) (*grpc.ClientConn, error) {
		opts := append(replication.DialOptions(), protocol.DialOptions()...)
		return grpc.NewClient(addr, append(opts, grpc.WithTransportCredentials(dialCreds))...)
	}
	pusher, receiver := newReplication(cfg, z, volumes, dial, openZFS, log.Named("replication"))
	defer pusher.Close()
	recoverCopies(ctx, volumes, receiver, log)

	registry := metrics.NewRegistry()
	pusher.Metrics = replication.NewMetrics(registry)
	receiver.Metrics = pusher.Metrics
	if certs != nil {
		csiplugin.WatchTLS(ctx, certs, registry)
	}
	csiSrv := grpc.NewServer(grpc.UnaryInterceptor(csiplugin.LoggingInterceptor(log.Named("csi"))))
	csispec.RegisterIdentityServer(csiSrv, csiplugin.NewIdentity(volumes.Health))
	csispec.RegisterNodeServer(csiSrv, csinode.New(volumes, mount.System{}, cfg, log.Named("csi")))
	agentSrv, heartbeat := newAgentPort(cfg, volumes, pusher, receiver, serverOpts, dial, registry, log)
	agentSrv.server.OpenZFS = openZFS
	if certs != nil {
		agentSrv.server.CertificateNotAfter = func() time.Time { return certs.Certificate().NotAfter }
	}

	log.Info("serving", "version", version.Version, "csi_endpoint", cfg.CSIEndpoint, "agent_address", lis.agent.Addr().String(),
		"root_dataset", cfg.RootDataset, "max_quota", cfg.MaxQuota.String())
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return csiplugin.Serve(gctx, csiSrv, lis.csi, 10*time.Second) })
	g.Go(func() error { return csiplugin.Serve(gctx, agentSrv.grpc, lis.agent, 10*time.Second) })
	g.Go(func() error { return csiplugin.ServeMetrics(gctx, lis.metrics, registry, log, nil) })
	g.Go(func() error { heartbeat.Run(gctx); return nil })
	err = g.Wait()
	log.Info("stopped")
	return err
}

// openVolumes opens libzfs and the node's volume manager, and checks
// that the root dataset serves within 30 s of the start.
func openVolumes(ctx context.Context, cfg config.Node, log hclog.Logger) (*libzfs.ZFS, *volume.Manager, error) {
	z, err := libzfs.New(volume.UserProperties...)
	if err != nil {
		return nil, nil, err
	}
	volumes := volume.NewManager(z, cfg, log.Named("volumes"))
	volumes.Mounted = mount.IsMountedZFS
	volumes.MountHolders = func(dataset string) []string { return mount.Holders("/proc", dataset) }
	volumes.Roots = mount.RootPreparer{Dir: rootsDir}
	// libzfs takes no key material: encrypted volumes go through the zfs
	// command with the passphrase on its standard input.
	volumes.Encryption = zfscmd.Cmd{}
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := volumes.Health(startCtx); err != nil {
		return nil, nil, fmt.Errorf("cannot serve volumes: %w", err)
	}
	return z, volumes, nil
}

// listeners are the node's three ports: CSI, the agent's, and metrics
// (nil when off).
type listeners struct {
	csi, agent, metrics net.Listener
}

func listen(cfg config.Node) (listeners, error) {
	csiLis, err := csiplugin.Listen(cfg.CSIEndpoint)
	if err != nil {
		return listeners{}, err
	}
	agentLis, err := net.Listen("tcp", cfg.AgentAddress)
	if err != nil {
		return listeners{}, fmt.Errorf("agent address %s: %w", cfg.AgentAddress, err)
	}
	metricsLis, err := csiplugin.ListenMetrics(cfg.MetricsAddress)
	if err != nil {
		return listeners{}, err
	}
	return listeners{csi: csiLis, agent: agentLis, metrics: metricsLis}, nil
}

// newReplication makes the node's sender and receiver of replica
// streams. Both change copies under the volume manager's locks, one lock
// per copy, whichever part of the node changes it; the receiver tells the
// manager what it received and entombed, so its indexes stay exact.
func newReplication(cfg config.Node, z *libzfs.ZFS, volumes *volume.Manager, dial func(string) (*grpc.ClientConn, error),
	openZFS string, log hclog.Logger) (*replication.Pusher, *replication.Receiver) {
	// Replication streams run as zfs processes, holding no libzfs handle;
	// the short reads and holds around them run in process.
	streams := z.Streams(zfscmd.Cmd{})
	pusher := replication.NewPusher(streams, volumes.Locks(), cfg.RootDataset, cfg.NodeID, cfg.ReplicationSnapshots,
		replication.NewLimiter(uint64(cfg.ReplicationBandwidth)), dial, log)
	receiver := replication.NewReceiver(streams, volumes.Locks(), cfg.RootDataset, cfg.NodeID, cfg.ReplicationSnapshots, log)
	receiver.MaxQuota, receiver.QuotaProperty = uint64(cfg.MaxQuota), cfg.QuotaProperty
	receiver.IdleTimeout = time.Duration(cfg.ReceiveIdleTimeout)
	receiver.MaxReplicasPerPeer = cfg.MaxReplicasPerPeer
	receiver.OpenZFS = openZFS
	volumes.DiscardPartialReceive = receiver.DiscardPartial
	receiver.Changed = volumes.Received
	receiver.Entombed = volumes.IndexSnapshotsOf
	return pusher, receiver
}

// recoverCopies finishes at the start what a crash interrupted (replica
// replacements), finds promise records an older node kept on the root,
// and starts filling the manager's indexes. Recovery lists every dataset
// of the node: with a thousand of them under a slow pool it takes long,
// so it has a deadline of its own. Nothing here is fatal: the next
// receive of a volume retries its replacement, and without the check the
// node keeps looking on the root too.
func recoverCopies(ctx context.Context, volumes *volume.Manager, receiver *replication.Receiver, log hclog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, recoverTimeout)
	defer cancel()
	if err := receiver.Recover(ctx); err != nil {
		log.Error("finishing replica replacements a crash interrupted failed", "error", err)
	}
	if err := volumes.CheckLegacyPromises(ctx); err != nil {
		log.Error("looking for promise records on the root dataset failed", "error", err)
	}
	volumes.WarmIndexes()
}

// agentPort is the gRPC server on the agent port and the node agent
// service it serves.
type agentPort struct {
	grpc   *grpc.Server
	server *agent.Server
}

// newAgentPort makes the agent port's server: the node agent service (for
// the controller), replication (for peers' pushes) and the peers'
// lease service, and the heartbeat that keeps this node's lease.
func newAgentPort(cfg config.Node, volumes *volume.Manager, pusher *replication.Pusher, receiver *replication.Receiver,
	serverOpts []grpc.ServerOption, dial func(string) (*grpc.ClientConn, error), registry *metrics.Registry, log hclog.Logger) (agentPort, *lease.Heartbeat) {
	serverOpts = append(serverOpts, protocol.ServerOptions("node "+cfg.NodeID)...)
	srv := grpc.NewServer(append(serverOpts, replication.ServerOptions()...)...)
	agentServer := agent.NewServer(volumes, pusher, receiver, cfg, log.Named("agent"))
	pb.RegisterNodeAgentServer(srv, agentServer)
	pb.RegisterReplicationServer(srv, receiver)
	promised := func(ctx context.Context, id string) (uint64, error) {
		p, err := volumes.Promised(ctx, id)
		return p.Generation, err
	}
	heartbeat := newHeartbeat(cfg, volumes, promised, dial, registry, log.Named("lease"))
	// The peers' calls count as hearing them when this node attests
	// their silence (the caller is its verified node certificate).
	pb.RegisterPeersServer(srv, &lease.Server{NodeID: cfg.NodeID, Domain: cfg.Domain, Promised: promised, Monitor: heartbeat.Monitor})
	agentServer.AttestSilence = func(addrs, answering []string) error {
		return heartbeat.Monitor.AttestFailover(cfg.NodeID, addrs, answering, time.Duration(cfg.Lease+cfg.LeaseMargin))
	}
	agentServer.KnownNodes = func() int { return heartbeat.Monitor.Members(cfg.NodeID) }
	agentServer.LeaseHeld = volumes.LeaseHeld
	return agentPort{grpc: srv, server: agentServer}, heartbeat
}

// agentTLS returns the agent port's server options (mutual TLS and the
// policy of who may call what) and the credentials
// of the node's calls to peers, and the TLS material they use (nil
// without TLS), which WatchTLS keeps current.
func agentTLS(cfg config.Node, log hclog.Logger) ([]grpc.ServerOption, credentials.TransportCredentials, *tlsconfig.Source, error) {
	logging := csiplugin.LoggingInterceptor(log.Named("agent"))
	if cfg.InsecureAgentPort {
		log.Warn("agent port WITHOUT TLS (-insecure-agent-port): anyone who reaches it can read and write volumes; use only on a closed test network")
		return []grpc.ServerOption{grpc.UnaryInterceptor(logging)}, insecure.NewCredentials(), nil, nil
	}
	// The node's certificate must name it: peers bind its streams and
	// promises to that name.
	src, err := csiplugin.OpenTLS(cfg.TLS, tlsconfig.Identity{Roles: []string{tlsconfig.RoleNode}, Name: cfg.NodeID}, log.Named("tls"))
	if err != nil {
		return nil, nil, nil, err
	}
	policy := tlsconfig.AgentPolicy
	return []grpc.ServerOption{
		grpc.Creds(src.ServerCredentials()),
		grpc.ChainUnaryInterceptor(policy.UnaryInterceptor(), logging),
		grpc.StreamInterceptor(policy.StreamInterceptor()),
	}, src.ClientCredentials(), src, nil
}

// newHeartbeat sets up the node's lease (docs/safety.md, "Leases"): the
// peers to ping, and what losing and regaining the lease does to the
// volumes. Staging waits for the lease too.
func newHeartbeat(cfg config.Node, volumes *volume.Manager, promised func(context.Context, string) (uint64, error),
	dial func(string) (*grpc.ClientConn, error), registry *metrics.Registry, log hclog.Logger) *lease.Heartbeat {
	monitor := lease.NewMonitor(time.Duration(cfg.Lease), time.Now)
	volumes.LeaseHeld = func() bool { return monitor.Held(cfg.NodeID) }
	if len(cfg.Peers) > 0 || cfg.PeersFile != "" {
		// No lease and no attested silence before the peers are known;
		// after a start or a lost lease, an unmounted primary is staged
		// only once a majority confirmed it current (docs/safety.md).
		monitor.RequirePeers()
		volumes.RequireConfirmation()
	} else {
		log.Warn("no peers configured: this node keeps no lease, so its mounted primaries are never made read-only when it is cut off, " +
			"and it refuses to grant an automatic failover (only zfs-controller promote fails a volume over); configure peers or peers_file (docs/safety.md, \"Leases\")")
	}
	var agents peers.Source = peers.Static(cfg.Peers)
	if cfg.PeersFile != "" {
		agents = &peers.File{Path: cfg.PeersFile}
	}
	gauge := registry.Gauge("zfs_nomad_lease_held", "1 while this node heard from a majority of all its peers, every domain, within the lease, else 0 (its mounted primaries are read-only).")
	return &lease.Heartbeat{
		Monitor:  monitor,
		NodeID:   cfg.NodeID,
		Interval: time.Duration(cfg.Lease) / 4,
		Peers:    agents.Peers,
		Dial:     dial,
		Volumes:  leaseVolumes{volumes, promised},
		Held: func(held bool) {
			v := 0.0
			if held {
				v = 1
			}
			gauge.Set(v)
		},
		Log: log,
	}
}

// leaseVolumes is the volume manager as the heartbeat sees it.
type leaseVolumes struct {
	*volume.Manager
	promised func(context.Context, string) (uint64, error)
}

func (v leaseVolumes) Promised(ctx context.Context, id string) (uint64, error) {
	return v.promised(ctx, id)
}

// checkOpenZFS logs which OpenZFS userland and kernel module this host
// runs and the libzfs this build was compiled against, and refuses to go
// on when they do not fit (issue 36). It returns the userland's release.
func checkOpenZFS(log hclog.Logger) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := openzfs.Detect(ctx)
	if err != nil {
		return "", err
	}
	log.Info("OpenZFS", "userland", v.Userland, "kernel_module", v.Kernel, "built_for", cmp.Or(openzfs.BuiltFor, "unknown"), "libzfs_binding", libzfs.Binding)
	return v.Userland, v.Check(openzfs.BuiltFor)
}
