package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
)

// TestCommands: zfs-node's command line, and check-config's verdicts
// on configurations serve would refuse, without ZFS.
func TestCommands(t *testing.T) {
	dir := t.TempDir()
	ca, err := tlsconfig.NewCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	mine, err := ca.Issue("n1", tlsconfig.RoleNode)
	if err != nil {
		t.Fatal(err)
	}
	other, err := ca.Issue("n2", tlsconfig.RoleNode)
	if err != nil {
		t.Fatal(err)
	}
	misspelt := filepath.Join(dir, "node.json")
	if err := os.WriteFile(misspelt, []byte("{\n  \"node_id\": \"n1\",\n  \"max_qouta\": \"1G\"\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := "-node-id n1 -root-dataset tank/nomad -max-quota 10G"
	tls := func(f tlsconfig.Files) string {
		return " -tls-ca " + f.CA + " -tls-cert " + f.Cert + " -tls-key " + f.Key
	}
	tests := []struct {
		args   string
		code   int    // the exit status
		output string // in stdout or stderr
	}{
		{"version", 0, "agent protocol 1"},
		{"--version", 0, "agent protocol 1"},
		{"-h", 0, "check-config"},
		{"help", 0, "serve"},
		{"help check-config", 0, "-node-id"},
		{"check-config -h", 0, "-root-dataset"},
		{"version -h", 0, "usage: zfs-node version"},
		{"bogus", 2, `unknown command "bogus"`},
		{"version extra", 2, "no arguments"},
		{"-bogus", 2, "(zfs-node serve -h lists its flags)"},
		{"check-config " + base + tls(mine), 0, "the configuration is valid"},
		{"check-config " + base + tls(mine), 0, "names node n1, valid until"},
		{"check-config " + base + " -insecure-agent-port", 0, "WITHOUT TLS"},
		{"check-config " + base + tls(other), 1, "n2"},
		{"check-config -node-id n1", 1, "max_quota: required"},
		{"check-config -config " + misspelt, 1, `line 3, column 3: unknown key "max_qouta"; did you mean "max_quota"?`},
	}
	for _, tc := range tests {
		t.Run(tc.args, func(t *testing.T) {
			var stdout, stderr strings.Builder
			code := run(strings.Fields(tc.args), &stdout, &stderr)
			if text := stdout.String() + stderr.String(); code != tc.code || !strings.Contains(text, tc.output) {
				t.Fatalf("zfs-node %s: exit %d, said %q; want exit %d and %q", tc.args, code, text, tc.code, tc.output)
			}
		})
	}
}
