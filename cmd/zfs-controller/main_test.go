package main

import (
	"io"
	"strings"
	"testing"
)

// TestCommandLine: the command line answers a person at a terminal as
// zrepl's and Nomad's do: a list of commands, each command's own usage,
// and exit status 2 for a wrong command line.
func TestCommandLine(t *testing.T) {
	noEnv := func(string) string { return "" }
	tests := []struct {
		args     string
		code     int
		errorHas string
	}{
		{"", 2, "no command given"},
		{"-h", 0, ""},
		{"help", 0, ""},
		{"help status", 0, ""},
		{"backup -h", 0, ""},
		{"version", 0, ""},
		{"bogus", 2, `unknown command "bogus"`},
		{"backup -peers a:1 -insecure-agent-port", 2, "want one VOLUME_ID"},
		{"backup -peers a:1 -insecure-agent-port vol-1 vol-2", 2, "want one VOLUME_ID, got 2"},
		{"status -peers a:1 -insecure-agent-port stray", 2, "status takes no arguments"},
		{"status -placement most-free", 2, "-placement"},
		{"remove-replica -peers a:1 -insecure-agent-port vol-1", 2, "-node is required"},
		{"-peers a:1 -insecure-agent-port stray", 2, `unexpected argument "stray"`},
		{"backup vol-1", 1, "peers"}, // a configuration error, not a wrong command line
	}
	for _, tc := range tests {
		t.Run(tc.args, func(t *testing.T) {
			err := run(strings.Fields(tc.args), noEnv)
			if code := exitCode(err, io.Discard); code != tc.code || tc.errorHas != "" && !strings.Contains(err.Error(), tc.errorHas) {
				t.Errorf("zfs-controller %s: exit %d, %v; want exit %d and an error naming %q", tc.args, code, err, tc.code, tc.errorHas)
			}
		})
	}
}

func TestConnectReturnsTheVolume(t *testing.T) {
	sess, err := connect(commands[1], []string{"-peers", "a:1", "-insecure-agent-port", "-to", "n2", "vol-1"}, true, nil)
	if err == nil {
		defer sess.nodes.Close()
	}
	if err == nil || sess.volumeID != "" {
		// -to is backup's own flag: connect alone does not know it.
		t.Fatalf("connect without backup's flags: %q, %v; want the unknown -to refused", sess.volumeID, err)
	}
	sess, err = connect(commands[1], []string{"-peers", "a:1", "-insecure-agent-port", "vol-1"}, true, nil)
	if err != nil || sess.volumeID != "vol-1" {
		t.Fatalf("connect: %q, %v; want vol-1", sess.volumeID, err)
	}
	sess.nodes.Close()
}
