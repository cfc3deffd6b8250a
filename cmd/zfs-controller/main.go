// Command zfs-controller is the driver's controller plugin: the CSI
// Identity and Controller services. It decides where volumes live and asks
// the node agents to act; data never flows through it. It needs no ZFS and
// is built without cgo.
//
// It is also the operator's command line, with an operator certificate
// (zfs-controller -h lists the commands, zfs-controller COMMAND -h shows
// one's usage and flags). A VOLUME argument is the volume's name, as in
// its Nomad volume file, or its ID (vol-...).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/backupsched"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/csiserver"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/migration"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/nomadapi"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/operator"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/provision"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/scheduler"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/cmdline"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/csiplugin"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/metrics"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/peers"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/protocol"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/version"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/worklease"
)

// command is one of zfs-controller's commands.
type command struct {
	name, args, summary string
	run                 func(c command, args []string) error
}

// usage is the command's usage line and summary, above its flags in -h.
func (c command) usage() string { return cmdline.Usage("zfs-controller", libraryCommand(c)) }

var commands = []command{
	{"serve", "[flags]", "Serve the CSI Identity and Controller services: what Nomad runs (the command when the first argument is a flag)", serve},
	{"backup", "[flags] [-to NODE | -target TARGET] VOLUME", "Push a volume to a peer or a backup target now, with live progress", backup},
	{"backups", "[flags] [-target TARGET] [VOLUME]", "List the backup targets' backups, every volume's or one's (by name or ID, deleted volumes too), with the snapshot IDs a restore names", backups},
	{"restore", "[flags] [-name NAME] [-node NODE] BACKUP", "Restore a backup (its snapshot ID, as backups lists it) into a new volume, under the name it had or another, on the node named or the one placement picks", restore},
	{"delete-backups", "[flags] -target TARGET (-snapshot SNAPSHOT | -all) VOLUME", "Delete one backup of a volume from a backup target, or all of them (by its name or ID, deleted volumes too)", deleteBackups},
	{"status", "[flags] [-json]", "Show every node's volumes, replicas and their lag, running transfers, moves in progress and stale copies set aside", status},
	{"promote", "[flags] [-node NODE] [-force] VOLUME", "Promote a replica of a volume whose primary's node is lost (failover=manual)", promote},
	{"remove-replica", "[flags] -node NODE [-force] VOLUME", "Remove one node's replica of a volume", removeReplica},
	{"retire-node", "[flags] NODE", "Make every node stop counting a node whose plugin was stopped for good, without restarting them (docs/operations.md)", retireNode},
	{"tls", "ca [-days N] DIR | cert -ca DIR -role node|controller|operator|backup [-days N] [-out DIR] NAME | issue -ca DIR [-out DIR] [-nomad-vars] CLIENT...", "Make the agent port's CA, and certificates for nodes, backup targets, the controller and operators; issue makes every client's, the controller's and an operator's in one step", tlsCommand},
	{"tls ca", "[-days N] [-name NAME] DIR", "Make a CA in DIR: ca.pem, which every node, the controller and operators trust, and ca-key.pem, which only this command needs (keep it off the clients)", func(_ command, args []string) error { return tlsCA(args) }},
	{"tls cert", "-ca DIR -role node|controller|operator|backup [-days N] [-out DIR] NAME", "Issue a certificate and key, NAME.pem and NAME-key.pem, from the CA in -ca", func(_ command, args []string) error { return tlsCert(args) }},
	{"tls issue", "-ca DIR [-days N] [-stagger-days N] [-out DIR] [-operator NAME] [-nomad-vars] CLIENT...", "Issue every client's certificate, the controller's and an operator's in one step, and with -nomad-vars put them into the Nomad Variables the jobs read", func(_ command, args []string) error { return tlsIssue(args, os.Getenv) }},
	{"version", "", "Print the version", printVersion},
}

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// printVersion prints the version line; it takes no flags.
func printVersion(c command, args []string) error {
	fs := flag.NewFlagSet("zfs-controller version", flag.ContinueOnError)
	fs.SetOutput(cmdline.UsageOutput)
	fs.Usage = func() { fmt.Fprintln(fs.Output(), c.usage()) }
	rest, err := config.ParseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return fmt.Errorf("%w: version takes no arguments, got %q", config.ErrUsage, rest)
	}
	fmt.Println(versionLine())
	return nil
}

