package csiserver

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	csinode "github.com/zfs-nomad/zfs-nomad/internal/node/csiserver"
	"github.com/zfs-nomad/zfs-nomad/internal/node/mount"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster/clustertest"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/migration"
	"github.com/zfs-nomad/zfs-nomad/internal/node/agent"
	"github.com/zfs-nomad/zfs-nomad/internal/node/volume"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfsfake"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
)

// costCluster is three real agents and node services over counting fakes,
// each node holding some volumes besides the ones an operation uses.
type costCluster struct {
	base  string // the nodes' mount base directory
	zfs   map[string]*zfsfake.Counting
	nodes map[string]*csinode.Node
	vols  map[string]*volume.Manager
	ctl   *Controller
}

func newCostCluster(t *testing.T) *costCluster {
	base := t.TempDir()
	cc := &costCluster{base: base, zfs: map[string]*zfsfake.Counting{}, nodes: map[string]*csinode.Node{}, vols: map[string]*volume.Manager{}}
	var agents clustertest.Agents
	for _, id := range []string{"n1", "n2", "n3"} {
		fake := zfsfake.New(1<<50, "tank")
		if err := fake.CreateFilesystem(context.Background(), "tank/nomad", nil); err != nil {
			t.Fatal(err)
		}
		z := &zfsfake.Counting{Interface: fake}
		cfg := config.DefaultNode()
		cfg.NodeID, cfg.RootDataset, cfg.MaxQuota, cfg.MountBaseDirs = id, "tank/nomad", 8<<30, []string{base}
		mgr := volume.NewManager(volume.Deps{ZFS: z, Config: cfg, Log: hclog.NewNullLogger()})
		agents.Serve(t, id+":7670", agent.NewServer(agent.Node{Volumes: mgr, Copies: mgr, Index: mgr.Index(), Records: mgr.Records(), Forcing: mgr.Fences()}, cfg, hclog.NewNullLogger()))
		cc.zfs[id], cc.vols[id] = z, mgr
		cc.nodes[id] = csinode.New(mgr, mount.NewFake(), cfg, hclog.NewNullLogger())
	}
	c := agents.Cluster(t)
	cc.ctl = New(c, migration.New(c, hclog.NewNullLogger()), "most-free", hclog.NewNullLogger())
	return cc
}

