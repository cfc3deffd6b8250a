package config

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// EnvPrefix starts every environment variable the binaries read: the flag
// -max-quota is also ZFS_NOMAD_MAX_QUOTA.
const EnvPrefix = "ZFS_NOMAD_"

// LoadNode reads zfs-node's configuration: defaults, then the JSON file
// named by -config, then the environment, then flags; and validates it.
func LoadNode(args []string, getenv func(string) string, stderr io.Writer) (Node, error) {
	cfg := DefaultNode()
	fs := flag.NewFlagSet("zfs-node serve", flag.ContinueOnError) // serve -h lists these flags
	fs.SetOutput(stderr)
	fs.String("config", "", "JSON config file (see docs/config.md)")
	fs.StringVar(&cfg.NodeID, "node-id", cfg.NodeID, "this node's ID (Nomad: ${node.unique.name})")
	fs.StringVar(&cfg.RootDataset, "root-dataset", cfg.RootDataset, "parent dataset of all volumes, e.g. tank/nomad")
	fs.StringVar(&cfg.QuotaProperty, "quota-property", cfg.QuotaProperty, "quota or refquota")
	fs.Var(&cfg.DefaultQuota, "default-quota", "size of volumes that ask for none, e.g. 1G")
	fs.Var(&cfg.MaxQuota, "max-quota", "largest volume size allowed, e.g. 100G")
	fs.Int64Var(&cfg.MaxVolumes, "max-volumes", cfg.MaxVolumes, "volumes this node accepts (0: no limit)")
	fs.StringVar(&cfg.CSIEndpoint, "csi-endpoint", cfg.CSIEndpoint, "CSI endpoint (env CSI_ENDPOINT too)")
	fs.StringVar(&cfg.AgentAddress, "agent-address", cfg.AgentAddress, "host:port of the node agent service")
	fs.Var((*mapFlag)(&cfg.Topology), "topology", "extra topology segments, k=v,k2=v2")
	fs.StringVar(&cfg.Domain, "domain", cfg.Domain, "replication domain: the nodes migratable volumes move between")
	fs.Var((*propertyFlag)(&cfg.Properties), "allow-property", "a property volumes may set: name=default or name=default:v1|v2 (repeatable)")
	fs.Var((*listFlag)(&cfg.RootDirectory.UIDs), "root-uids", "user IDs and ranges a volume's root directory may be owned by (parameter uid), e.g. 1000-65534")
	fs.Var((*listFlag)(&cfg.RootDirectory.GIDs), "root-gids", "group IDs and ranges a volume's root directory may be owned by (parameter gid)")
	fs.StringVar(&cfg.RootDirectory.ModeMask, "root-mode-mask", cfg.RootDirectory.ModeMask, "octal mode bits a volume's mode parameter may set (default "+DefaultModeMask+")")
	fs.StringVar(&cfg.EncryptionKeyFile, "encryption-key-file", cfg.EncryptionKeyFile, "file holding the passphrase of encrypted volumes whose claims carry none (secret encryption_key); the same on every node")
	fs.Int64Var(&cfg.EncryptionPBKDF2Iterations, "encryption-pbkdf2-iterations", cfg.EncryptionPBKDF2Iterations, "PBKDF2 iterations deriving an encrypted volume's key from its passphrase, set at create (0: OpenZFS's default, 350000; at least 100000)")
	fs.BoolVar(&cfg.RequireOwnerSecret, "require-owner-secret", cfg.RequireOwnerSecret, "refuse to create a volume whose secrets carry no owner_secret (docs/volumes.md)")
	fs.Var((*listFlag)(&cfg.MountFlags), "mount-flags", "mount flags claims may ask for, comma separated")
	fs.Var((*listFlag)(&cfg.MountBaseDirs), "mount-base-dirs", "directories staging and target paths must lie below, comma separated (default: Nomad's, see docs/config.md)")
	fs.IntVar(&cfg.MaxReplicas, "max-replicas", cfg.MaxReplicas, "largest replicas parameter a volume may ask for")
	fs.Var(&cfg.MinReplicationInterval, "min-replication-interval", "shortest replication_interval a volume may ask for")
	fs.Var(&cfg.ReplicationBandwidth, "replication-bandwidth", "bytes per second this node sends to peers, all transfers together (e.g. 50M; 0: no cap)")
	fs.Var((*listFlag)(&cfg.Peers), "peers", "node agent addresses of the cluster, comma separated (leases, see docs/safety.md)")
	fs.StringVar(&cfg.PeersFile, "peers-file", cfg.PeersFile, "file listing node agent addresses, one per line; re-read on change")
	fs.Var((*listFlag)(&cfg.Witnesses), "witnesses", "the witness set, node_id@host:port comma separated, the same on every node: the lease and every majority count these nodes only (docs/safety.md, \"Witnesses\")")
	fs.Var(&cfg.Lease, "lease", "a node that hears from no majority of all its peers (every domain) for this long makes its mounted primaries read-only")
	fs.Var(&cfg.LeaseMargin, "lease-margin", "a failover away from a silent node waits for the lease plus this margin")
	fs.Var(&cfg.ReceiveIdleTimeout, "receive-idle-timeout", "how long a receive waits for the sender's next message before it ends (e.g. 2m)")
	fs.IntVar(&cfg.MaxReplicasPerPeer, "max-replicas-per-peer", cfg.MaxReplicasPerPeer, "replicas one peer's streams may create on this node (0: no bound)")
	fs.IntVar(&cfg.ReplicationSnapshots, "replication-snapshots", cfg.ReplicationSnapshots, "zn- snapshots kept per volume besides the incremental bases")
	fs.Var((*mapFlag)(&cfg.BackupTargets), "backup-targets", "backup targets this node pushes backups to, name=host:port,name2=host:port")
	fs.Var(&cfg.MinBackupInterval, "min-backup-interval", "shortest backup_every a volume may ask for")
	tlsFlags(fs, &cfg.TLS, &cfg.InsecureAgentPort)
	metricsFlag(fs, &cfg.MetricsAddress)
	if err := load(fs, args, getenv, &cfg); err != nil {
		return cfg, err
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("invalid zfs-node configuration:\n%w", err)
	}
	return cfg, nil
}