// exitCode reports err and turns it into the exit status: 0 for none or
// -h, 2 for a wrong command line (as flag errors), 1 for a failure, and
// status's verdicts (operator.ExitDegraded and the others).
func exitCode(err error, stderr io.Writer) int {
	var verdict exitStatus
	switch {
	case errors.As(err, &verdict):
		fmt.Fprintln(stderr, "zfs-controller:", verdict.why)
		return verdict.code
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, config.ErrUsage):
		fmt.Fprintln(stderr, "zfs-controller:", err)
		return 2
	default:
		fmt.Fprintln(stderr, "zfs-controller:", err)
		return 1
	}
}

// serve runs the controller plugin until SIGINT or SIGTERM.
func serve(c command, args []string) error {
	cfg, err := config.LoadController(c.usage(), args, os.Getenv, cmdline.UsageOutput)
	if err != nil {
		return err
	}
	log, flushLog := csiplugin.NewServerLogger("zfs-controller", os.Getenv)
	defer flushLog()

	agents := peers.Configured(cfg.Peers, cfg.PeersFile)
	dialOpts, certs, err := agentDialOptions(cfg, []string{tlsconfig.RoleController}, log)
	if err != nil {
		return err
	}
	nodes := cluster.New(agents, time.Duration(cfg.AgentTimeout), log.Named("cluster"), dialOpts...)
	defer nodes.Close()

	lis, err := csiplugin.Listen(cfg.CSIEndpoint)
	if err != nil {
		return err
	}
	registry := metrics.NewRegistry()
	registry.BuildInfo(map[string]string{"version": version.Version, "agent_protocol": strconv.Itoa(protocol.Version)})
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(csiCallMetrics(registry), csiplugin.LoggingInterceptor(log.Named("csi"))))
	csispec.RegisterIdentityServer(srv, csiplugin.NewIdentity(func(ctx context.Context) error { return probe(ctx, nodes) }))
	migrator := migration.New(nodes, log.Named("migration"))
	migrator.Metrics = migration.NewMetrics(registry)
	migrator.MaxCatchUps = cfg.MoveCatchUps
	migrator.PublishAheadWithin = time.Duration(cfg.MovePublishAhead)
	migrator.NoFlush = !cfg.FlushOnUnpublish
	controller := csiserver.New(nodes, migrator, cfg.Placement, log.Named("csi"))
	targets := backupTargets(cfg, certs)
	switch {
	case targets != nil:
		defer targets.Close()
		controller.UseTargets(targets, cfg.BackupsAsSnapshots)
	case len(cfg.BackupTargets) > 0:
		log.Warn("backup_targets ignored: backup targets speak only mutual TLS, and this controller talks to agents without it (-insecure-agent-port); no backup schedule, no restores")
	}
	csispec.RegisterControllerServer(srv, controller)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if certs != nil {
		csiplugin.WatchTLS(ctx, certs, registry)
	}
	metricsLis, err := csiplugin.ListenMetrics(cfg.MetricsAddress)
	if err != nil {
		return err
	}
	// The background work runs in the instance that holds the work lease
	// (docs/architecture.md, "Several controllers").
	holder := worklease.NewHolder(thisInstance(metricsLis), cluster.WorkLeaseAsker(nodes), log.Named("worklease"))
	holder.Changed = workLeaseGauges(registry)
	holderDone := make(chan struct{})
	go func() {
		defer close(holderDone)
		holder.Run(ctx)
	}()
	defer func() { <-holderDone }() // Run releases the lease when ctx ends
	// Deleted snapshots: copies the delete could not reach (a node away,
	// a push under way) go, then the records (docs/replication.md,
	// "Deleted snapshots").
	deletions := provision.New(nodes, migrator, cfg.Placement, log.Named("snapshots"))
	deletionsEvery := time.Duration(cfg.DeletionsEvery)
	go holder.Every(ctx, deletionsEvery, func(ctx context.Context) {
		if err := deletions.FinishDeletions(ctx); err != nil {
			log.Named("snapshots").Warn("finishing the deletion of snapshots deleted while a node was away failed; retrying", "error", err, "retry_in", deletionsEvery)
		}
	})
	// Moves granted ahead whose instance died: the nodes' stages wait
	// for them (docs/migration.md, "Publishing ahead of a move's end").
	go holder.Every(ctx, 5*time.Second, migrator.FinishAwaitedMoves)
	if every := time.Duration(cfg.ScheduleEvery); every > 0 {
		sched := scheduler.New(nodes, cfg.ParallelPushes, log.Named("replication"))
		sched.Metrics = scheduler.NewMetrics(registry)
		sched.Settle = migrator.Settle
		sched.SurplusGrace = time.Duration(cfg.SurplusGrace)
		go holder.EveryWhileHeld(ctx, every, func(ctx context.Context) { sched.Round(ctx) }, sched.Metrics.Clear)
		if targets != nil {
			backups := backupsched.New(nodes, targets, cfg.ParallelPushes, log.Named("backups"))
			backups.Metrics = backupsched.NewMetrics(registry)
			go holder.EveryWhileHeld(ctx, every, func(ctx context.Context) { backups.Round(ctx) }, backups.Metrics.Clear)
		}
	}
	// Healthy when it can do its job: some node agent answers healthy
	// (what the CSI Probe asks), with a certificate that has not expired.
	health := []csiplugin.HealthCheck{{Name: "nodes", Check: func(ctx context.Context) error {
		// Short of the handler's bound: the nodes that answered by then
		// decide, not the one that did not.
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return probe(ctx, nodes)
	}}}
	if certs != nil {
		health = append(health, csiplugin.CertificateCheck(func() time.Time { return certs.Certificate().NotAfter }))
	}
	go func() {
		paths := map[string]http.Handler{migration.MovesPath: migrator.MovesHandler(), csiplugin.HealthPath: csiplugin.HealthHandler(health...)}
		if err := csiplugin.ServeMetrics(ctx, metricsLis, registry, log, paths); err != nil {
			log.Error("metrics endpoint failed", "error", err)
		}
	}()
	log.Info("serving", "version", version.Version, "csi_endpoint", cfg.CSIEndpoint, "peers", cfg.Peers, "peers_file", cfg.PeersFile)
	err = csiplugin.Serve(ctx, srv, lis, 10*time.Second)
	log.Info("stopped")
	return err
}

