package main

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
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
		err    error  // nil: success
		output string // in stdout or the error
	}{
		{"version", nil, "agent protocol 1"},
		{"--version", nil, "agent protocol 1"},
		{"-h", nil, "check-config"},
		{"help", nil, "serve"},
		{"bogus", config.ErrUsage, `unknown command "bogus"`},
		{"version extra", config.ErrUsage, "no arguments"},
		{"-bogus", config.ErrUsage, "(zfs-node serve -h lists its flags)"},
		{"check-config -h", flag.ErrHelp, ""},
		{"check-config " + base + tls(mine), nil, "the configuration is valid"},
		{"check-config " + base + tls(mine), nil, "names node n1, valid until"},
		{"check-config " + base + " -insecure-agent-port", nil, "WITHOUT TLS"},
		{"check-config " + base + tls(other), errAny, "n2"},
		{"check-config -node-id n1", errAny, "max_quota: required"},
		{"check-config -config " + misspelt, errAny, `line 3, column 3: unknown key "max_qouta"; did you mean "max_quota"?`},
	}
	for _, tc := range tests {
		t.Run(tc.args, func(t *testing.T) {
			var out strings.Builder
			err := run(strings.Fields(tc.args), &out)
			text := out.String()
			if err != nil {
				text += err.Error()
			}
			switch {
			case tc.err == nil && err != nil, tc.err == errAny && err == nil, tc.err != nil && tc.err != errAny && !errors.Is(err, tc.err):
				t.Fatalf("zfs-node %s: %v; want %v", tc.args, err, tc.err)
			case !strings.Contains(text, tc.output):
				t.Fatalf("zfs-node %s said %q; want it to say %q", tc.args, text, tc.output)
			}
		})
	}
}

// errAny stands for any error in TestCommands' table.
var errAny = errors.New("any error")
