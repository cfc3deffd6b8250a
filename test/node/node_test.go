// Package node tests the CSI node service's mount paths on real ZFS in the
// guest: staging, publishing, read-only, mount flags, quotas, expansion and
// stats, seen from inside the node's own mount namespace.
package node

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
)

func TestMain(m *testing.M) {
	os.Exit(guesttest.Main(m, guesttest.Options{
		Disks:    []string{"1G"},
		Binaries: guesttest.DriverBinaries(),
	}))
}

type clients struct {
	ctl  csi.ControllerClient
	node csi.NodeClient
}

func setup(t *testing.T) (*guestcluster.Cluster, clients) {
	c := guesttest.StartCluster(t, 1, guestcluster.Options{})
	return c, clients{
		ctl:  csi.NewControllerClient(guesttest.Dial(t, c.ControllerEndpoint)),
		node: csi.NewNodeClient(guesttest.Dial(t, c.Nodes[0].CSIEndpoint)),
	}
}

func mountCap(mode csi.VolumeCapability_AccessMode_Mode, flags ...string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{MountFlags: flags}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

var writer = mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)

func wantCode(t *testing.T, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got %v (%v), want %v", status.Code(err), err, code)
	}
}

func createVolume(t *testing.T, cl clients, name string, size int64) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := cl.ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: name, VolumeCapabilities: []*csi.VolumeCapability{writer},
		CapacityRange: &csi.CapacityRange{RequiredBytes: size},
	})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetVolume().GetVolumeId()
}

func TestStagePublishReadOnlyAndUnwind(t *testing.T) {
	c, cl := setup(t)
	n := c.Nodes[0]
	ctx := context.Background()
	id := createVolume(t, cl, "data", 64<<20)
	staging, target, roTarget := filepath.Join(n.Dir, "staging"), filepath.Join(n.Dir, "target"), filepath.Join(n.Dir, "ro")
	if err := os.MkdirAll(staging, 0o755); err != nil {
		t.Fatal(err)
	}

	// Publishing before staging is refused.
	_, err := cl.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: writer})
	wantCode(t, err, codes.FailedPrecondition)

	stage := &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: writer}
	for i := 0; i < 2; i++ { // idempotent
		if _, err := cl.node.NodeStageVolume(ctx, stage); err != nil {
			t.Fatalf("stage #%d: %v", i+1, err)
		}
	}
	publish := &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: writer}
	for i := 0; i < 2; i++ {
		if _, err := cl.node.NodePublishVolume(ctx, publish); err != nil {
			t.Fatalf("publish #%d: %v", i+1, err)
		}
	}
	guesttest.Exec(t, n, "echo hello > "+target+"/file && sync")
	if got := guesttest.Exec(t, n, "cat "+staging+"/file"); got != "hello\n" {
		t.Errorf("file through staging = %q", got)
	}
	// The mounts live in the node's mount namespace, not in ours.
	if _, err := os.Stat(filepath.Join(target, "file")); err == nil {
		t.Errorf("the node's mount leaked into the root mount namespace")
	}

	// A read-only publish of the same volume.
	ro := &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: roTarget, VolumeCapability: writer, Readonly: true}
	if _, err := cl.node.NodePublishVolume(ctx, ro); err != nil {
		t.Fatal(err)
	}
	if got := guesttest.Exec(t, n, "cat "+roTarget+"/file"); got != "hello\n" {
		t.Errorf("read-only read = %q", got)
	}
	if out, err := n.Exec("echo x > " + roTarget + "/other"); err == nil || !strings.Contains(out, "Read-only") {
		t.Errorf("write to a read-only publish: %v %q; want refused", err, out)
	}
	// Publishing the read-only target again as writable is incompatible.
	ro.Readonly = false
	_, err = cl.node.NodePublishVolume(ctx, ro)
	wantCode(t, err, codes.AlreadyExists)

	// Stats report the quota and the inodes.
	stats, err := cl.node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
	if err != nil {
		t.Fatal(err)
	}
	if total := stats.GetUsage()[0].GetTotal(); total < 60<<20 || total > 68<<20 {
		t.Errorf("total bytes = %d, want about the 64 MiB quota", total)
	}
	if stats.GetUsage()[1].GetUnit() != csi.VolumeUsage_INODES || stats.GetUsage()[1].GetUsed() == 0 {
		t.Errorf("inode usage = %+v", stats.GetUsage()[1])
	}

	// Unwind, twice each.
	for _, path := range []string{target, roTarget} {
		for i := 0; i < 2; i++ {
			if _, err := cl.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: path}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Errorf("target %s still exists after unpublish: %v", path, err)
		}
	}
	for i := 0; i < 2; i++ {
		if _, err := cl.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Fatal(err)
		}
	}
	if out := guesttest.Exec(t, n, "grep -c ' "+staging+" ' /proc/self/mountinfo || true"); strings.TrimSpace(out) != "0" {
		t.Errorf("staging still mounted: %s", out)
	}
	// The data survives: stage again and read it.
	if _, err := cl.node.NodeStageVolume(ctx, stage); err != nil {
		t.Fatal(err)
	}
	if got := guesttest.Exec(t, n, "cat "+staging+"/file"); got != "hello\n" {
		t.Errorf("after restage = %q", got)
	}
	if _, err := cl.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
	if left, err := guestcluster.DatasetsLeft(n.RootDataset); err != nil || len(left) > 0 {
		t.Errorf("datasets left after delete: %v %v", left, err)
	}
}

