// Package config holds the operator's configuration of zfs-node and
// zfs-controller: how it is read (file, environment, flags, in rising
// precedence) and how it is validated before anything starts.
//
// The operator's config is the most powerful of the three places settings
// come from: it bounds what volume parameters (set by the job submitter at
// create) and mount flags (set per claim) may ask for. See docs/config.md.
package config

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/pathcheck"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/witnesses"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/zfsname"
)

// Node is the configuration of one zfs-node.
type Node struct {
	// NodeID names this node to the CO and to the controller. Required.
	NodeID string `json:"node_id"`
	// RootDataset is the parent of every volume on this node, e.g.
	// "tank/nomad". It must exist. Volumes never live outside it.
	RootDataset string `json:"root_dataset"`
	// Topology holds extra topology segments of this node (e.g. rack,
	// datacenter); the segments TopologyNodeKey=NodeID and
	// TopologyDomainKey=Domain are always added.
	Topology map[string]string `json:"topology"`
	// Domain is the replication domain: the nodes a migratable volume may
	// move between and keep replicas on (docs/migration.md).
	Domain string `json:"domain"`
	// QuotaProperty is "refquota" (default: snapshots do not eat the
	// volume's space) or "quota" (snapshots count against it).
	QuotaProperty string `json:"quota_property"`
	// DefaultQuota is the size of a volume whose request names none.
	DefaultQuota ByteSize `json:"default_quota"`
	// MaxQuota is the largest quota a volume may have. Required.
	MaxQuota ByteSize `json:"max_quota"`
	// Properties are the ZFS properties volumes may set, with defaults.
	Properties map[string]PropertyRule `json:"properties"`
	// EncryptionKeyFile names a file holding the passphrase of encrypted
	// volumes whose claims carry none in their secrets (docs/security.md,
	// "Encrypted volumes"); "" (the default): the claim must carry it.
	// The file must be the same on every node a volume may move to.
	EncryptionKeyFile string `json:"encryption_key_file"`
	// EncryptionPBKDF2Iterations is how many PBKDF2 iterations OpenZFS
	// spends deriving an encrypted volume's key from its passphrase (its
	// pbkdf2iters property), set when the volume is created: each create
	// and stage derives the key once, and a stolen pool costs an attacker
	// that many per guess. 0 (the default) leaves OpenZFS's own (350,000);
	// OpenZFS refuses fewer than MinPBKDF2Iterations.
	EncryptionPBKDF2Iterations int64 `json:"encryption_pbkdf2_iterations"`
	// RootDirectory bounds the owner and mode volumes may give their root
	// directory.
	RootDirectory RootDirectory `json:"root_directory"`
	// RequireOwnerSecret refuses to create a volume whose secrets carry
	// no owner secret (contract.SecretOwner).
	RequireOwnerSecret bool `json:"require_owner_secret"`
	// MountFlags are the mount flags a claim may ask for.
	MountFlags []string `json:"mount_flags"`
	// MountBaseDirs are the directories staging and target paths must lie
	// below (package pathcheck). Empty: the directory Nomad's CSI endpoint
	// points into plus pathcheck.DefaultBases.
	MountBaseDirs []string `json:"mount_base_dirs"`
	// MaxVolumes is reported to the CO in NodeGetInfo; 0 means no limit.
	MaxVolumes int64 `json:"max_volumes"`
	// MaxReplicas bounds a volume's "replicas" parameter.
	MaxReplicas int `json:"max_replicas"`
	// MinReplicationInterval bounds a volume's "replication_interval".
	MinReplicationInterval Duration `json:"min_replication_interval"`
	// ReplicationSnapshots is how many zn- snapshots each side keeps besides
	// the held incremental bases.
	ReplicationSnapshots int `json:"replication_snapshots"`
	// Peers lists the node agents of the cluster (host:port, this node's
	// own may be among them), PeersFile a file listing them, re-read when
	// it changes (it wins over Peers). They must list every node agent of
	// the cluster, of every domain, as the controller's do. A node pings
	// them every Lease/4; one that hears from no majority of them for
	// Lease makes its mounted primaries read-only (docs/safety.md,
	// "Leases", "Why the lease and failover majorities intersect").
	// Without peers the node keeps no lease: it never does, and it
	// refuses to grant an automatic failover away from a silent node,
	// having no way to know that node stopped writing; only the
	// operator's zfs-controller promote fails a volume over then.
	Peers     []string `json:"peers"`
	PeersFile string   `json:"peers_file"`
	// Witnesses, when set, is the witness set (node_id@host:port each, an
	// odd number from 3 to 9, the same on every node): the lease and every
	// majority of a generation count the witnesses instead of every node,
	// and the node pings only them (docs/safety.md, "Witnesses"). Peers
	// are still read: they are the addresses the controller's nodes are
	// reached at, and the node asks them nothing for its lease.
	Witnesses []string `json:"witnesses"`
	Lease     Duration `json:"lease"`
	// LeaseMargin is added to Lease before this node grants a failover
	// away from a silent node: the ping and beat intervals and the time
	// the self-fence takes (MinLeaseMargin).
	LeaseMargin Duration `json:"lease_margin"`
	// ReceiveIdleTimeout ends a receive whose sender sent nothing for that
	// long: a peer that stalls must not hold a zfs receive and the
	// volume's receive lock for good.
	ReceiveIdleTimeout Duration `json:"receive_idle_timeout"`
	// MaxReplicasPerPeer bounds the replicas one peer's streams may create
	// on this node (0: no bound): a holder of a node certificate could
	// otherwise create replicas of arbitrary volume IDs until the pool is
	// full.
	MaxReplicasPerPeer int `json:"max_replicas_per_peer"`
	// ReplicationBandwidth caps the bytes per second this node sends to
	// peers, all transfers together; 0 means no cap.
	ReplicationBandwidth ByteSize `json:"replication_bandwidth"`
	// BackupTargets are the backup targets this node pushes backups to
	// (docs/backups.md), by name (each target's certificate names it) to
	// host:port; a push goes only to a target named here. The same on
	// every node a volume may move to.
	BackupTargets map[string]string `json:"backup_targets"`
	// MinBackupInterval bounds a volume's backup_every.
	MinBackupInterval Duration `json:"min_backup_interval"`
	// CSIEndpoint is where the CSI Identity and Node services listen
	// (unix:///path or tcp://host:port). Nomad sets CSI_ENDPOINT.
	CSIEndpoint string `json:"csi_endpoint"`
	// AgentAddress is the host:port of the node agent service the controller
	// calls and peers replicate over.
	AgentAddress string `json:"agent_address"`
	// TLS is the mutual TLS material of the agent port (required).
	TLS TLSFiles `json:"tls"`
	// InsecureAgentPort serves the agent port without TLS: for a closed
	// test network only.
	InsecureAgentPort bool `json:"insecure_agent_port"`
	// MetricsAddress serves Prometheus metrics at http://ADDRESS/metrics
	// ("" turns it off).
	MetricsAddress string `json:"metrics_address"`
}