// backupTargets reaches the configuration's backup targets with the
// party's certificate (certs; nil without TLS: targets have no insecure
// mode), or is nil when there are none.
func backupTargets(cfg config.Controller, certs *tlsconfig.Source) *agentclient.Targets {
	if len(cfg.BackupTargets) == 0 || certs == nil {
		return nil
	}
	return agentclient.NewTargets(cfg.BackupTargets, func(addr string) (*grpc.ClientConn, error) {
		return grpc.NewClient(addr, append(protocol.DialOptions(), certs.BackupDialOptions()...)...)
	})
}

// csiCallMetrics times the CSI calls the CO makes.
func csiCallMetrics(registry *metrics.Registry) grpc.UnaryServerInterceptor {
	return csiplugin.CallMetrics(registry, "zfs_nomad_csi_call_seconds", "CSI calls this plugin answered, by method and gRPC code, and how long they took.")
}

// workLeaseGauges are the metrics of this instance's work lease, for
// the alert on a cluster where no instance runs the background work:
// max(zfs_nomad_work_lease_held) is 1 on a cluster with a holder.
func workLeaseGauges(registry *metrics.Registry) func(bool, time.Time) {
	held := registry.Gauge("zfs_nomad_work_lease_held", "1 while this controller instance holds the work lease (it runs the replication and backup schedules and the pass over deletions), else 0.")
	since := registry.Gauge("zfs_nomad_work_lease_held_since_timestamp_seconds", "When this instance's current holding of the work lease began (Unix seconds); 0 while it holds none.")
	held.Set(0)
	since.Set(0)
	return func(h bool, at time.Time) {
		if !h {
			held.Set(0)
			since.Set(0)
			return
		}
		held.Set(1)
		since.Set(float64(at.Unix()))
	}
}

