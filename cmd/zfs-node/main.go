// Command zfs-node is the driver's node plugin: the CSI Identity and Node
// services on the CSI endpoint, and on a TCP port (the agent port) the
// node agent service for the controller and replication and the lease's
// calls for the peers. It runs on every Nomad client with a ZFS pool.
//
// zfs-node serve is what Nomad runs (the command when the first argument
// is a flag); zfs-node -h lists the others.
package main

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/zfs-nomad/zfs-nomad/internal/node/agent"
	"github.com/zfs-nomad/zfs-nomad/internal/node/assembly"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	csinode "github.com/zfs-nomad/zfs-nomad/internal/node/csiserver"
	"github.com/zfs-nomad/zfs-nomad/internal/node/mount"
	"github.com/zfs-nomad/zfs-nomad/internal/node/replication"
	"github.com/zfs-nomad/zfs-nomad/internal/node/volume"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/libzfs"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/openzfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/cmdline"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/csiplugin"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/metrics"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/peers"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/protocol"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/version"
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
	cfg, err := config.LoadNode(args, os.Getenv, cmdline.UsageOutput)
	if err != nil {
		return err
	}
	baseLog, flushLog := csiplugin.NewServerLogger("zfs-node", os.Getenv)
	defer flushLog()
	log := baseLog.With("node_id", cfg.NodeID)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	release, z, err := openZFS(log)
	if err != nil {
		return err
	}
	registry := metrics.NewRegistry()
	serverOpts, dial, certs, err := agentTLS(cfg, log, registry)
	if err != nil {
		return err
	}
	registry.BuildInfo(buildInfo(release))
	node := assemble(cfg, z, dial, registry, log)
	rootSpaceMetrics(registry, node.Volumes)
	volumeSpaceMetrics(registry, node.Volumes)
	poolSpaceMetrics(registry, z, strings.SplitN(cfg.RootDataset, "/", 2)[0])
	defer node.Pusher.Close()
	node.Receiver.OpenZFS, node.Agent.OpenZFS = release, release
	if err := checkHealth(ctx, node.Volumes); err != nil {
		return err
	}
	lis, err := listen(cfg)
	if err != nil {
		return err
	}
	if certs != nil {
		csiplugin.WatchTLS(ctx, certs, registry)
		node.Agent.CertificateNotAfter = func() time.Time { return certs.Certificate().NotAfter }
	}
	// Recovery lists every dataset of the node: with a thousand of them
	// under a slow pool it takes long, so it has a deadline of its own.
	recoverCtx, cancelRecover := context.WithTimeout(ctx, recoverTimeout)
	node.Recover(recoverCtx, log)
	cancelRecover()
	node.StartLease()
	var leaseHeld atomic.Bool
	node.Heartbeat.Held = leaseMetrics(registry, &leaseHeld, time.Now)
	health := []csiplugin.HealthCheck{{Name: "zfs", Check: node.Volumes.Health}}
	if len(cfg.Peers) > 0 || cfg.PeersFile != "" {
		health = append(health, leaseCheck(leaseHeld.Load, time.Duration(cfg.Lease)))
	}
	if certs != nil {
		health = append(health, csiplugin.CertificateCheck(func() time.Time { return certs.Certificate().NotAfter }))
	}

	csiSrv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		csiplugin.CallMetrics(registry, "zfs_nomad_csi_call_seconds", "CSI calls this plugin answered, by method and gRPC code, and how long they took."),
		csiplugin.LoggingInterceptor(log.Named("csi"))))
	csispec.RegisterIdentityServer(csiSrv, csiplugin.NewIdentity(node.Volumes.Health))
	csispec.RegisterNodeServer(csiSrv, csinode.New(node.Volumes, mount.System{}, cfg, log.Named("csi")))
	serverOpts = append(serverOpts, protocol.ServerOptions("node "+cfg.NodeID)...)
	agentSrv := grpc.NewServer(append(serverOpts, agent.ServerOptions()...)...)
	node.Register(agentSrv)

	log.Info("serving", "version", version.Version, "csi_endpoint", cfg.CSIEndpoint, "agent_address", lis.agent.Addr().String(),
		"root_dataset", cfg.RootDataset, "max_quota", cfg.MaxQuota.String())
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return csiplugin.Serve(gctx, csiSrv, lis.csi, 10*time.Second) })
	g.Go(func() error { return csiplugin.Serve(gctx, agentSrv, lis.agent, 10*time.Second) })
	g.Go(func() error {
		return csiplugin.ServeMetrics(gctx, lis.metrics, registry, log, map[string]http.Handler{csiplugin.HealthPath: csiplugin.HealthHandler(health...)})
	})
	g.Go(func() error { node.Heartbeat.Run(gctx); return nil })
	err = g.Wait()
	log.Info("stopped")
	return err
}