// TLSFiles names PEM files: the operator's CA bundle, this party's
// certificate (its role in the first OU) and key. See docs/security.md.
type TLSFiles struct {
	CA   string `json:"ca"`
	Cert string `json:"cert"`
	Key  string `json:"key"`
	// ExpiryWarning is how long before the certificate's expiry the log
	// warns that it expires (0: never). The files are reloaded when they
	// change, so a renewal needs no restart.
	ExpiryWarning Duration `json:"expiry_warning"`
}

// DefaultExpiryWarning is TLSFiles.ExpiryWarning's default.
const DefaultExpiryWarning = Duration(30 * 24 * time.Hour)

func (t TLSFiles) validate(insecure bool) error {
	if t.ExpiryWarning < 0 {
		return fmt.Errorf("tls.expiry_warning %s: must not be negative", time.Duration(t.ExpiryWarning))
	}
	if insecure {
		return nil
	}
	if t.CA == "" || t.Cert == "" || t.Key == "" {
		return errors.New("tls: ca, cert and key are required: the agent port speaks only mutual TLS (see docs/security.md)")
	}
	return nil
}

// PropertyRule is the operator's rule for one ZFS property.
type PropertyRule struct {
	// Default is set on every new volume unless its parameters say otherwise;
	// "" leaves the property inherited from the root dataset.
	Default string `json:"default"`
	// Allowed lists the values a volume may ask for; empty means any value
	// ZFS accepts for the property.
	Allowed []string `json:"allowed"`
}

// TopologyNodeKey is the topology segment that names a node.
const TopologyNodeKey = "zfs-nomad.io/node"

// TopologyDomainKey is the topology segment that names a node's
// replication domain; migratable volumes are accessible from all of it.
const TopologyDomainKey = "zfs-nomad.io/domain"