// thisInstance is how this controller process introduces itself to the
// nodes when it asks for the work lease: a random ID, and where an
// operator finds it (its host, metrics address and Nomad allocation).
func thisInstance(metrics net.Listener) worklease.Instance {
	id := make([]byte, 4)
	_, _ = rand.Read(id) // crypto/rand.Read does not fail (Go 1.24)
	host, _ := os.Hostname()
	in := worklease.Instance{ID: "ctl-" + hex.EncodeToString(id), Host: host, Version: version.Version, Started: time.Now(),
		NomadAlloc: os.Getenv("NOMAD_ALLOC_ID")}
	if metrics != nil {
		in.Address = metrics.Addr().String()
	}
	return in
}

// probe is ready when at least one node agent answers and is healthy.
func probe(ctx context.Context, nodes *cluster.Cluster) error {
	// Who answers and whether it is healthy, without each node's
	// capacity (which reads every volume of it).
	answers, unreachable, err := cluster.Ask(ctx, nodes, func(context.Context, cluster.Agent) (struct{}, error) { return struct{}{}, nil })
	if err != nil {
		return err
	}
	all := make([]cluster.Node, 0, len(answers))
	for _, a := range answers {
		all = append(all, a.Node)
	}
	if len(cluster.Healthy(all)) > 0 {
		return nil
	}
	var reasons []error
	for _, n := range all {
		reasons = append(reasons, fmt.Errorf("node %s: %s", n.Info.NodeID, n.Info.UnhealthyReason))
	}
	for _, u := range unreachable {
		reasons = append(reasons, fmt.Errorf("agent %s: %w", u.Addr, u.Err))
	}
	return fmt.Errorf("no healthy node agent: %w", errors.Join(reasons...))
}

// agentDialOptions are the dial options of calls to node agents (mutual
// TLS, and every call's check of the node's certificate), and the TLS
// material they use (nil without TLS): the controller's certificate, or
// for the operator commands an operator's or the controller's.
func agentDialOptions(cfg config.Controller, roles []string, log hclog.Logger) ([]grpc.DialOption, *tlsconfig.Source, error) {
	if cfg.InsecureAgentPort {
		log.Warn("talking to node agents WITHOUT TLS (-insecure-agent-port): use only on a closed test network")
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, nil, nil
	}
	src, err := csiplugin.OpenTLS(cfg.TLS, tlsconfig.Identity{Roles: roles}, log.Named("tls"))
	if err != nil {
		return nil, nil, err
	}
	return src.DialOptions(), src, nil
}