// LoadTarget reads the configuration of zfs-node target like LoadNode.
// usage heads what -h prints, above the flags.
func LoadTarget(usage string, args []string, getenv func(string) string, stderr io.Writer) (Target, error) {
	cfg := DefaultTarget()
	fs := newFlagSet("zfs-node target", usage, stderr)
	fs.StringVar(&cfg.Name, "name", cfg.Name, "this target's name: its certificate's common name, and the name nodes know it by in backup_targets")
	fs.StringVar(&cfg.RootDataset, "root-dataset", cfg.RootDataset, "parent dataset of every volume's backups, e.g. backup/nomad")
	fs.StringVar(&cfg.Address, "address", cfg.Address, "host:port nodes push backups to")
	fs.Var(&cfg.MaxQuota, "max-quota", "the largest volume whose backups this target takes: it bounds every stream (0: no bound)")
	fs.Var(&cfg.ReceiveIdleTimeout, "receive-idle-timeout", "how long a receive waits for the sender's next message before it ends (e.g. 2m)")
	fs.StringVar(&cfg.DefaultRetention, "default-retention", cfg.DefaultRetention, "retention grid of volumes whose backup_retention names none, or one beyond -max-kept")
	fs.IntVar(&cfg.MaxKept, "max-kept", cfg.MaxKept, "the most backups a volume's own grid may keep (the sum of its counts)")
	tlsFlags(fs, &cfg.TLS, nil)
	metricsFlag(fs, &cfg.MetricsAddress)
	if err := load(fs, args, getenv, &cfg); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("%w: unexpected argument %q (flags only)", ErrUsage, fs.Arg(0))
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("invalid zfs-node target configuration:\n%w", err)
	}
	return cfg, nil
}

