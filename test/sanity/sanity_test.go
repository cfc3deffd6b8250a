// Package sanity runs csi-sanity (kubernetes-csi/csi-test) against the real
// zfs-controller and zfs-node binaries on real ZFS in the guest.
//
// Specs that do not apply to this driver are skipped by csi-sanity itself
// from the capabilities the driver reports; README.md lists them with why.
package sanity

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
)

// withEncrypted runs csi-sanity's specs a second time with encrypted
// volumes (make sanity-encrypted). make test leaves it off: at about five
// minutes in the guest (a passphrase derivation at each create and
// stage) it repeats csi-sanity's checks of the driver's logic, which the
// plain half makes, over the zfs commands of encrypted volumes, which
// test/migration's TestEncryptedVolumesOpenOnlyWhereStaged makes on
// both OpenZFS releases, and the Nomad end-to-end test's volume is
// encrypted.
var withEncrypted = flag.Bool("sanity.encrypted", false, "run csi-sanity a second time with encrypted volumes")

func TestMain(m *testing.M) {
	os.Exit(guesttest.Main(m, guesttest.Options{
		Disks:    []string{"2G", "2G"},
		Binaries: guesttest.DriverBinaries(),
	}))
}

// TestCSISanity runs csi-sanity's specs with plain volumes and, with
// -sanity.encrypted, again in the same suite on the same cluster with
// encrypted ones whose passphrase every call carries in its secrets, as
// Nomad sends a volume's secrets block (docs/security.md, "Encrypted
// volumes"). Ginkgo runs a suite once per process, so both sets are
// registered before it runs.
func TestCSISanity(t *testing.T) {
	// Two nodes, so placement is exercised; csi-sanity sends no topology and
	// publishes on node n1 only, so its volumes are pinned there with the
	// driver's "node" parameter.
	// The shipped agent timeout (30 s), not the simulation's 10 s: an
	// encrypted create derives its key, 6 to 10 s in the emulated guest.
	c := guesttest.StartCluster(t, 2, guestcluster.Options{
		NodeArgs:       []string{"-allow-property", "encryption=off:on|off"},
		ControllerArgs: []string{"-agent-timeout", "30s"},
	})
	n1 := c.Nodes[0]

	secrets := filepath.Join(t.TempDir(), "secrets.yaml")
	if err := os.WriteFile(secrets, []byte(secretsFile), 0o600); err != nil {
		t.Fatal(err)
	}
	var suites []*sanity.TestContext
	for _, tc := range []struct {
		name    string
		params  map[string]string
		secrets string
	}{
		{"plain", map[string]string{"node": n1.ID, "compression": "lz4"}, ""},
		{"encrypted", map[string]string{"node": n1.ID, "compression": "lz4", "encryption": "on"}, secrets},
	} {
		if tc.secrets != "" && !*withEncrypted {
			continue
		}
		cfg := sanity.NewTestConfig()
		cfg.Address = n1.CSIEndpoint
		cfg.ControllerAddress = c.ControllerEndpoint
		cfg.TargetPath = filepath.Join(n1.Dir, "target-"+tc.name)
		cfg.StagingPath = filepath.Join(n1.Dir, "staging-"+tc.name)
		cfg.TestVolumeSize = 64 << 20
		cfg.TestVolumeExpandSize = 128 << 20
		cfg.TestVolumeParameters = tc.params
		cfg.SecretsFile = tc.secrets
		cfg.IdempotentCount = 2
		ginkgo.Describe(tc.name+" volumes", func() { suites = append(suites, sanity.GinkgoTest(&cfg)) })
	}
	gomega.RegisterFailHandler(ginkgo.Fail)
	ginkgo.RunSpecs(t, "CSI Driver Test Suite")
	for _, sc := range suites {
		sc.Finalize()
	}
}

// secretsFile gives every call that may carry secrets the passphrase.
const secretsFile = `
CreateVolumeSecret: {encryption_key: "sanity passphrase"}
DeleteVolumeSecret: {encryption_key: "sanity passphrase"}
ControllerPublishVolumeSecret: {encryption_key: "sanity passphrase"}
ControllerUnpublishVolumeSecret: {encryption_key: "sanity passphrase"}
ControllerValidateVolumeCapabilitiesSecret: {encryption_key: "sanity passphrase"}
NodeStageVolumeSecret: {encryption_key: "sanity passphrase"}
NodePublishVolumeSecret: {encryption_key: "sanity passphrase"}
CreateSnapshotSecret: {encryption_key: "sanity passphrase"}
DeleteSnapshotSecret: {encryption_key: "sanity passphrase"}
ControllerExpandVolumeSecret: {encryption_key: "sanity passphrase"}
ListSnapshotsSecret: {encryption_key: "sanity passphrase"}
GetSnapshotSecret: {encryption_key: "sanity passphrase"}
`
