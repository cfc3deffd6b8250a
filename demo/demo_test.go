package main

import (
	"bytes"
	"os"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/guesttest"
)

func TestMain(m *testing.M) {
	os.Exit(guesttest.Main(m, guesttest.Options{
		Disks:    []string{"1G", "1G", "1G"},
		Binaries: map[string]string{"zfs-node": "./cmd/zfs-node", "zfs-controller": "./cmd/zfs-controller"},
	}))
}

// TestDemo runs `make demo`'s story, so the demo keeps working.
func TestDemo(t *testing.T) {
	var out bytes.Buffer
	err := run(&out, guesttest.BinDir(t), t.TempDir())
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
}
