// Package sanity runs csi-sanity (kubernetes-csi/csi-test) against the real
// zfs-controller and zfs-node binaries on real ZFS in the guest.
//
// Specs that do not apply to this driver are skipped by csi-sanity itself
// from the capabilities the driver reports; README.md lists them with why.
package sanity

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"

	"github.com/zfs-nomad/zfs-nomad/internal/guesttest"
	"github.com/zfs-nomad/zfs-nomad/internal/sim"
)

func TestMain(m *testing.M) {
	os.Exit(guesttest.Main(m, guesttest.Options{
		Disks:    []string{"2G", "2G"},
		Binaries: guesttest.DriverBinaries(),
	}))
}

func TestCSISanity(t *testing.T) {
	// Two nodes, so placement is exercised; csi-sanity sends no topology and
	// publishes on node n1 only, so its volumes are pinned there with the
	// driver's "node" parameter.
	c := guesttest.StartCluster(t, 2, sim.Options{})
	n1 := c.Nodes[0]

	cfg := sanity.NewTestConfig()
	cfg.Address = n1.CSIEndpoint
	cfg.ControllerAddress = c.ControllerEndpoint
	cfg.TargetPath = filepath.Join(n1.Dir, "target")
	cfg.StagingPath = filepath.Join(n1.Dir, "staging")
	cfg.TestVolumeSize = 64 << 20
	cfg.TestVolumeExpandSize = 128 << 20
	cfg.TestVolumeParameters = map[string]string{"node": n1.ID, "compression": "lz4"}
	cfg.IdempotentCount = 2
	sanity.Test(t, cfg)
}
