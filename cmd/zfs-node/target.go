package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/zfs-nomad/zfs-nomad/internal/node/agent"
	"github.com/zfs-nomad/zfs-nomad/internal/node/replication"
	"github.com/zfs-nomad/zfs-nomad/internal/node/retention"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/cmdline"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/csiplugin"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/metrics"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/protocol"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

const targetUsage = `usage: zfs-node target [flags]

Serve as a backup target (docs/backups.md): keep the backups the nodes
push, each volume's under ROOT/<volume-id>, pruned by its retention grid.
It needs a ZFS pool and a certificate of role backup, and no Nomad, CSI
socket or peers; it serves nodes' pushes, and restores the controller
grants, and nothing else.`

// serveTarget runs a backup target until SIGINT or SIGTERM.
func serveTarget(args []string) error {
	cfg, err := config.LoadTarget(targetUsage, args, os.Getenv, cmdline.UsageOutput)
	if err != nil {
		return err
	}
	grid, err := retention.Parse(cfg.DefaultRetention)
	if err != nil {
		return fmt.Errorf("invalid zfs-node target configuration: default_retention: %w", err)
	}
	baseLog, flushLog := csiplugin.NewServerLogger("zfs-node", os.Getenv)
	defer flushLog()
	log := baseLog.With("backup_target", cfg.Name)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	release, z, err := openZFS(log)
	if err != nil {
		return err
	}
	if _, err := z.Property(ctx, cfg.RootDataset, "type"); err != nil {
		return fmt.Errorf("root_dataset %s: %w (create it first: zfs create %s)", cfg.RootDataset, err, cfg.RootDataset)
	}
	// The target's certificate must name it: nodes hold it to the name
	// their backup_targets give it.
	certs, err := csiplugin.OpenTLS(cfg.TLS, tlsconfig.Identity{Roles: []string{tlsconfig.RoleBackup}, Name: cfg.Name}, log.Named("tls"))
	if err != nil {
		return err
	}
	target := replication.NewTargetReceiver(z, cfg.RootDataset, cfg.Name, uint64(cfg.MaxQuota), log.Named("backups"))
	target.Default, target.MaxKept = grid, cfg.MaxKept
	target.SetIdleTimeout(time.Duration(cfg.ReceiveIdleTimeout))
	target.OpenZFS(release)

	registry := metrics.NewRegistry()
	registry.BuildInfo(buildInfo(release))
	target.SetMetrics(replication.NewMetrics(registry))
	policy := tlsconfig.TargetPolicy
	opts := append(certs.ServerOptions(),
		grpc.ChainUnaryInterceptor(agentCallMetrics(registry), policy.UnaryInterceptor(), csiplugin.LoggingInterceptor(log.Named("agent"))),
		grpc.ChainStreamInterceptor(policy.StreamInterceptor()))
	opts = append(opts, protocol.ServerOptions("backup target "+cfg.Name)...)
	srv := grpc.NewServer(append(opts, agent.ServerOptions()...)...)
	pb.RegisterReplicationServer(srv, &agent.ReplicationServer{Receiver: target})
	pb.RegisterBackupsServer(srv, &agent.BackupsServer{Target: target})

	lis, err := net.Listen("tcp", cfg.Address)
	if err != nil {
		return fmt.Errorf("address %s: %w", cfg.Address, err)
	}
	metricsLis, err := csiplugin.ListenMetrics(cfg.MetricsAddress)
	if err != nil {
		return err
	}
	csiplugin.WatchTLS(ctx, certs, registry)
	log.Info("serving backups", "address", lis.Addr().String(), "root_dataset", cfg.RootDataset,
		"default_retention", grid.String(), "max_kept", cfg.MaxKept)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return csiplugin.Serve(gctx, srv, lis, 10*time.Second) })
	// Healthy while its root dataset answers and its certificate is valid.
	health := csiplugin.HealthHandler(
		csiplugin.HealthCheck{Name: "zfs", Check: func(ctx context.Context) error {
			_, err := z.Property(ctx, cfg.RootDataset, "type")
			return err
		}},
		csiplugin.CertificateCheck(func() time.Time { return certs.Certificate().NotAfter }))
	g.Go(func() error {
		return csiplugin.ServeMetrics(gctx, metricsLis, registry, log, map[string]http.Handler{csiplugin.HealthPath: health})
	})
	err = g.Wait()
	log.Info("stopped")
	return err
}