// connect reads an operator command's configuration (extra adds its own
// flags), checks its arguments (one, which arg names, or none when arg is
// empty), and connects to the node agents. The caller closes the session.
func connect(c command, args []string, arg string, extra func(*flag.FlagSet)) (session, error) {
	cfg, rest, err := config.LoadOperator("zfs-controller "+c.name, c.usage(), args, os.Getenv, cmdline.UsageOutput, extra)
	if err != nil {
		return session{}, err
	}
	var argument string
	switch {
	case arg != "" && len(rest) != 1:
		return session{}, fmt.Errorf("%w: want one %s, got %d arguments (usage: zfs-controller %s %s)", config.ErrUsage, arg, len(rest), c.name, c.args)
	case arg != "":
		argument = rest[0]
	case len(rest) > 0:
		return session{}, fmt.Errorf("%w: %s takes no arguments, got %q", config.ErrUsage, c.name, rest)
	}
	log := csiplugin.NewLogger("zfs-controller", func(k string) string {
		// The command reports what went wrong itself, in a sentence; the
		// log's warnings would repeat it in gRPC's words.
		if k == "ZFS_NOMAD_LOG_LEVEL" && os.Getenv(k) == "" {
			return "error"
		}
		return os.Getenv(k)
	})
	if err := agentsFromNomad(&cfg); err != nil {
		return session{}, err
	}
	// A command lasts seconds: its material is read once.
	dialOpts, certs, err := agentDialOptions(cfg, []string{tlsconfig.RoleOperator, tlsconfig.RoleController}, log)
	if err != nil {
		return session{}, err
	}
	nodes := cluster.New(peers.Configured(cfg.Peers, cfg.PeersFile), time.Duration(cfg.AgentTimeout), log, dialOpts...)
	return session{nodes: nodes, targets: backupTargets(cfg, certs), arg: argument, log: log, cfg: cfg}, nil
}