// fill gives every node n more volumes of its own, each with a snapshot.
func (cc *costCluster) fill(t *testing.T, n int) {
	for id, mgr := range cc.vols {
		for i := range n {
			name := fmt.Sprintf("fill-%s-%d-%d", id, n, i)
			v, err := mgr.Create(context.Background(), volume.CreateRequest{Name: name})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := mgr.CreateSnapshot(context.Background(), v.ID, name); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// work is what every node has asked of ZFS so far.
func (cc *costCluster) work() int64 {
	var sum int64
	for _, z := range cc.zfs {
		sum += z.Work()
	}
	return sum
}

// costOf runs op and returns the ZFS work it caused on all nodes.
func (cc *costCluster) costOf(t *testing.T, name string, op func() error) int64 {
	before := cc.work()
	if err := op(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return cc.work() - before
}

// TestCostFlatInTheNumberOfVolumes measures each call's ZFS work with 20
// and with 220 volumes (each with a snapshot) on every node of three, and
// fails when one grows with the count: a call that opens every volume
// costs seconds at a thousand.
func TestCostFlatInTheNumberOfVolumes(t *testing.T) {
	ctx := context.Background()
	cc := newCostCluster(t)
	counts := []int{20, 220}
	costs := map[string][]int64{}
	// The first listing of a node fills its indexes (one listing per
	// node, then one every few minutes at most): not a call's cost.
	cc.measure(t, ctx, -1)
	for round, n := range counts {
		cc.fill(t, n-cc.volumesOn("n1"))
		measured := cc.measure(t, ctx, round)
		for op, c := range measured {
			costs[op] = append(costs[op], c)
		}
	}
	ops := make([]string, 0, len(costs))
	for op := range costs {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	var table []string
	for _, op := range ops {
		c := costs[op]
		table = append(table, fmt.Sprintf("%-34s %6d %6d", op, c[0], c[1]))
		if c[1] > c[0] {
			t.Errorf("%s: ZFS work %d with %d volumes per node, %d with %d: it grows with the volumes", op, c[0], counts[0], c[1], counts[1])
		}
	}
	t.Logf("ZFS work per call, all nodes (calls plus datasets listed), with %d and %d volumes per node:\n%s", counts[0], counts[1], strings.Join(table, "\n"))
}

// holder is the node that holds volume id.
func (cc *costCluster) holder(id string) string {
	for node, mgr := range cc.vols {
		if _, err := mgr.Get(context.Background(), id); err == nil {
			return node
		}
	}
	return ""
}

func (cc *costCluster) volumesOn(node string) int {
	vols, _ := cc.vols[node].List(context.Background())
	return len(vols)
}

// measure runs one of each call on volumes made for the round and returns
// each one's cost.
func (cc *costCluster) measure(t *testing.T, ctx context.Context, round int) map[string]int64 {
	out := map[string]int64{}
	name := fmt.Sprintf("cost-%d", round+1)
	var vol *csi.Volume
	out["CreateVolume"] = cc.costOf(t, "CreateVolume", func() error {
		resp, err := cc.ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: mountCap})
		vol = resp.GetVolume()
		return err
	})
	id := vol.GetVolumeId()
	node := cc.holder(id)
	var publishContext map[string]string
	publish := func() error {
		resp, err := cc.ctl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: node, VolumeCapability: mountCap[0]})
		publishContext = resp.GetPublishContext()
		return err
	}
	out["ControllerPublishVolume"] = cc.costOf(t, "ControllerPublishVolume", publish)
	out["ControllerPublishVolume again"] = cc.costOf(t, "ControllerPublishVolume again", publish)
	staging := filepath.Join(cc.base, name)
	out["NodeStageVolume"] = cc.costOf(t, "NodeStageVolume", func() error {
		_, err := cc.nodes[node].NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
			VolumeCapability: mountCap[0], PublishContext: publishContext})
		return err
	})
	out["ControllerGetVolume"] = cc.costOf(t, "ControllerGetVolume", func() error {
		_, err := cc.ctl.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: id})
		return err
	})
	out["ValidateVolumeCapabilities"] = cc.costOf(t, "ValidateVolumeCapabilities", func() error {
		_, err := cc.ctl.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: mountCap})
		return err
	})
	out["ControllerExpandVolume"] = cc.costOf(t, "ControllerExpandVolume", func() error {
		_, err := cc.ctl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 30}})
		return err
	})
	var snapID string
	out["CreateSnapshot"] = cc.costOf(t, "CreateSnapshot", func() error {
		resp, err := cc.ctl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{SourceVolumeId: id, Name: name + "-snap"})
		snapID = resp.GetSnapshot().GetSnapshotId()
		return err
	})
	out["DeleteSnapshot"] = cc.costOf(t, "DeleteSnapshot", func() error {
		_, err := cc.ctl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snapID})
		return err
	})
	out["GetCapacity"] = cc.costOf(t, "GetCapacity", func() error {
		_, err := cc.ctl.GetCapacity(ctx, &csi.GetCapacityRequest{})
		return err
	})
	out["ListVolumes (a page of 10)"] = cc.costOf(t, "ListVolumes", func() error {
		_, err := cc.ctl.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: 10})
		return err
	})
	out["ListSnapshots (a page of 10)"] = cc.costOf(t, "ListSnapshots", func() error {
		_, err := cc.ctl.ListSnapshots(ctx, &csi.ListSnapshotsRequest{MaxEntries: 10})
		return err
	})
	out["ListSnapshots (of one volume)"] = cc.costOf(t, "ListSnapshots of one volume", func() error {
		_, err := cc.ctl.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SourceVolumeId: id})
		return err
	})
	out["NodeUnstageVolume"] = cc.costOf(t, "NodeUnstageVolume", func() error {
		_, err := cc.nodes[node].NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		return err
	})
	out["ControllerUnpublishVolume"] = cc.costOf(t, "ControllerUnpublishVolume", func() error {
		_, err := cc.ctl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: node})
		cc.ctl.migrator.WaitFlushes() // its flush to the replicas counts with it
		return err
	})
	out["DeleteVolume"] = cc.costOf(t, "DeleteVolume", func() error {
		_, err := cc.ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
		return err
	})
	return out
}