// agentCallMetrics times the unary calls on the agent port (the
// controller's, the operator's, the peers'), refusals of the policy
// included.
func agentCallMetrics(registry *metrics.Registry) grpc.UnaryServerInterceptor {
	return csiplugin.CallMetrics(registry, "zfs_nomad_agent_call_seconds", "Unary calls on the agent port, by method and gRPC code, and how long they took.")
}

// rootSpaceMetrics exports the root dataset's used and available bytes,
// read at each scrape (a libzfs read of one dataset): a pool filling up
// is what stops creates, pushes and backups alike.
// rootSpace reads the root dataset's space (volume.Manager).
type rootSpace interface {
	RootSpace(ctx context.Context) (used, available uint64, err error)
}

func rootSpaceMetrics(registry *metrics.Registry, volumes rootSpace) {
	const used, available = "zfs_nomad_root_dataset_used_bytes", "zfs_nomad_root_dataset_available_bytes"
	registry.GaugesAtScrape(map[string]string{
		used:      "Bytes the root dataset and everything below it (volumes, replicas, snapshots) use.",
		available: "Bytes left to the root dataset: the pool's free space, bounded by the root's quota.",
	}, func() (map[string]float64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		u, a, err := volumes.RootSpace(ctx)
		if err != nil {
			return nil, err
		}
		return map[string]float64{used: float64(u), available: float64(a)}, nil
	})
}

// leaseMetrics returns what the heartbeat tells after each beat: it
// records in held and in the metrics whether the node holds its lease,
// and when it last did (time() minus that is how long its primaries have
// been read-only).
func leaseMetrics(registry *metrics.Registry, held *atomic.Bool, now func() time.Time) func(bool) {
	gauge := registry.Gauge("zfs_nomad_lease_held", "1 while this node heard from a majority of all its peers, every domain, within the lease, else 0 (its mounted primaries are read-only).")
	last := registry.Gauge("zfs_nomad_lease_held_timestamp_seconds", "When this node last found itself holding its lease (a majority of its peers heard within the lease), at its heartbeat; absent until it first did.")
	return func(isHeld bool) {
		held.Store(isHeld)
		if !isHeld {
			gauge.Set(0)
			return
		}
		gauge.Set(1)
		last.Set(float64(now().UnixMilli()) / 1000)
	}
}

// poolSpaceReader reads a pool's own accounting (libzfs.ZFS).
type poolSpaceReader interface {
	PoolSpace(ctx context.Context, pool string) (zfs.PoolSpace, error)
}

// poolSpaceMetrics exports the pool's size, allocated and free bytes,
// read at each scrape: the root dataset's room is bounded by its quota,
// the pool's is what every dataset on it shares.
func poolSpaceMetrics(registry *metrics.Registry, z poolSpaceReader, pool string) {
	const size, allocated, free = "zfs_nomad_pool_size_bytes", "zfs_nomad_pool_allocated_bytes", "zfs_nomad_pool_free_bytes"
	registry.GaugesAtScrape(map[string]string{
		size:      "The size of the pool holding the root dataset (as zpool list reports it: raw space, before redundancy).",
		allocated: "Bytes allocated in the pool holding the root dataset (raw).",
		free:      "Bytes free in the pool holding the root dataset (raw).",
	}, func() (map[string]float64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s, err := z.PoolSpace(ctx, pool)
		if err != nil {
			return nil, err
		}
		return map[string]float64{size: float64(s.Size), allocated: float64(s.Allocated), free: float64(s.Free)}, nil
	})
}

