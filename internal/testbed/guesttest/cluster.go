package guesttest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/openzfs"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
)

// Disk returns the device of the guest's i-th disk (0: /dev/vda).
func Disk(i int) string { return guestcluster.Disk(i) }

// Run runs a command and fails the test with its output if it fails.
func Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := guestcluster.Run(name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// EncryptedMountDefect reports whether the guest's ZFS kernel module has
// OpenZFS 2.1's encrypted-mount defect, as zfs-node judges it at start
// (docs/security.md, "A kernel defect of OpenZFS 2.1"): where it has,
// the docs keep encrypted volumes away, and so do the tests in make test.
func EncryptedMountDefect(t testing.TB) bool {
	t.Helper()
	v, err := openzfs.Parse(Run(t, "zfs", "version"))
	if err != nil {
		t.Fatal(err)
	}
	return v.EncryptedMountDefect()
}

// Pool creates pool name on disk and destroys it when the test ends.
func Pool(t testing.TB, name, disk string) {
	t.Helper()
	if err := guestcluster.CreatePool(name, disk); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { guestcluster.DestroyPool(name) })
}

// allDisks are the guest's disks: Disks once per slot.
func (o Options) allDisks() []string {
	var all []string
	for range max(o.Slots, 1) {
		all = append(all, o.Disks...)
	}
	return all
}

// slots hands out the package's cluster slots (Options.Slots): a cluster
// takes a free one and gives it back once closed, so clusters of
// parallel tests never share a disk, a namespace or an address. A
// cluster with a backup target waits for slot 0, the only one a target
// runs in (guestcluster.TargetAddress); any other takes the highest free
// slot, so that slot 0 is the last taken and such a cluster seldom waits
// beside an idle slot.
var slots struct {
	mu    sync.Mutex
	freed *sync.Cond
	taken []bool
	disks int // a slot's disks: slot s starts at disk s*disks
}

func openSlots(opts Options) {
	slots.disks = len(opts.Disks)
	slots.taken = make([]bool, max(opts.Slots, 1))
	slots.freed = sync.NewCond(&slots.mu)
}

// takeSlot waits for a free slot (slot 0 if firstOnly, else the highest
// free one): with go test's -parallel above Slots, a parallel test's
// cluster waits for another's to close.
func takeSlot(firstOnly bool) int {
	if slots.freed == nil {
		return 0
	}
	slots.mu.Lock()
	defer slots.mu.Unlock()
	from := len(slots.taken) - 1 // the highest: slot 0 is taken last
	if firstOnly {
		from = 0
	}
	for {
		for s := from; s >= 0; s-- {
			if !slots.taken[s] {
				slots.taken[s] = true
				return s
			}
		}
		slots.freed.Wait()
	}
}

func giveBackSlot(s int) {
	if slots.freed == nil {
		return
	}
	slots.mu.Lock()
	slots.taken[s] = false
	slots.mu.Unlock()
	slots.freed.Broadcast()
}

// StartCluster starts a simulated cluster of n nodes (see package guestcluster) for
// the test, in a free slot of the guest, stops it when the test ends and
// shows the processes' logs if the test failed.
func StartCluster(t testing.TB, n int, opts guestcluster.Options) *guestcluster.Cluster {
	t.Helper()
	opts.Nodes = n
	opts.Dir = t.TempDir()
	opts.BinDir = BinDir(t)
	slot := takeSlot(opts.BackupTarget != "")
	opts.Slot, opts.FirstDisk = slot, slot*slots.disks
	began := time.Now()
	c, err := guestcluster.Start(opts)
	if err != nil {
		giveBackSlot(slot)
		t.Fatal(err)
	}
	t.Logf("cluster of %d nodes started in slot %d in %s", n, slot, time.Since(began).Round(time.Millisecond))
	t.Cleanup(func() {
		began := time.Now()
		c.Close()
		giveBackSlot(slot)
		t.Logf("cluster stopped in %s", time.Since(began).Round(time.Millisecond))
		if !t.Failed() {
			return
		}
		procs := append([]*guestcluster.Process{c.Controller}, c.ControllerInstances...)
		for _, n := range c.Nodes {
			procs = append(procs, n.Process)
		}
		if c.Target != nil {
			procs = append(procs, c.Target.Process)
		}
		for _, p := range procs {
			if p == nil {
				continue
			}
			if data, err := os.ReadFile(p.Log); err == nil {
				t.Logf("---- log of %s ----\n%s", p.Name, tail(string(data), 150))
			}
		}
	})
	return c
}

// Exec runs a shell command in node n's namespaces and fails the test if it fails.
func Exec(t testing.TB, n *guestcluster.Node, script string) string {
	t.Helper()
	out, err := n.Exec(script)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func tail(s string, lines int) string {
	parts := strings.Split(s, "\n")
	if len(parts) > lines {
		parts = parts[len(parts)-lines:]
	}
	return strings.Join(parts, "\n")
}

// DialAgent connects to node n's agent as the operator of cluster c and
// closes the connection when the test ends.
func DialAgent(t testing.TB, c *guestcluster.Cluster, n *guestcluster.Node) *grpc.ClientConn {
	t.Helper()
	conn, err := c.DialAgent(n.AgentAddress)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// Mount stages and publishes volume id on node n, writable
// (guestcluster.MountWriter) and with publishContext, in directories named after
// name in n.Dir, and returns the path the workload sees.
func Mount(ctx context.Context, t testing.TB, n *guestcluster.Node, id, name string, publishContext map[string]string) (string, error) {
	t.Helper()
	return MountWithSecrets(ctx, t, n, id, name, publishContext, nil)
}

// MountWithSecrets is Mount with the claim's secrets, as Nomad sends a
// volume's secrets block to NodeStageVolume and NodePublishVolume.
func MountWithSecrets(ctx context.Context, t testing.TB, n *guestcluster.Node, id, name string, publishContext, secrets map[string]string) (string, error) {
	t.Helper()
	writer := guestcluster.MountWriter()
	node := csi.NewNodeClient(Dial(t, n.CSIEndpoint))
	staging, target := filepath.Join(n.Dir, "staging-"+name), filepath.Join(n.Dir, "target-"+name)
	os.MkdirAll(staging, 0o755)
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: writer, PublishContext: publishContext, Secrets: secrets}); err != nil {
		return "", err
	}
	if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: writer, PublishContext: publishContext, Secrets: secrets}); err != nil {
		return "", err
	}
	return target, nil
}

// Dial connects to a CSI endpoint (unix://...) or another plaintext gRPC
// address and closes the connection when the test ends.
func Dial(t testing.TB, endpoint string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// RandomFile is a shell command that writes mib MiB of incompressible
// data to path: one MiB from /dev/urandom, repeated. The emulated guest's
// urandom gives about 20 MB/s, which a test of 150 MiB would spend 8 s
// on; every record of the repeated MiB is random, so compression and
// sends see as many bytes as from urandom itself.
func RandomFile(path string, mib int) string {
	return fmt.Sprintf("head -c 1048576 /dev/urandom >/tmp/seed.$$ && for i in $(seq %d); do cat /tmp/seed.$$; done >%s && rm -f /tmp/seed.$$", mib, path)
}

// Checksums is a shell command that prints a checksum of every file
// below dir, sorted by path: md5sum, which the emulated guest runs in
// half sha256sum's time; the tests compare copies, they defend against
// no adversary.
func Checksums(dir string) string {
	return "cd " + dir + " && find . -type f | sort | xargs -r md5sum"
}