// DefaultDomain is the replication domain of a node that names none.
const DefaultDomain = "default"

// SettableProperties are the ZFS properties an operator may let volumes set.
// Properties that would let a volume escape its place (mountpoint, canmount,
// zoned) or change its size behind the quota logic (quota, reservation)
// are deliberately absent, and so are the key properties (keyformat,
// keylocation): the driver sets those of an encrypted volume itself.
var SettableProperties = map[string]bool{
	"atime": true, "relatime": true, "compression": true, "recordsize": true,
	"checksum": true, "dedup": true, "copies": true, "sync": true, "logbias": true,
	"primarycache": true, "secondarycache": true, "xattr": true, "dnodesize": true,
	"acltype": true, "aclinherit": true, "snapdir": true, "redundant_metadata": true,
	"special_small_blocks": true, "exec": true, "setuid": true, "devices": true,
	"normalization": true, "casesensitivity": true, "utf8only": true,
	"encryption": true,
}

// MinPBKDF2Iterations is the fewest key derivation iterations OpenZFS
// accepts for a passphrase (its MIN_PBKDF2_ITERATIONS).
const MinPBKDF2Iterations = 100_000

// EncryptionValues are the values of the encryption property: off, or a
// cipher ("on" is OpenZFS's default cipher).
var EncryptionValues = []string{"off", "on", "aes-128-ccm", "aes-192-ccm", "aes-256-ccm", "aes-128-gcm", "aes-192-gcm", "aes-256-gcm"}

// AllowedMountFlags are the flags a claim may ask for when the operator
// allows them; anything else is refused.
var AllowedMountFlags = map[string]bool{
	"ro": true, "rw": true, "noatime": true, "relatime": true, "strictatime": true,
	"nodiratime": true, "nodev": true, "nosuid": true, "noexec": true, "sync": true, "dirsync": true,
}

// DefaultNode returns the defaults a config file or flags override.
func DefaultNode() Node {
	return Node{
		QuotaProperty:          "refquota",
		DefaultQuota:           1 << 30,
		Properties:             map[string]PropertyRule{},
		MountFlags:             []string{"ro", "noatime", "relatime", "nodev", "nosuid", "noexec"},
		CSIEndpoint:            "unix:///run/zfs-nomad/csi.sock",
		AgentAddress:           ":7670",
		MaxReplicas:            2,
		Domain:                 DefaultDomain,
		MinReplicationInterval: Duration(time.Minute),
		MinBackupInterval:      Duration(time.Hour),
		ReplicationSnapshots:   3,
		ReceiveIdleTimeout:     Duration(2 * time.Minute),
		MaxReplicasPerPeer:     2000,
		Lease:                  Duration(30 * time.Second),
		LeaseMargin:            Duration(MinLeaseMargin(30 * time.Second)),
		TLS:                    TLSFiles{ExpiryWarning: DefaultExpiryWarning},
	}
}

// FenceAllowance is how long a node that lost its lease may take to make
// all its mounted primaries read-only: it fences them all at once, each
// waiting for its copy's lock (copyLockWait at most) and then switching
// the dataset to readonly=on (fenceSwitch). The switch remounts the
// filesystem, which flushes its dirty data: fenceSwitch is an allowance
// for that, not a bound the kernel gives.
const FenceAllowance = copyLockWait + fenceSwitch

const fenceSwitch = 5 * time.Second

// copyLockWait is copylock.DefaultWait, the longest a change of a copy
// waits for the copy's lock. It is written out here because config links
// no node code (the controller loads it too); TestCopyLockWait keeps the
// two equal.
const copyLockWait = 10 * time.Second

// MinLeaseMargin is the smallest lease_margin M that is safe with lease
// L (docs/safety.md, "Why the margin covers the self-fence"). A peer that
// attests a node silent for L+M may have recorded it up to one ping
// interval (L/4, the ping's timeout) before the node counted that peer's
// answer; the node notices its lease ran out at most one beat interval
// (L/4) after it did; then it fences within FenceAllowance:
//
//	M >= L/4 + L/4 + FenceAllowance
func MinLeaseMargin(lease time.Duration) time.Duration {
	return lease/4 + lease/4 + FenceAllowance
}

// Validate checks the config and explains every problem at once.
func (c *Node) Validate() error {
	return errors.Join(slices.Concat(c.validateStorage(), c.validateProperties(), c.validateMounts(),
		c.validateReplication(), c.validateLease(), c.validateAgent())...)
}