// agentsFromNomad sets the agents' addresses from Nomad's service
// registry (cfg.NomadService, through NOMAD_ADDR and Nomad's other
// variables) when the configuration names none: after the install guide
// an operator's first command needs no list of addresses.
func agentsFromNomad(cfg *config.Controller) error {
	if len(cfg.Peers) > 0 || cfg.PeersFile != "" {
		return nil
	}
	nomad, err := nomadapi.FromEnv(os.Getenv)
	if err != nil {
		return fmt.Errorf("no peers or peers_file, and Nomad's service %s cannot be asked where the node agents are: %w", cfg.NomadService, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(cfg.AgentTimeout))
	defer cancel()
	addrs, err := nomad.ServiceAddresses(ctx, cfg.NomadService)
	if err != nil {
		return fmt.Errorf("no peers or peers_file, and finding the node agents through Nomad failed: %w (set ZFS_NOMAD_PEERS, or NOMAD_ADDR and NOMAD_TOKEN as for nomad)", err)
	}
	if len(addrs) == 0 {
		return fmt.Errorf("no peers or peers_file, and Nomad's service %s (namespace %s) has no instance: is the node job running? (-nomad-service names another service; ZFS_NOMAD_PEERS lists the agents)", cfg.NomadService, nomad.Namespace())
	}
	cfg.Peers = addrs
	return nil
}

// session is what an operator command works with: the node agents, the
// backup targets (nil: none configured, or no TLS), the argument (if it
// takes one), a logger and the configuration it loaded.
type session struct {
	nodes   *cluster.Cluster
	targets *agentclient.Targets
	arg     string
	log     hclog.Logger
	cfg     config.Controller
}

// Close closes the connections to the agents and targets.
func (s session) Close() {
	s.nodes.Close()
	if s.targets != nil {
		s.targets.Close()
	}
}

// volume resolves the command's VOLUME, a name or an ID, to the volume's
// ID, and says on stderr which volume a name named.
func (s session) volume(ctx context.Context) (string, error) {
	return operator.ResolveVolume(ctx, s.nodes, s.arg, os.Stderr)
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

func backup(c command, args []string) error {
	var opts operator.BackupOptions
	sess, err := connect(c, args, "VOLUME (its name or ID)", func(fs *flag.FlagSet) {
		fs.StringVar(&opts.To, "to", "", "node ID to back up to (default: a healthy node that holds a replica, else the one with most room in the volume's replication domain)")
		fs.StringVar(&opts.Target, "target", "", "backup target to back up to, by the name in the nodes' backup_targets (docs/backups.md), instead of a node")
		fs.DurationVar(&opts.WaitBusy, "wait", 5*time.Minute, "how long to wait for a running push or move of the volume to end before pushing (0: fail at once)")
		fs.DurationVar(&opts.StallTimeout, "stall", cluster.DefaultStallTimeout, "cancel the push once it moved no data for this long: it holds the volume's one push slot, which the schedule and moves need")
	})
	if err != nil {
		return err
	}
	defer sess.Close()
	ctx, stop := signalContext()
	defer stop()
	volumeID, err := sess.volume(ctx)
	if err != nil {
		return err
	}
	return operator.Backup(ctx, sess.nodes, volumeID, opts, os.Stdout)
}

func backups(c command, args []string) error {
	var target string
	targets, rest, err := connectTargets(c, args, func(fs *flag.FlagSet) {
		fs.StringVar(&target, "target", "", "list only this backup target's, by its name in backup_targets (default: every one's)")
	})
	if err != nil {
		return err
	}
	defer targets.Close()
	if len(rest) > 1 {
		return fmt.Errorf("%w: want at most one VOLUME, got %q", config.ErrUsage, rest)
	}
	ctx, stop := signalContext()
	defer stop()
	volume := ""
	if len(rest) == 1 {
		volume = rest[0]
	}
	names := targets.Names()
	if target != "" {
		names = []string{target}
	}
	return operator.ListBackups(ctx, targets, names, volume, os.Stdout)
}

func deleteBackups(c command, args []string) error {
	var target, snapshot string
	var all bool
	targets, rest, err := connectTargets(c, args, func(fs *flag.FlagSet) {
		fs.StringVar(&target, "target", "", "the backup target, by its name in backup_targets")
		fs.StringVar(&snapshot, "snapshot", "", "the backup to delete, by its snapshot's name (zn-..., as zfs-controller backups shows)")
		fs.BoolVar(&all, "all", false, "delete every backup of the volume, in every chain")
	})
	if err != nil {
		return err
	}
	defer targets.Close()
	switch {
	case target == "":
		return fmt.Errorf("%w: -target is required (usage: zfs-controller %s %s)", config.ErrUsage, c.name, c.args)
	case (snapshot == "") == !all:
		return fmt.Errorf("%w: name one backup (-snapshot) or all of the volume's (-all)", config.ErrUsage)
	case len(rest) != 1:
		return fmt.Errorf("%w: want one VOLUME (its name or ID), got %q", config.ErrUsage, rest)
	}
	ctx, stop := signalContext()
	defer stop()
	return operator.DeleteBackups(ctx, targets, target, rest[0], snapshot, os.Stdout)
}

var errNoTargets = fmt.Errorf("%w: no backup targets in the configuration (backup_targets, or -backup-targets name=host:port), or no TLS: targets speak only mutual TLS", config.ErrUsage)

func restore(c command, args []string) error {
	var opts operator.RestoreOptions
	sess, err := connect(c, args, "BACKUP (a backup's snapshot ID, as zfs-controller backups lists them)", func(fs *flag.FlagSet) {
		fs.StringVar(&opts.Name, "name", "", "the new volume's name (default: the name the backed-up volume had, which no volume may have now)")
		fs.StringVar(&opts.Node, "node", "", "node ID to restore onto (default: the one placement picks, as for any new volume)")
	})
	if err != nil {
		return err
	}
	defer sess.Close()
	if sess.targets == nil {
		return errNoTargets
	}
	ctx, stop := signalContext()
	defer stop()
	volumes := provision.New(sess.nodes, migration.New(sess.nodes, sess.log), sess.cfg.Placement, sess.log)
	volumes.UseTargets(sess.targets)
	return operator.Restore(ctx, volumes, sess.targets, sess.arg, opts, os.Stdout)
}

// connectTargets reads a backup command's configuration (extra adds its
// flags) and reaches the backup targets with the operator's certificate;
// it returns the arguments after the flags. The caller closes the
// targets.
func connectTargets(c command, args []string, extra func(*flag.FlagSet)) (*agentclient.Targets, []string, error) {
	cfg, rest, err := config.LoadOperator("zfs-controller "+c.name, c.usage(), args, os.Getenv, cmdline.UsageOutput, extra)
	if err != nil {
		return nil, nil, err
	}
	log := csiplugin.NewLogger("zfs-controller", os.Getenv)
	_, certs, err := agentDialOptions(cfg, []string{tlsconfig.RoleOperator, tlsconfig.RoleController}, log)
	if err != nil {
		return nil, nil, err
	}
	targets := backupTargets(cfg, certs)
	if targets == nil {
		return nil, nil, errNoTargets
	}
	return targets, rest, nil
}

func status(c command, args []string) error {
	var asJSON bool
	var controller string
	sess, err := connect(c, args, "", func(fs *flag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print the report as JSON, for scripts")
		fs.StringVar(&controller, "controller", "", "a controller instance's metrics address, asked for the moves it runs (default: every instance the nodes know, else metrics_address of the configuration)")
	})
	if err != nil {
		return err
	}
	nodes := sess.nodes
	defer sess.Close()
	ctx, stop := signalContext()
	defer stop()
	report, err := operator.Status(ctx, nodes)
	if err != nil {
		return err
	}
	operator.AddMoves(ctx, &report, controller, sess.cfg.MetricsAddress)
	if sess.targets != nil {
		operator.AddBackups(ctx, &report, sess.targets, time.Now())
	}
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(report); err != nil {
			return err
		}
	} else {
		operator.PrintStatus(os.Stdout, report, time.Now())
	}
	if code, why := report.Verdict(time.Now()); code != operator.ExitHealthy {
		return exitStatus{code: code, why: why}
	}
	return nil
}

// exitStatus ends a command that ran with a status other than 0 or 1 (a
// monitoring verdict) and says why.
type exitStatus struct {
	code int
	why  string
}

func (e exitStatus) Error() string { return e.why }

func promote(c command, args []string) error {
	var node string
	var force bool
	sess, err := connect(c, args, "VOLUME (its name or ID)", func(fs *flag.FlagSet) {
		fs.StringVar(&node, "node", "", "node ID whose replica to promote (default: the freshest)")
		fs.BoolVar(&force, "force", false, "promote even when fewer than a majority of the nodes answer: you assert the silent nodes are lost for good, or hold nothing newer")
	})
	if err != nil {
		return err
	}
	defer sess.Close()
	ctx, stop := signalContext()
	defer stop()
	volumeID, err := sess.volume(ctx)
	if err != nil {
		return err
	}
	return operator.Promote(ctx, migration.New(sess.nodes, sess.log), volumeID, node, force, os.Stdout)
}

func retireNode(c command, args []string) error {
	sess, err := connect(c, args, "NODE (the retired node's ID)", nil)
	if err != nil {
		return err
	}
	defer sess.Close()
	ctx, stop := signalContext()
	defer stop()
	return operator.RetireNode(ctx, sess.nodes, sess.arg, os.Stdout)
}

func removeReplica(c command, args []string) error {
	var node string
	var force bool
	sess, err := connect(c, args, "VOLUME (its name or ID)", func(fs *flag.FlagSet) {
		fs.StringVar(&node, "node", "", "node ID whose replica to remove (required)")
		fs.BoolVar(&force, "force", false, "remove it even when no reachable node holds the volume's primary")
	})
	if err != nil {
		return err
	}
	defer sess.Close()
	if node == "" {
		return fmt.Errorf("%w: -node is required (usage: zfs-controller %s %s)", config.ErrUsage, c.name, c.args)
	}
	ctx, stop := signalContext()
	defer stop()
	volumeID, err := sess.volume(ctx)
	if err != nil {
		return err
	}
	return operator.RemoveReplica(ctx, sess.nodes, volumeID, node, force, os.Stdout)
}