func TestMountFlagsQuotaAndExpand(t *testing.T) {
	c, cl := setup(t)
	n := c.Nodes[0]
	ctx := context.Background()
	id := createVolume(t, cl, "small", 32<<20)
	staging, target := filepath.Join(n.Dir, "s2"), filepath.Join(n.Dir, "t2")
	os.MkdirAll(staging, 0o755)

	// A flag the operator did not allow is refused; allowed ones are applied.
	_, err := cl.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		VolumeCapability: mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "suid")})
	wantCode(t, err, codes.InvalidArgument)
	withFlags := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "noexec", "nosuid")
	if _, err := cl.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: withFlags}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: withFlags}); err != nil {
		t.Fatal(err)
	}
	line := guesttest.Exec(t, n, "grep ' "+target+" ' /proc/self/mountinfo")
	for _, opt := range []string{"noexec", "nosuid"} {
		if !strings.Contains(line, opt) {
			t.Errorf("target mount lacks %s: %s", opt, line)
		}
	}

	// The quota holds: 48 MiB do not fit in 32 MiB.
	if out, err := n.Exec("dd if=/dev/urandom of=" + target + "/big bs=1M count=48 2>&1; sync"); err == nil && !strings.Contains(out, "quota") && !strings.Contains(out, "space") {
		t.Errorf("writing past the quota succeeded: %s", out)
	}
	// Expanded online, it fits.
	resp, err := cl.ctl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 128 << 20}})
	if err != nil || resp.GetCapacityBytes() != 128<<20 || resp.GetNodeExpansionRequired() {
		t.Fatalf("expand: %v, %v", resp, err)
	}
	guesttest.Exec(t, n, "rm -f "+target+"/big; dd if=/dev/urandom of="+target+"/big bs=1M count=48 2>&1 && sync")
	nresp, err := cl.node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target})
	if err != nil || nresp.GetCapacityBytes() != 128<<20 {
		t.Errorf("node expand: %v, %v", nresp, err)
	}

	// Another volume cannot be staged where this one is.
	other := createVolume(t, cl, "other", 32<<20)
	_, err = cl.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: other, StagingTargetPath: staging, VolumeCapability: writer})
	wantCode(t, err, codes.AlreadyExists)
	// A mounted volume cannot be deleted; once unmounted it can.
	_, err = cl.ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("delete while mounted: %v, want FailedPrecondition", err)
	}
	cl.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
	cl.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	if _, err := cl.ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
}

