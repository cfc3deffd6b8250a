package config

import (
	"errors"
	"flag"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copylock"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestLoadNodePrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "node.json")
	os.WriteFile(file, []byte(`{"node_id":"from-file","root_dataset":"tank/a","max_quota":"10G","default_quota":"1G",
		"properties":{"compression":{"default":"lz4","allowed":["lz4","off"]}}}`), 0o644)
	cfg, err := LoadNode([]string{"-config", file, "-root-dataset", "tank/flag", "-tls-ca", "ca.pem", "-tls-cert", "c.pem", "-tls-key", "k.pem"},
		env(map[string]string{"ZFS_NOMAD_NODE_ID": "from-env", "ZFS_NOMAD_ROOT_DATASET": "tank/env", "CSI_ENDPOINT": "unix:///nomad.sock"}), os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NodeID != "from-env" || cfg.RootDataset != "tank/flag" || cfg.MaxQuota != 10<<30 || cfg.CSIEndpoint != "unix:///nomad.sock" {
		t.Errorf("precedence wrong: %+v", cfg)
	}
	if cfg.Properties["compression"].Default != "lz4" || cfg.Pool() != "tank" {
		t.Errorf("file values lost: %+v", cfg)
	}
}

// TestMinLeaseMargin: the default margin is the minimum for the default
// lease, and the minimum is L/4 + L/4 + FenceAllowance.
func TestMinLeaseMargin(t *testing.T) {
	d := DefaultNode()
	if got, want := time.Duration(d.LeaseMargin), MinLeaseMargin(time.Duration(d.Lease)); got < want {
		t.Errorf("default lease_margin %s is below the minimum %s for the default lease %s", got, want, time.Duration(d.Lease))
	}
	for _, tc := range []struct{ lease, want time.Duration }{
		{8 * time.Second, 19 * time.Second},
		{30 * time.Second, 30 * time.Second},
	} {
		if got := MinLeaseMargin(tc.lease); got != tc.want {
			t.Errorf("MinLeaseMargin(%s) = %s, want %s", tc.lease, got, tc.want)
		}
	}
}

func TestNodeValidation(t *testing.T) {
	base := []string{"-node-id", "n1", "-root-dataset", "tank/nomad", "-max-quota", "10G", "-insecure-agent-port"}
	tests := []struct {
		name string
		args []string
		want string // "" means valid
	}{
		{"valid", nil, ""},
		{"property with values", []string{"-allow-property", "compression=lz4:lz4|zstd"}, ""},
		{"missing node id", []string{"-node-id", ""}, "node_id"},
		{"root is a snapshot", []string{"-root-dataset", "tank@x"}, "root_dataset"},
		{"root with escape", []string{"-root-dataset", "tank/../etc"}, "root_dataset"},
		{"unknown property", []string{"-allow-property", "mountpoint=/x"}, `"mountpoint" is not a property`},
		{"default not allowed", []string{"-allow-property", "compression=gzip:lz4|zstd"}, "not among allowed"},
		{"bad value syntax", []string{"-allow-property", "atime=on,off"}, "not allowed"},
		{"default above max", []string{"-default-quota", "20G"}, "default_quota"},
		{"bad quota property", []string{"-quota-property", "reservation"}, "quota_property"},
		{"unknown mount flag", []string{"-mount-flags", "suid"}, `"suid" is not a supported flag`},
		{"reserved topology", []string{"-topology", "zfs-nomad.io/node=x"}, "set by the driver"},
		{"bad size", []string{"-max-quota", "lots"}, "size"},
		{"receive idle timeout", []string{"-receive-idle-timeout", "5s"}, ""},
		{"receive idle timeout too short", []string{"-receive-idle-timeout", "10ms"}, "receive_idle_timeout"},
		{"tls required", []string{"-insecure-agent-port=false"}, "mutual TLS"},
		{"tls complete", []string{"-insecure-agent-port=false", "-tls-ca", "a", "-tls-cert", "b", "-tls-key", "c"}, ""},
		// The margin must cover a ping interval, a beat interval and the
		// self-fence (MinLeaseMargin): L/4 was accepted before and let a
		// majority grant a failover before the cut-off node was fenced.
		{"margin a quarter of the lease", []string{"-lease", "8s", "-lease-margin", "2s"}, "lease_margin"},
		{"margin of the old guest tests", []string{"-lease", "8s", "-lease-margin", "4s"}, "lease_margin"},
		{"margin just below the minimum", []string{"-lease", "8s", "-lease-margin", "18.9s"}, "lease_margin"},
		{"margin at the minimum", []string{"-lease", "8s", "-lease-margin", "19s"}, ""},
		{"default margin with a longer lease", []string{"-lease", "60s"}, "lease_margin"},
		{"root owners", []string{"-root-uids", "1000-65534,0", "-root-gids", "100", "-root-mode-mask", "0770"}, ""},
		{"root uid range backwards", []string{"-root-uids", "2000-1000"}, "root_directory.uids"},
		{"root gid not a number", []string{"-root-gids", "staff"}, "root_directory.gids"},
		{"root uid too large", []string{"-root-uids", "4294967295"}, "root_directory.uids"},
		{"root mode mask not octal", []string{"-root-mode-mask", "0999"}, "root_directory.mode_mask"},
		{"encryption allowed", []string{"-allow-property", "encryption=on:on|off|aes-256-gcm", "-encryption-key-file", "/etc/zfs-nomad/volume-key"}, ""},
		{"encryption not a cipher", []string{"-allow-property", "encryption=on:on|rot13"}, `"rot13" is not an encryption value`},
		{"key properties are the driver's", []string{"-allow-property", "keylocation=file:///etc/shadow"}, `"keylocation" is not a property`},
		{"key file relative", []string{"-encryption-key-file", "volume-key"}, "encryption_key_file"},
		{"key derivation at OpenZFS's minimum", []string{"-encryption-pbkdf2-iterations", "100000"}, ""},
		{"key derivation stronger", []string{"-encryption-pbkdf2-iterations", "1300000"}, ""},
		{"key derivation below OpenZFS's minimum", []string{"-encryption-pbkdf2-iterations", "99999"}, "encryption_pbkdf2_iterations 99999"},
		{"key derivation negative", []string{"-encryption-pbkdf2-iterations", "-1"}, "encryption_pbkdf2_iterations -1"},
		{"backup targets", []string{"-backup-targets", "vault=vault.example:7680,offsite=10.0.0.9:7680"}, ""},
		{"backup target without a port", []string{"-backup-targets", "vault=vault.example"}, "backup_targets.vault"},
		{"backup target's name not a certificate's", []string{"-backup-targets", "../vault=vault.example:7680"}, `name "../vault"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadNode(append(append([]string{}, base...), tc.args...), env(nil), os.Stderr)
			if tc.want == "" && err != nil {
				t.Fatalf("want valid, got %v", err)
			}
			if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("want error containing %q, got %v", tc.want, err)
			}
		})
	}
}

// TestTargetValidation: a backup target needs its name, its root and
// its TLS material; it has no insecure mode.
func TestTargetValidation(t *testing.T) {
	base := []string{"-name", "vault", "-root-dataset", "backup/nomad", "-tls-ca", "a", "-tls-cert", "b", "-tls-key", "c"}
	tests := []struct {
		name string
		args []string
		want string // "" means valid
	}{
		{"valid", nil, ""},
		{"no name", []string{"-name", ""}, "name"},
		{"root is a snapshot", []string{"-root-dataset", "backup@x"}, "root_dataset"},
		{"no TLS", []string{"-tls-key", ""}, "mutual TLS"},
		{"no insecure mode", []string{"-insecure-agent-port"}, "not defined"},
		{"keeps nothing", []string{"-max-kept", "0"}, "max_kept"},
		{"an argument", []string{"extra"}, "unexpected argument"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadTarget("usage", append(append([]string{}, base...), tc.args...), env(nil), io.Discard)
			if tc.want == "" && err != nil {
				t.Fatalf("want valid, got %v", err)
			}
			if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("want error containing %q, got %v", tc.want, err)
			}
		})
	}
}

func TestControllerConfig(t *testing.T) {
	cfg, err := LoadController("usage", []string{"-peers", "a:1,b:2", "-agent-timeout", "5s", "-insecure-agent-port", "-surplus-grace", "1h", "-move-publish-ahead", "30s", "-deletions-every", "10s"}, env(nil), os.Stderr)
	if err != nil || len(cfg.Peers) != 2 || time.Duration(cfg.AgentTimeout) != 5*time.Second || time.Duration(cfg.SurplusGrace) != time.Hour || time.Duration(cfg.MovePublishAhead) != 30*time.Second || time.Duration(cfg.DeletionsEvery) != 10*time.Second {
		t.Fatalf("%+v, %v", cfg, err)
	}
	if cfg, err := LoadController("usage", []string{"-peers", "a:1", "-insecure-agent-port", "-backup-targets", "vault=v.example:7680"}, env(nil), os.Stderr); err != nil || cfg.BackupTargets["vault"] != "v.example:7680" {
		t.Errorf("backup targets: %+v, %v", cfg.BackupTargets, err)
	}
	for _, args := range [][]string{{"-insecure-agent-port"}, {"-peers", "nohostport", "-insecure-agent-port"},
		{"-peers", "a:1", "-insecure-agent-port", "-backup-targets", "vault=noport"}, {"-peers", "a:1", "-placement", "random", "-insecure-agent-port"}, {"-peers", "a:1"},
		{"-peers", "a:1", "-insecure-agent-port", "-surplus-grace", "-1m"}, {"-peers", "a:1", "-insecure-agent-port", "-deletions-every", "0s"},
		{"-peers", "a:1", "-insecure-agent-port", "-move-publish-ahead", "-1s"}, {"-peers", "a:1", "-insecure-agent-port", "-move-publish-ahead", "10m"}} {
		if _, err := LoadController("usage", args, env(nil), os.Stderr); err == nil {
			t.Errorf("LoadController(%v) accepted", args)
		}
	}
}

// TestOperatorConfig: an operator command reads where the agents are and
// its own flags, not the server's, before or after its arguments, and -h
// shows its usage and only those.
func TestOperatorConfig(t *testing.T) {
	var to string
	extra := func(fs *flag.FlagSet) { fs.StringVar(&to, "to", "", "target node") }
	cfg, rest, err := LoadOperator("zfs-controller backup", "usage: zfs-controller backup [flags] VOLUME_ID", []string{"-peers", "a:1", "-insecure-agent-port", "-to", "n2", "vol-1"}, env(nil), io.Discard, extra)
	if err != nil || len(cfg.Peers) != 1 || to != "n2" || !slices.Equal(rest, []string{"vol-1"}) {
		t.Fatalf("%+v, %q, %v, %v", cfg, to, rest, err)
	}
	if _, _, err := LoadOperator("zfs-controller backup", "usage", []string{"-peers", "a:1", "-insecure-agent-port", "-placement", "most-free", "vol-1"}, env(nil), io.Discard, extra); err == nil {
		t.Error("an operator command accepted the server's -placement")
	}
	var help strings.Builder
	_, _, err = LoadOperator("zfs-controller backup", "usage: zfs-controller backup [flags] VOLUME_ID", []string{"-h"}, env(nil), &help, extra)
	if !errors.Is(err, flag.ErrHelp) || !strings.HasPrefix(help.String(), "usage: zfs-controller backup") || !strings.Contains(help.String(), "-to") ||
		strings.Contains(help.String(), "-schedule-every") || strings.Contains(help.String(), "-csi-endpoint") {
		t.Errorf("-h: %v, printed:\n%s\nwant the usage line, -to, and no flag of the server", err, help.String())
	}
	// The environment sets what the flags would, as NOMAD_ADDR does for
	// Nomad's commands; a flag still wins.
	cfg, _, err = LoadOperator("zfs-controller status", "usage", nil, env(map[string]string{"ZFS_NOMAD_PEERS": "a:1,b:1",
		"ZFS_NOMAD_TLS_CA": "/ca.pem", "ZFS_NOMAD_TLS_CERT": "/op.pem", "ZFS_NOMAD_TLS_KEY": "/op-key.pem", "ZFS_NOMAD_BACKUP_TARGETS": "vault=v:7680"}), io.Discard, nil)
	if err != nil || len(cfg.Peers) != 2 || cfg.TLS.CA != "/ca.pem" || cfg.TLS.Key != "/op-key.pem" || cfg.BackupTargets["vault"] != "v:7680" {
		t.Errorf("from the environment: %+v, %v", cfg, err)
	}
	cfg, _, err = LoadOperator("zfs-controller status", "usage", []string{"-peers", "c:1"}, env(map[string]string{"ZFS_NOMAD_PEERS": "a:1,b:1",
		"ZFS_NOMAD_TLS_CA": "/ca.pem", "ZFS_NOMAD_TLS_CERT": "/op.pem", "ZFS_NOMAD_TLS_KEY": "/op-key.pem"}), io.Discard, nil)
	if err != nil || !slices.Equal(cfg.Peers, []string{"c:1"}) {
		t.Errorf("-peers over ZFS_NOMAD_PEERS: %q, %v; want the flag's", cfg.Peers, err)
	}

	// Flags after the argument count, as in Nomad's commands; "--" ends
	// them.
	to = ""
	cfg, rest, err = LoadOperator("zfs-controller backup", "usage", []string{"vol-1", "-peers", "a:1", "-to", "n3", "-insecure-agent-port"}, env(nil), io.Discard, extra)
	if err != nil || len(cfg.Peers) != 1 || to != "n3" || !cfg.InsecureAgentPort || !slices.Equal(rest, []string{"vol-1"}) {
		t.Errorf("flags after the argument: %+v, %q, %v, %v", cfg, to, rest, err)
	}
	_, rest, err = LoadOperator("zfs-controller backup", "usage", []string{"-peers", "a:1", "-insecure-agent-port", "--", "-vol"}, env(nil), io.Discard, extra)
	if err != nil || !slices.Equal(rest, []string{"-vol"}) {
		t.Errorf("an argument after --: %q, %v", rest, err)
	}
	if _, _, err := LoadOperator("zfs-controller backup", "usage", []string{"-peers", "a:1", "vol-1", "-nonsense"}, env(nil), io.Discard, extra); !errors.Is(err, ErrUsage) {
		t.Errorf("an unknown flag after the argument: %v, want ErrUsage", err)
	}
	if _, err := LoadController("usage", []string{"-peers", "a:1", "-insecure-agent-port", "stray"}, env(nil), io.Discard); !errors.Is(err, ErrUsage) {
		t.Errorf("serve with a stray argument: %v, want ErrUsage", err)
	}
}

func TestByteSize(t *testing.T) {
	for in, want := range map[string]ByteSize{"1G": 1 << 30, "512M": 512 << 20, "1Ti": 1 << 40, "1024": 1024, "2GB": 2 << 30} {
		if got, err := ParseByteSize(in); err != nil || got != want {
			t.Errorf("ParseByteSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "G", "-1G", "1.5G", "99999999999T"} {
		if _, err := ParseByteSize(bad); err == nil {
			t.Errorf("ParseByteSize(%q) accepted", bad)
		}
	}
	if s := ByteSize(3 << 30).String(); s != "3G" {
		t.Errorf("String = %s", s)
	}
}

func TestRootDirectoryRules(t *testing.T) {
	r := RootDirectory{UIDs: []string{"1000-1999", "65534"}, GIDs: []string{"0"}}
	for _, tc := range []struct {
		id       uint32
		uid, gid bool
	}{{0, false, true}, {999, false, false}, {1000, true, false}, {1999, true, false}, {2000, false, false}, {65534, true, false}} {
		if r.AllowsUID(tc.id) != tc.uid || r.AllowsGID(tc.id) != tc.gid {
			t.Errorf("id %d: uid allowed %v, gid allowed %v; want %v, %v", tc.id, r.AllowsUID(tc.id), r.AllowsGID(tc.id), tc.uid, tc.gid)
		}
	}
	if mask, err := r.Mask(); err != nil || mask != 0o2775 {
		t.Errorf("default mask %04o, %v; want 2775", mask, err)
	}
	for s, want := range map[string]uint32{"0750": 0o750, "750": 0o750, "2775": 0o2775, "07777": 0o7777} {
		if got, err := ParseMode(s); err != nil || got != want {
			t.Errorf("ParseMode(%q) = %04o, %v; want %04o", s, got, err, want)
		}
	}
	for _, s := range []string{"", "8", "-1", "10000", "0o755", "000755"} {
		if _, err := ParseMode(s); err == nil {
			t.Errorf("ParseMode(%q) accepted", s)
		}
	}
}

// TestConfigFileErrors: a config file's mistake is named by line and
// column, and a misspelt key by the key meant.
func TestConfigFileErrors(t *testing.T) {
	tests := []struct {
		file string
		want string
	}{
		{"{\n  \"node_id\": \"n1\",\n  \"max_qouta\": \"10G\"\n}", `line 3, column 3: unknown key "max_qouta"; did you mean "max_quota"?`},
		{"{\n  \"root_datset\": \"tank/x\"\n}", `line 2, column 3: unknown key "root_datset"; did you mean "root_dataset"?`},
		{"{\n  \"tls\": {\"crt\": \"a.pem\"}\n}", `line 2, column 11: unknown key "crt"; did you mean "cert"?`},
		{"{\n  \"completely_unknown\": 1\n}", `line 2, column 3: unknown key "completely_unknown"`},
		{"{\n  \"node_id\": \"n1\"\n  \"max_quota\": \"10G\"\n}", "line 3, column 3: invalid character"},
		{"{\n  \"max_replicas\": \"two\"\n}", "line 2, column 23: max_replicas: want int, not a JSON string"},
	}
	for _, tc := range tests {
		file := filepath.Join(t.TempDir(), "node.json")
		if err := os.WriteFile(file, []byte(tc.file), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := LoadNode([]string{"-config", file}, env(nil), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config file\n%s\ngave %v, want an error containing %q", tc.file, err, tc.want)
		}
	}
}

// TestCopyLockWait: the fence allowance counts the copy lock's real wait.
func TestCopyLockWait(t *testing.T) {
	if copyLockWait != copylock.DefaultWait {
		t.Errorf("config's copyLockWait is %s, copylock.DefaultWait %s: the lease margin's fence allowance must count the lock's real wait", copyLockWait, copylock.DefaultWait)
	}
}
