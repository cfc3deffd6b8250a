package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
)

func TestMain(m *testing.M) {
	os.Exit(guesttest.Main(m, guesttest.Options{
		Disks:    []string{"1G", "1G", "1G"},
		Binaries: guesttest.DriverBinaries(),
		Timeout:  20 * time.Minute,
	}))
}

// TestDemo runs `make demo`'s story, so the demo keeps working. The story
// goes to standard output as it runs, so a run that hangs shows where.
func TestDemo(t *testing.T) {
	dir := t.TempDir()
	if err := run(os.Stdout, guesttest.BinDir(t), dir); err != nil {
		// The error first: CI keeps the start of a failure's output.
		t.Errorf("the demo failed: %v", err)
		logDecisions(t, dir)
	}
}

// decisions matches the log lines that tell what the driver decided about
// a copy's life.
var decisions = regexp.MustCompile(`(?i)aside|promot|demot|reserv|failover|fence|moved|stale`)

// logDecisions prints, after a failure, the processes' log lines about
// moves, failovers and copies set aside: the logs go with the guest, and a
// run that fails once in several must be explained from its own output.
func logDecisions(t *testing.T, dir string) {
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, path := range logs {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		var lines []string
		for _, line := range strings.Split(string(data), "\n") {
			if decisions.MatchString(line) {
				lines = append(lines, line)
			}
		}
		if len(lines) > 150 {
			lines = lines[len(lines)-150:]
		}
		t.Logf("%s, its lines about moves, failovers and copies set aside:\n%s", filepath.Base(path), strings.Join(lines, "\n"))
	}
}