// TestPromiseRecordsStayOffTheRoot: a node's promise records live in the
// shards beside the volumes, never on the root dataset, whose user
// properties every volume inherits (3000 records there make reading one
// property of a volume 19 times slower); a deletion removes its volume's
// record.
func TestPromiseRecordsStayOffTheRoot(t *testing.T) {
	c, cl := setup(t)
	n := c.Nodes[0]
	ctx := context.Background()
	kept, deleted := createVolume(t, cl, "kept", 64<<20), createVolume(t, cl, "deleted", 64<<20)
	if _, err := cl.ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: deleted}); err != nil {
		t.Fatal(err)
	}
	promiseProps := func(flags ...string) string {
		out := guesttest.Run(t, "zfs", append([]string{"get", "-H", "-o", "name,property,value"}, flags...)...)
		var found []string
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, copyrecord.PropPromisePrefix) {
				found = append(found, line)
			}
		}
		return strings.Join(found, "\n")
	}
	if got := promiseProps("-s", "local", "all", n.RootDataset); got != "" {
		t.Errorf("promise records on the root dataset:\n%s", got)
	}
	if got := promiseProps("-s", "inherited", "all", n.RootDataset+"/"+kept); got != "" {
		t.Errorf("the volume inherits promise records:\n%s", got)
	}
	shard := copyrecord.PromiseShard(n.RootDataset, kept)
	if got := strings.TrimSpace(guesttest.Run(t, "zfs", "get", "-H", "-o", "value", copyrecord.PropPromisePrefix+kept, shard)); got != "1 "+n.ID {
		t.Errorf("record of %s in %s = %q, want generation 1 to %s", kept, shard, got, n.ID)
	}
	if got := promiseProps("-s", "local", "-r", "all", n.RootDataset+"/"+copyrecord.PromisesDataset); strings.Contains(got, deleted) {
		t.Errorf("the deleted volume's record is left:\n%s", got)
	}
	if got := strings.TrimSpace(guesttest.Run(t, "zfs", "get", "-H", "-o", "value", "canmount,mountpoint", shard)); got != "off\nnone" {
		t.Errorf("shard %s: canmount, mountpoint = %q, want off and none", shard, got)
	}
}

// TestAnOwnerSecretKeepsAnotherTenantOut: on real ZFS, through the
// controller and node services, a volume created with an owner secret
// records the secret's digest (never the secret) on its dataset, and
// another tenant's create of the same name, stage and delete are refused
// and change nothing; its owner's go through.
func TestAnOwnerSecretKeepsAnotherTenantOut(t *testing.T) {
	c, cl := setup(t)
	n := c.Nodes[0]
	ctx := context.Background()
	const secret = "tenant-a-5f0c2e9b7d41"
	owner := map[string]string{contract.SecretOwner: secret}
	other := map[string]string{contract.SecretOwner: "tenant-b-0a7d3c1e8f26"}
	create := func(secrets map[string]string) (*csi.CreateVolumeResponse, error) {
		return cl.ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "data", Secrets: secrets,
			VolumeCapabilities: []*csi.VolumeCapability{writer}, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20}})
	}
	resp, err := create(owner)
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	recorded := guesttest.Run(t, "zfs", "get", "-H", "-o", "value", copyrecord.PropParameters, n.RootDataset+"/"+id)
	if !strings.Contains(recorded, contract.OwnerDigest(secret)) || strings.Contains(recorded, secret) {
		t.Errorf("recorded parameters %q: want the owner secret's digest and not the secret", recorded)
	}

	_, err = create(other)
	wantCode(t, err, codes.AlreadyExists)
	staging := filepath.Join(n.Dir, "staging")
	if err := os.MkdirAll(staging, 0o755); err != nil {
		t.Fatal(err)
	}
	stage := func(secrets map[string]string) error {
		_, err := cl.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: writer, Secrets: secrets})
		return err
	}
	wantCode(t, stage(other), codes.PermissionDenied)
	if out := guesttest.Exec(t, n, "grep -c ' "+staging+" ' /proc/self/mountinfo || true"); strings.TrimSpace(out) != "0" {
		t.Errorf("a refused stage mounted the volume: %s", out)
	}
	if err := stage(owner); err != nil {
		t.Fatalf("the owner's stage: %v", err)
	}
	if _, err := cl.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}

	_, err = cl.ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id, Secrets: other})
	wantCode(t, err, codes.PermissionDenied)
	if _, err := cl.ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id, Secrets: owner}); err != nil {
		t.Fatal(err)
	}
	if left, err := guestcluster.DatasetsLeft(n.RootDataset); err != nil || len(left) > 0 {
		t.Errorf("datasets left after the owner's delete: %v %v", left, err)
	}
}
