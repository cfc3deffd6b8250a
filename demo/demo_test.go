package main

import (
	"os"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/guesttest"
)

func TestMain(m *testing.M) {
	os.Exit(guesttest.Main(m, guesttest.Options{
		Disks:    []string{"1G", "1G", "1G"},
		Binaries: map[string]string{"zfs-node": "./cmd/zfs-node", "zfs-controller": "./cmd/zfs-controller"},
		Timeout:  20 * time.Minute,
	}))
}

// TestDemo runs `make demo`'s story, so the demo keeps working. The story
// goes to standard output as it runs, so a run that hangs shows where.
func TestDemo(t *testing.T) {
	if err := run(os.Stdout, guesttest.BinDir(t), t.TempDir()); err != nil {
		t.Fatal(err)
	}
}