// volumeSpaceMetrics exports each primary's used bytes and quota, read
// at each scrape (one listing of the root's children): a volume near its
// quota fails its job's writes. Two series per primary on its node, gone
// with the primary (moved, deleted); replicas are left out, their
// primary's series say it.
// volumeLister lists the node's volumes (volume.Manager).
type volumeLister interface {
	List(ctx context.Context) ([]volume.Volume, error)
}

func volumeSpaceMetrics(registry *metrics.Registry, volumes volumeLister) {
	const used, quota = "zfs_nomad_volume_used_bytes", "zfs_nomad_volume_quota_bytes"
	registry.LabelledGaugesAtScrape(map[string]string{
		used:  "Bytes a primary volume on this node refers to (its files, not its snapshots), which its quota bounds.",
		quota: "A primary volume's quota on this node: its capacity.",
	}, []string{"volume_id", "volume_name"}, func() ([]metrics.Sample, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		list, err := volumes.List(ctx)
		if err != nil {
			return nil, err
		}
		samples := make([]metrics.Sample, 0, 2*len(list))
		for _, v := range list {
			labels := []string{v.ID, v.Name}
			samples = append(samples, metrics.Sample{Name: used, Labels: labels, Value: float64(v.Used)},
				metrics.Sample{Name: quota, Labels: labels, Value: float64(v.Capacity)})
		}
		return samples, nil
	})
}

// buildInfo labels zfs_nomad_build_info: this build and the OpenZFS it
// was built for and runs on.
func buildInfo(running string) map[string]string {
	return map[string]string{"version": version.Version, "agent_protocol": strconv.Itoa(protocol.Version),
		"openzfs_built_for": cmp.Or(openzfs.BuiltFor, "unknown"), "openzfs_running": running}
}

// leaseCheck fails while a node with peers holds no lease: its mounted
// primaries are read-only and it stages none, so it cannot serve its
// volumes' jobs (also in the moments after its start, until a majority
// of its peers answered).
func leaseCheck(held func() bool, lease time.Duration) csiplugin.HealthCheck {
	return csiplugin.HealthCheck{Name: "lease", Check: func(context.Context) error {
		if held() {
			return nil
		}
		return fmt.Errorf("no lease: this node has not heard from a majority of its peers within the lease (%s), so its mounted primaries are read-only and it stages no primary; check that the nodes reach each other's agent ports (zfs-controller status)", lease)
	}}
}

// assemble wires the node's parts on the host: libzfs for metadata, the
// zfs command for streams and keys, the system's mounts, TLS to the
// peers and backup targets (dial), the peer list from the configuration.
func assemble(cfg config.Node, z *libzfs.ZFS, dial dialing, registry *metrics.Registry, log hclog.Logger) *assembly.Parts {
	node := assembly.New(assembly.Deps{
		Config: cfg,
		// Replication streams run as zfs processes, holding no libzfs
		// handle; the short reads and holds around them run in process.
		ZFS:        z,
		Dial:       dial.to(dial.nodes),
		DialTarget: dial.to(dial.targets),
		Peers:      peers.Configured(cfg.Peers, cfg.PeersFile),
		LeaseClock: time.Now,
		Host: volume.Host{
			Mounted:      mount.IsMountedZFS,
			MountHolders: func(dataset string) []string { return mount.Holders("/proc", dataset) },
			Roots:        mount.RootPreparer{Dir: rootsDir},
			// The pool's keys: libzfs.ZFS runs them as zfs commands with
			// the passphrase on their standard input (libzfs takes no key
			// material).
			Encryption: z,
		},
		Log: log,
	})
	node.Pusher.Metrics = replication.NewMetrics(registry)
	node.Receiver.Metrics = node.Pusher.Metrics
	return node
}