// validateStorage checks who the node is and where its volumes live, and
// how big they may be.
func (c *Node) validateStorage() []error {
	var errs []error
	if !contract.IsNodeID(c.NodeID) {
		errs = append(errs, fmt.Errorf("node_id %q: required; letters, digits, _ . - (at most 128)", c.NodeID))
	}
	if err := zfsname.Validate(c.RootDataset); err != nil || strings.Contains(c.RootDataset, "@") {
		errs = append(errs, fmt.Errorf("root_dataset %q: required, a filesystem such as tank/nomad", c.RootDataset))
	}
	if c.QuotaProperty != "quota" && c.QuotaProperty != "refquota" {
		errs = append(errs, fmt.Errorf("quota_property %q: must be quota or refquota", c.QuotaProperty))
	}
	if c.MaxQuota == 0 {
		errs = append(errs, errors.New("max_quota: required, the largest volume this node accepts (e.g. 100G)"))
	}
	if c.DefaultQuota == 0 || (c.MaxQuota > 0 && c.DefaultQuota > c.MaxQuota) {
		errs = append(errs, fmt.Errorf("default_quota %s: must be above 0 and at most max_quota %s", c.DefaultQuota, c.MaxQuota))
	}
	return errs
}

// validateProperties checks the properties volumes may set, and the key
// file of encrypted ones.
func (c *Node) validateProperties() []error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(c.Properties)) {
		if !SettableProperties[name] {
			errs = append(errs, fmt.Errorf("properties: %q is not a property volumes may set (allowed: %s)", name, strings.Join(slices.Sorted(maps.Keys(SettableProperties)), ", ")))
			continue
		}
		rule := c.Properties[name]
		for _, v := range append([]string{rule.Default}, rule.Allowed...) {
			if err := ValidatePropertyValue(v); err != nil && v != "" {
				errs = append(errs, fmt.Errorf("properties.%s: %w", name, err))
			}
			if name == "encryption" && v != "" && !slices.Contains(EncryptionValues, v) {
				errs = append(errs, fmt.Errorf("properties.encryption: %q is not an encryption value (%s)", v, strings.Join(EncryptionValues, ", ")))
			}
		}
		if rule.Default != "" && len(rule.Allowed) > 0 && !slices.Contains(rule.Allowed, rule.Default) {
			errs = append(errs, fmt.Errorf("properties.%s: default %q is not among allowed %v", name, rule.Default, rule.Allowed))
		}
	}
	if c.EncryptionKeyFile != "" && !filepath.IsAbs(c.EncryptionKeyFile) {
		errs = append(errs, fmt.Errorf("encryption_key_file %q: must be an absolute path", c.EncryptionKeyFile))
	}
	if n := c.EncryptionPBKDF2Iterations; n != 0 && n < MinPBKDF2Iterations {
		errs = append(errs, fmt.Errorf("encryption_pbkdf2_iterations %d: OpenZFS takes %d or more (0 leaves its default, 350000)", n, MinPBKDF2Iterations))
	}
	return errs
}

// validateMounts checks how volumes are mounted: their root directory, the
// mount flags and the paths a CO may hand the node.
func (c *Node) validateMounts() []error {
	var errs []error
	errs = append(errs, c.RootDirectory.validate()...)
	for _, f := range c.MountFlags {
		if !AllowedMountFlags[f] {
			errs = append(errs, fmt.Errorf("mount_flags: %q is not a supported flag (supported: %s)", f, strings.Join(slices.Sorted(maps.Keys(AllowedMountFlags)), ", ")))
		}
	}
	if c.CSIEndpoint == "" {
		errs = append(errs, errors.New("csi_endpoint: required (Nomad sets CSI_ENDPOINT)"))
	}
	for _, b := range c.MountBaseDirs {
		if err := pathcheck.ValidateBase(b); err != nil {
			errs = append(errs, fmt.Errorf("mount_base_dirs: %w", err))
		}
	}
	return errs
}

// validateReplication checks the bounds of replicas and replication
// snapshots.
func (c *Node) validateReplication() []error {
	var errs []error
	if c.MinBackupInterval <= 0 {
		errs = append(errs, fmt.Errorf("min_backup_interval %s: must be positive", c.MinBackupInterval))
	}
	if c.MaxReplicas < 0 || c.ReplicationSnapshots < 1 || c.MinReplicationInterval <= 0 {
		errs = append(errs, fmt.Errorf("max_replicas %d must be 0 or more, replication_snapshots %d at least 1, min_replication_interval %s positive",
			c.MaxReplicas, c.ReplicationSnapshots, c.MinReplicationInterval))
	}
	return errs
}