// LoadController reads the configuration of zfs-controller serve like
// LoadNode. usage heads what -h prints, above the flags.
func LoadController(usage string, args []string, getenv func(string) string, stderr io.Writer) (Controller, error) {
	cfg := DefaultController()
	fs := newFlagSet("zfs-controller serve", usage, stderr)
	fs.StringVar(&cfg.CSIEndpoint, "csi-endpoint", cfg.CSIEndpoint, "CSI endpoint (env CSI_ENDPOINT too)")
	agentFlags(fs, &cfg)
	fs.StringVar(&cfg.Placement, "placement", cfg.Placement, "most-free or fewest-volumes")
	fs.Var(&cfg.ScheduleEvery, "schedule-every", "how often the replication schedule runs (0: off)")
	fs.Var(&cfg.DeletionsEvery, "deletions-every", "how often the copies of deleted snapshots a node away at the delete still holds are deleted")
	fs.IntVar(&cfg.ParallelPushes, "parallel-pushes", cfg.ParallelPushes, "transfers the schedule runs at once")
	fs.IntVar(&cfg.MoveCatchUps, "move-catch-ups", cfg.MoveCatchUps, "catch-ups (bulk pushes of moves to targets that are not fresh) running in the background per source node; moves in their final step are not counted")
	fs.Var(&cfg.MovePublishAhead, "move-publish-ahead", "grant a publish whose volume's move to the node ends within this, the node's stage waiting for the move (0: off)")
	fs.BoolVar(&cfg.FlushOnUnpublish, "flush-on-unpublish", cfg.FlushOnUnpublish, "push a volume unpublished from its primary's node to its replicas at once, rather than when the schedule says (docs/migration.md, \"Flush at unpublish\")")
	fs.Var(&cfg.SurplusGrace, "surplus-grace", "how long a copy a move demoted stays at least, surplus or not")
	fs.BoolVar(&cfg.BackupsAsSnapshots, "backups-as-snapshots", cfg.BackupsAsSnapshots, "list the backup targets' backups as CSI snapshots, which any job submitter may then restore (nomad volume create's snapshot_id)")
	metricsFlag(fs, &cfg.MetricsAddress)
	if err := load(fs, args, getenv, &cfg); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("%w: unexpected argument %q (flags only; zfs-controller -h lists the commands)", ErrUsage, fs.Arg(0))
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("invalid zfs-controller configuration:\n%w", err)
	}
	return cfg, nil
}

// LoadOperator reads what an operator command (name, e.g. "zfs-controller
// backup") needs: where the node agents are and the operator's
// certificate, from the same file and environment as the controller, and
// the flags it registers with extra. It returns the arguments after the
// flags.
func LoadOperator(name, usage string, args []string, getenv func(string) string, stderr io.Writer, extra func(*flag.FlagSet)) (Controller, []string, error) {
	cfg := DefaultController()
	fs := newFlagSet(name, usage, stderr)
	agentFlags(fs, &cfg)
	fs.StringVar(&cfg.NomadService, "nomad-service", cfg.NomadService, "Nomad service the node agents register; without peers or peers-file the agents are read from it through Nomad's API (NOMAD_ADDR, NOMAD_TOKEN, NOMAD_NAMESPACE, NOMAD_CACERT, ...)")
	if extra != nil {
		extra(fs)
	}
	if err := load(fs, args, getenv, &cfg); err != nil {
		return cfg, nil, err
	}
	rest, err := interspersed(fs)
	if err != nil {
		return cfg, nil, err
	}
	if err := cfg.validateOperator(); err != nil {
		return cfg, nil, fmt.Errorf("invalid configuration:\n%w", err)
	}
	return cfg, rest, nil
}

// ParseArgs parses a command's flags wherever they stand among its
// arguments, as Nomad's commands take them, and returns the arguments
// ("--" ends the flags). Errors are ErrUsage, and -h prints the usage.
func ParseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	return interspersed(fs)
}

// interspersed parses the flags that follow the first argument fs
// stopped at, as Nomad's commands take them (promote web-data -force),
// and returns the arguments; "--" ends the flags. Without it a flag
// after an argument would be taken for an argument, or ignored.
func interspersed(fs *flag.FlagSet) ([]string, error) {
	var args []string
	for rest := fs.Args(); len(rest) > 0; rest = fs.Args() {
		if rest[0] == "--" {
			return append(args, rest[1:]...), nil
		}
		args = append(args, rest[0])
		if err := parseFlags(fs, rest[1:]); err != nil {
			return nil, err
		}
	}
	return args, nil
}

// ErrUsage marks a command line that names no command or misses an
// argument: the binaries exit with status 2 on it, as flag errors do.
var ErrUsage = errors.New("usage")

// newFlagSet returns a flag set whose -h prints usage, then the flags.
func newFlagSet(name, usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "%s\n\nFlags:\n", usage)
		fs.PrintDefaults()
	}
	fs.String("config", "", "JSON config file (see docs/config.md)")
	return fs
}

