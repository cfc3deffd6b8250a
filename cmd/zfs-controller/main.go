// Command zfs-controller is the driver's controller plugin: the CSI
// Identity and Controller services. It decides where volumes live and asks
// the node agents to act; data never flows through it. It needs no ZFS and
// is built without cgo.
//
// It is also the operator's command line, with an operator certificate:
//
//	zfs-controller backup [flags] [-to NODE] VOLUME_ID   push a volume to a peer now, with progress
//	zfs-controller status [flags]                        volumes, replicas, lag, running transfers
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/zfs-nomad/zfs-nomad/internal/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/config"
	"github.com/zfs-nomad/zfs-nomad/internal/csi"
	"github.com/zfs-nomad/zfs-nomad/internal/metrics"
	"github.com/zfs-nomad/zfs-nomad/internal/migration"
	"github.com/zfs-nomad/zfs-nomad/internal/operator"
	"github.com/zfs-nomad/zfs-nomad/internal/scheduler"
	"github.com/zfs-nomad/zfs-nomad/internal/tlsconfig"
	"github.com/zfs-nomad/zfs-nomad/internal/version"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "zfs-controller:", err)
		}
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 1 && (args[0] == "-version" || args[0] == "--version") {
		fmt.Println("zfs-controller", version.Version)
		return nil
	}
	if len(args) > 0 && (args[0] == "backup" || args[0] == "status" || args[0] == "promote" || args[0] == "remove-replica") {
		return command(args[0], args[1:])
	}
	cfg, err := config.LoadController(args, os.Getenv, os.Stderr)
	if err != nil {
		return err
	}
	log := csi.NewLogger("zfs-controller", os.Getenv)

	peers := peerSource(cfg)
	creds, err := agentCredentials(cfg, log)
	if err != nil {
		return err
	}
	nodes := cluster.New(peers, time.Duration(cfg.AgentTimeout), log.Named("cluster"), grpc.WithTransportCredentials(creds))
	defer nodes.Close()

	lis, err := csi.Listen(cfg.CSIEndpoint)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(csi.LoggingInterceptor(log.Named("csi"))))
	csispec.RegisterIdentityServer(srv, csi.NewIdentity(func(ctx context.Context) error { return probe(ctx, nodes) }))
	registry := metrics.NewRegistry()
	migrator := migration.New(nodes, log.Named("migration"))
	migrator.Metrics = migration.NewMetrics(registry)
	csispec.RegisterControllerServer(srv, csi.NewController(nodes, migrator, cfg.Placement, log.Named("csi")))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if every := time.Duration(cfg.ScheduleEvery); every > 0 {
		sched := scheduler.New(nodes, cfg.ParallelPushes, log.Named("replication"))
		sched.Metrics = scheduler.NewMetrics(registry)
		sched.Settle = migrator.Settle
		go sched.Run(ctx, every)
	}
	metricsLis, err := csi.ListenMetrics(cfg.MetricsAddress)
	if err != nil {
		return err
	}
	go func() {
		if err := csi.ServeMetrics(ctx, metricsLis, registry, log); err != nil {
			log.Error("metrics endpoint failed", "error", err)
		}
	}()
	log.Info("serving", "version", version.Version, "csi_endpoint", cfg.CSIEndpoint, "peers", cfg.Peers, "peers_file", cfg.PeersFile)
	err = csi.Serve(ctx, srv, lis, 10*time.Second)
	log.Info("stopped")
	return err
}

// probe is ready when at least one node agent answers and is healthy.
func probe(ctx context.Context, nodes *cluster.Cluster) error {
	all, unreachable, err := nodes.Nodes(ctx)
	if err != nil {
		return err
	}
	if len(cluster.Healthy(all)) > 0 {
		return nil
	}
	var reasons []error
	for _, n := range all {
		reasons = append(reasons, fmt.Errorf("node %s: %s", n.Info.GetNodeId(), n.Info.GetUnhealthyReason()))
	}
	for _, u := range unreachable {
		reasons = append(reasons, fmt.Errorf("agent %s: %w", u.Addr, u.Err))
	}
	return fmt.Errorf("no healthy node agent: %w", errors.Join(reasons...))
}

// agentCredentials are the controller's mutual TLS credentials for the
// agent ports.
func agentCredentials(cfg config.Controller, log hclog.Logger) (credentials.TransportCredentials, error) {
	if cfg.InsecureAgentPort {
		log.Warn("talking to node agents WITHOUT TLS (-insecure-agent-port): use only on a closed test network")
		return insecure.NewCredentials(), nil
	}
	m, err := tlsconfig.Load(tlsconfig.Files(cfg.TLS))
	if err != nil {
		return nil, err
	}
	return m.ClientCredentials(), nil
}

// command runs an operator command against the node agents.
func command(name string, args []string) error {
	var to string
	var force bool
	cfg, rest, err := config.LoadControllerCommand("zfs-controller "+name, args, os.Getenv, os.Stderr, func(fs *flag.FlagSet) {
		switch name {
		case "backup":
			fs.StringVar(&to, "to", "", "node ID to back up to (default: the healthy node with most room, preferring one that holds a replica)")
		case "promote":
			fs.StringVar(&to, "node", "", "node ID whose replica to promote (default: the freshest)")
			fs.BoolVar(&force, "force", false, "promote even when fewer than a majority of the nodes answer: you assert the silent nodes are lost for good, or hold nothing newer")
		case "remove-replica":
			fs.StringVar(&to, "node", "", "node ID whose replica to remove (required)")
			fs.BoolVar(&force, "force", false, "remove it even when no reachable node holds the volume's primary")
		}
	})
	if err != nil {
		return err
	}
	log := csi.NewLogger("zfs-controller", func(k string) string {
		if k == "ZFS_NOMAD_LOG_LEVEL" && os.Getenv(k) == "" {
			return "warn"
		}
		return os.Getenv(k)
	})
	creds, err := agentCredentials(cfg, log)
	if err != nil {
		return err
	}
	peers := peerSource(cfg)
	nodes := cluster.New(peers, time.Duration(cfg.AgentTimeout), log, grpc.WithTransportCredentials(creds))
	defer nodes.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	switch name {
	case "backup":
		if len(rest) != 1 {
			return errors.New("usage: zfs-controller backup [flags] [-to NODE] VOLUME_ID")
		}
		return operator.Backup(ctx, nodes, rest[0], to, os.Stdout)
	case "promote":
		if len(rest) != 1 {
			return errors.New("usage: zfs-controller promote [flags] [-node NODE] [-force] VOLUME_ID")
		}
		return operator.Promote(ctx, migration.New(nodes, log), rest[0], to, force, os.Stdout)
	case "remove-replica":
		if len(rest) != 1 || to == "" {
			return errors.New("usage: zfs-controller remove-replica [flags] -node NODE [-force] VOLUME_ID")
		}
		return operator.RemoveReplica(ctx, nodes, rest[0], to, force, os.Stdout)
	default:
		return operator.Status(ctx, nodes, os.Stdout, time.Now())
	}
}

// peerSource says where the node agents are: the peers file when one is
// configured, else the static list.
func peerSource(cfg config.Controller) cluster.PeerSource {
	if cfg.PeersFile != "" {
		return &cluster.PeersFile{Path: cfg.PeersFile}
	}
	return cluster.StaticPeers(cfg.Peers)
}