// validateLease checks the lease, its margin and the peers that grant it.
func (c *Node) validateLease() []error {
	var errs []error
	if c.Lease < Duration(2*time.Second) {
		errs = append(errs, fmt.Errorf("lease %s: at least 2s (a peer's answer must fit in a quarter of it)", c.Lease))
	}
	if min := MinLeaseMargin(time.Duration(c.Lease)); time.Duration(c.LeaseMargin) < min {
		errs = append(errs, fmt.Errorf("lease_margin %s: at least %s with lease %s (a ping interval %s, a beat interval %s and the fence allowance %s, docs/safety.md \"Why the margin covers the self-fence\"): a smaller margin lets a majority grant a failover before a cut-off primary is read-only; raise lease_margin",
			c.LeaseMargin, min, c.Lease, time.Duration(c.Lease)/4, time.Duration(c.Lease)/4, FenceAllowance))
	}
	for _, p := range c.Peers {
		if _, _, err := net.SplitHostPort(p); err != nil {
			errs = append(errs, fmt.Errorf("peers: %q is not host:port", p))
		}
	}
	if _, err := c.WitnessSet(); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// WitnessSet is Witnesses, parsed (the empty set when none are listed).
func (c *Node) WitnessSet() (witnesses.Set, error) {
	return witnesses.Parse(c.Witnesses)
}

// validateAgent checks the agent port: its address, TLS, the receive
// timeout, and the topology the node reports.
func (c *Node) validateAgent() []error {
	var errs []error
	if c.ReceiveIdleTimeout < Duration(time.Second) {
		errs = append(errs, fmt.Errorf("receive_idle_timeout %s: at least 1s (a sender's pause between two messages must not end its transfer)", c.ReceiveIdleTimeout))
	}
	if err := ValidatePropertyValue(c.Domain); err != nil {
		errs = append(errs, fmt.Errorf("domain: %v", err))
	}
	if c.AgentAddress == "" {
		errs = append(errs, errors.New("agent_address: required, host:port the controller reaches this node on"))
	}
	if err := c.TLS.validate(c.InsecureAgentPort); err != nil {
		errs = append(errs, err)
	}
	for _, name := range slices.Sorted(maps.Keys(c.BackupTargets)) {
		if err := validateTarget(name, c.BackupTargets[name]); err != nil {
			errs = append(errs, err)
		}
	}
	for k, v := range c.Topology {
		if k == TopologyNodeKey || k == TopologyDomainKey {
			errs = append(errs, fmt.Errorf("topology: %q is set by the driver (node_id, domain)", k))
		}
		if k == "" || v == "" {
			errs = append(errs, fmt.Errorf("topology: empty key or value in %q=%q", k, v))
		}
	}
	return errs
}

// BaseDirs returns the directories staging and target paths must lie
// below: MountBaseDirs, or by default the directory Nomad's CSI endpoint
// points into and pathcheck.DefaultBases.
func (c *Node) BaseDirs() []string {
	if len(c.MountBaseDirs) > 0 {
		return c.MountBaseDirs
	}
	bases := slices.Clone(pathcheck.DefaultBases)
	if b := pathcheck.NomadBase(c.CSIEndpoint); b != "" && !slices.Contains(bases, b) {
		bases = append([]string{b}, bases...)
	}
	return bases
}

// Segments returns the node's full topology.
func (c *Node) Segments() map[string]string {
	seg := map[string]string{TopologyNodeKey: c.NodeID, TopologyDomainKey: c.Domain}
	for k, v := range c.Topology {
		seg[k] = v
	}
	return seg
}

// Pool returns the pool the root dataset lives on.
func (c *Node) Pool() string {
	pool, _, _ := strings.Cut(c.RootDataset, "/")
	return pool
}

// ValidatePropertyValue refuses values that could smuggle syntax into ZFS.
func ValidatePropertyValue(v string) error {
	if v == "" || len(v) > 64 {
		return fmt.Errorf("value %q: must be 1 to 64 characters", v)
	}
	for _, r := range v {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.'
		if !ok {
			return fmt.Errorf("value %q: character %q not allowed (letters, digits, - _ .)", v, r)
		}
	}
	return nil
}