// agentFlags registers what reaching the node agents takes.
func agentFlags(fs *flag.FlagSet, cfg *Controller) {
	fs.Var((*listFlag)(&cfg.Peers), "peers", "node agent addresses, host:port,host:port")
	fs.StringVar(&cfg.PeersFile, "peers-file", cfg.PeersFile, "file listing node agent addresses, one per line; re-read on change")
	fs.Var(&cfg.AgentTimeout, "agent-timeout", "bound on each call to a node agent")
	fs.Var((*mapFlag)(&cfg.BackupTargets), "backup-targets", "backup targets whose backups are listed and restored, name=host:port,name2=host:port (the nodes' backup_targets)")
	tlsFlags(fs, &cfg.TLS, &cfg.InsecureAgentPort)
}

func metricsFlag(fs *flag.FlagSet, addr *string) {
	fs.StringVar(addr, "metrics-address", *addr, "serve Prometheus metrics at http://ADDRESS/metrics (empty: off)")
}

func tlsFlags(fs *flag.FlagSet, t *TLSFiles, insecure *bool) {
	fs.StringVar(&t.CA, "tls-ca", t.CA, "PEM file of the operator's CA (agent port mutual TLS)")
	fs.StringVar(&t.Cert, "tls-cert", t.Cert, "PEM certificate of this party; its first OU is its role")
	fs.StringVar(&t.Key, "tls-key", t.Key, "PEM key of the certificate")
	fs.Var(&t.ExpiryWarning, "tls-expiry-warning", "warn in the log from this long before the certificate expires (0: never); the files are reloaded when they change")
	if insecure != nil {
		fs.BoolVar(insecure, "insecure-agent-port", *insecure, "no TLS on the agent port: closed test networks only")
	}
}

// load applies the file, the environment and the flags, in that order, to
// cfg, which fs's flags are bound to.
func load(fs *flag.FlagSet, args []string, getenv func(string) string, cfg any) error {
	path := configPath(args, getenv)
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("reading config file: %w", err)
		}
		dec := json.NewDecoder(strings.NewReader(string(data)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(cfg); err != nil {
			return fmt.Errorf("config file %s, %w", path, explainJSON(data, dec.InputOffset(), cfg, err))
		}
	}
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == "config" {
			return
		}
		v := getenv(EnvPrefix + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_")))
		if v == "" && f.Name == "csi-endpoint" {
			v = getenv("CSI_ENDPOINT") // what Nomad sets for plugins
		}
		if v != "" && envErr == nil {
			if err := f.Value.Set(v); err != nil {
				envErr = fmt.Errorf("environment %s%s: %w", EnvPrefix, strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_")), err)
			}
		}
	})
	if envErr != nil {
		return envErr
	}
	return parseFlags(fs, args)
}

// parseFlags parses args with fs. -h prints fs's usage and returns
// flag.ErrHelp; a wrong flag returns ErrUsage with what was wrong, and the
// caller prints it once (the flag package would print it with the whole
// usage above).
func parseFlags(fs *flag.FlagSet, args []string) error {
	out := fs.Output()
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(out)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.Usage()
		return err
	case err != nil:
		return fmt.Errorf("%w: %w (%s -h lists its flags)", ErrUsage, err, fs.Name())
	}
	return nil
}

func configPath(args []string, getenv func(string) string) string {
	path := getenv(EnvPrefix + "CONFIG")
	for i, a := range args {
		a = strings.TrimLeft(a, "-")
		if v, ok := strings.CutPrefix(a, "config="); ok {
			path = v
		} else if a == "config" && i+1 < len(args) {
			path = args[i+1]
		}
	}
	return path
}

type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error {
	*l = nil
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*l = append(*l, v)
		}
	}
	return nil
}

type mapFlag map[string]string

func (m *mapFlag) String() string {
	var parts []string
	for k, v := range *m {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func (m *mapFlag) Set(s string) error {
	*m = map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return fmt.Errorf("%q is not key=value", kv)
		}
		(*m)[k] = v
	}
	return nil
}

type propertyFlag map[string]PropertyRule

func (p *propertyFlag) String() string { return fmt.Sprint(map[string]PropertyRule(*p)) }

// Set reads name=default or name=default:v1|v2; each use adds one property.
func (p *propertyFlag) Set(s string) error {
	name, rest, ok := strings.Cut(s, "=")
	if !ok {
		return fmt.Errorf("%q: want name=default or name=default:v1|v2", s)
	}
	def, allowed, _ := strings.Cut(rest, ":")
	rule := PropertyRule{Default: def}
	if allowed != "" {
		rule.Allowed = strings.Split(allowed, "|")
	}
	if *p == nil {
		*p = map[string]PropertyRule{}
	}
	(*p)[name] = rule
	return nil
}