// checkHealth checks that the root dataset serves within 30 s of the
// start.
func checkHealth(ctx context.Context, volumes interface{ Health(context.Context) error }) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := volumes.Health(ctx); err != nil {
		return fmt.Errorf("cannot serve volumes: %w", err)
	}
	return nil
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

// dialing is how the node dials: its peers' agent ports, verified as
// nodes, and its backup targets, verified as targets.
type dialing struct {
	nodes, targets []grpc.DialOption
}

// to returns a dial with opts, the agent protocol's options added.
func (dialing) to(opts []grpc.DialOption) func(addr string) (*grpc.ClientConn, error) {
	return func(addr string) (*grpc.ClientConn, error) {
		all := append(agent.DialOptions(), protocol.DialOptions()...)
		return grpc.NewClient(addr, append(all, opts...)...)
	}
}

// agentTLS returns the agent port's server options (mutual TLS, every
// call's check of the caller's certificate, and the policy of who may
// call what), the dial options of the node's calls to peers and backup
// targets (mutual TLS and every call's check of the server's
// certificate), and the TLS material they use (nil without TLS), which
// WatchTLS keeps current.
func agentTLS(cfg config.Node, log hclog.Logger, registry *metrics.Registry) ([]grpc.ServerOption, dialing, *tlsconfig.Source, error) {
	logging := csiplugin.LoggingInterceptor(log.Named("agent"))
	calls := agentCallMetrics(registry)
	if cfg.InsecureAgentPort {
		log.Warn("agent port WITHOUT TLS (-insecure-agent-port): anyone who reaches it can read and write volumes; use only on a closed test network")
		plain := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		return []grpc.ServerOption{grpc.ChainUnaryInterceptor(calls, logging)}, dialing{nodes: plain, targets: plain}, nil, nil
	}
	// The node's certificate must name it: peers bind its streams and
	// promises to that name.
	src, err := csiplugin.OpenTLS(cfg.TLS, tlsconfig.Identity{Roles: []string{tlsconfig.RoleNode}, Name: cfg.NodeID}, log.Named("tls"))
	if err != nil {
		return nil, dialing{}, nil, err
	}
	// The certificate check comes first: a revoked caller gets
	// Unauthenticated whatever it calls.
	policy := tlsconfig.AgentPolicy
	return append(src.ServerOptions(),
		grpc.ChainUnaryInterceptor(calls, policy.UnaryInterceptor(), logging),
		grpc.ChainStreamInterceptor(policy.StreamInterceptor()),
	), dialing{nodes: src.DialOptions(), targets: src.BackupDialOptions()}, src, nil
}

// openZFS checks the host's OpenZFS (checkOpenZFS) and opens libzfs,
// reading the driver's user properties; it returns the userland's
// release.
func openZFS(log hclog.Logger) (string, *libzfs.ZFS, error) {
	release, err := checkOpenZFS(log)
	if err != nil {
		return "", nil, err
	}
	z, err := libzfs.New(copyrecord.UserProperties...)
	return release, z, err
}

// checkOpenZFS logs which OpenZFS userland and kernel module this host
// runs and the libzfs this build was compiled against, and refuses to go
// on when they do not fit (package openzfs). It returns the userland's release.
func checkOpenZFS(log hclog.Logger) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := openzfs.Detect(ctx)
	if err != nil {
		return "", err
	}
	log.Info("OpenZFS", "userland", v.Userland, "kernel_module", v.Kernel, "built_for", cmp.Or(openzfs.BuiltFor, "unknown"), "libzfs_binding", libzfs.Binding)
	if v.EncryptedMountDefect() {
		log.Warn("this OpenZFS kernel module may oops when it mounts an encrypted volume, leaving the node's ZFS hung until a reboot (openzfs/zfs#16104, fixed after 2.1): keep encrypted volumes on nodes with OpenZFS 2.2 or later (docs/security.md, \"Encrypted volumes\")",
			"kernel_module", v.Kernel)
	}
	return v.Userland, v.Check(openzfs.BuiltFor)
}
