package csiserver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster/clustertest"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/migration"
	"github.com/zfs-nomad/zfs-nomad/internal/node/agent"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/lease"
	"github.com/zfs-nomad/zfs-nomad/internal/node/volume"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfsfake"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// testCluster runs real agent servers over fake ZFS, in memory.
type testCluster struct {
	t       *testing.T
	agents  clustertest.Agents
	fakes   map[string]*zfsfake.Fake
	servers map[string]*agent.Server
}

// newTestCluster starts one agent per node; free gives each node's pool size.
func newTestCluster(t *testing.T, free map[string]uint64) *testCluster {
	tc := &testCluster{t: t, fakes: map[string]*zfsfake.Fake{}, servers: map[string]*agent.Server{}}
	for id, size := range free {
		fake := zfsfake.New(size, "tank")
		if err := fake.CreateFilesystem(context.Background(), "tank/nomad", nil); err != nil {
			t.Fatal(err)
		}
		cfg := config.DefaultNode()
		cfg.NodeID, cfg.RootDataset, cfg.MaxQuota = id, "tank/nomad", 8<<30
		mgr := volume.NewManager(volume.Deps{ZFS: fake, Config: cfg, Log: hclog.NewNullLogger()})
		if err := mgr.Records().CheckLegacyPromises(context.Background()); err != nil {
			t.Fatal(err)
		}
		srv := agent.NewServer(agent.Node{Volumes: mgr, Copies: mgr, Index: mgr.Index(), Records: mgr.Records(), Forcing: mgr.Fences()}, cfg, hclog.NewNullLogger())
		tc.agents.Serve(t, id+":7670", srv)
		tc.fakes[id], tc.servers[id] = fake, srv
	}
	return tc
}

// stop takes a node's agent down.
func (tc *testCluster) stop(id string) { tc.agents.Stop(id + ":7670") }

func (tc *testCluster) controller() *Controller {
	c := tc.agents.Cluster(tc.t)
	return New(c, migration.New(c, hclog.NewNullLogger()), "most-free", hclog.NewNullLogger())
}

var mountCap = []*csi.VolumeCapability{{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}}

func wantCode(t *testing.T, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got %v (%v), want %v", status.Code(err), err, code)
	}
}

func TestControllerPlacesAndIsStateless(t *testing.T) {
	tc := newTestCluster(t, map[string]uint64{"n1": 4 << 30, "n2": 8 << 30})
	ctx := context.Background()
	ctl := tc.controller()

	resp, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "v", VolumeCapabilities: mountCap,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetVolume().GetVolumeContext()[config.TopologyNodeKey]; got != "n2" {
		t.Errorf("placed on %s, want n2 (most free)", got)
	}
	// Topology requirement wins over free space.
	resp2, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "w", VolumeCapabilities: mountCap,
		AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: map[string]string{config.TopologyNodeKey: "n1"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp2.GetVolume().GetVolumeContext()[config.TopologyNodeKey]; got != "n1" {
		t.Errorf("placed on %s, want n1 (requisite)", got)
	}

	// A new controller (a restart) sees the same volumes and answers a
	// repeated create with the same volume, even on the other node.
	ctl2 := tc.controller()
	again, err := ctl2.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "w", VolumeCapabilities: mountCap})
	if err != nil || again.GetVolume().GetVolumeId() != resp2.GetVolume().GetVolumeId() {
		t.Fatalf("repeated create after restart: %v, %v", again, err)
	}
	list, err := ctl2.ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil || len(list.GetEntries()) != 2 {
		t.Fatalf("ListVolumes after restart: %v, %v", list, err)
	}

	// A snapshot restore lands on the snapshot's node.
	snap, err := ctl2.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: resp.GetVolume().GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	restored, err := ctl2.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "r", VolumeCapabilities: mountCap,
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := restored.GetVolume().GetVolumeContext()[config.TopologyNodeKey]; got != "n2" {
		t.Errorf("restore placed on %s, want n2 (the snapshot's node)", got)
	}
}

func TestControllerErrorCodes(t *testing.T) {
	tc := newTestCluster(t, map[string]uint64{"n1": 4 << 30})
	ctx := context.Background()
	ctl := tc.controller()
	block := []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: mountCap[0].AccessMode}}

	_, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{VolumeCapabilities: mountCap})
	wantCode(t, err, codes.InvalidArgument)
	_, err = ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "b", VolumeCapabilities: block})
	wantCode(t, err, codes.InvalidArgument)
	_, err = ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "big", VolumeCapabilities: mountCap, CapacityRange: &csi.CapacityRange{RequiredBytes: 9 << 30}})
	wantCode(t, err, codes.OutOfRange)
	_, err = ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "p", VolumeCapabilities: mountCap, Parameters: map[string]string{"mountpoint": "/"}})
	wantCode(t, err, codes.InvalidArgument)
	_, err = ctl.ListVolumes(ctx, &csi.ListVolumesRequest{StartingToken: "bogus"})
	wantCode(t, err, codes.Aborted)
	_, err = ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{})
	wantCode(t, err, codes.InvalidArgument)
	_, err = ctl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: contract.VolumeIDForName("none"), CapacityRange: &csi.CapacityRange{RequiredBytes: 1}})
	wantCode(t, err, codes.NotFound)
	_, err = ctl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: contract.VolumeIDForName("none")})
	wantCode(t, err, codes.NotFound)
}

func TestControllerNeverGuessesNotFoundWhenANodeIsDown(t *testing.T) {
	tc := newTestCluster(t, map[string]uint64{"n1": 4 << 30, "n2": 4 << 30})
	ctx := context.Background()
	ctl := tc.controller()
	resp, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "v", VolumeCapabilities: mountCap, Parameters: map[string]string{"node": "n2"}})
	if err != nil {
		t.Fatal(err)
	}
	tc.stop("n2")
	_, err = ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: resp.GetVolume().GetVolumeId()})
	wantCode(t, err, codes.Unavailable)
	// A volume that no node holds is still reported deleted only if all answer.
	_, err = ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: contract.VolumeIDForName("other")})
	wantCode(t, err, codes.Unavailable)
	// Malformed IDs name no volume anywhere.
	_, err = ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "garbage"})
	wantCode(t, err, codes.OK)
	// A new volume needs a majority to promise its first generation: with
	// one of two nodes down there is none (docs/safety.md, "Generations").
	_, err = ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "x", VolumeCapabilities: mountCap})
	wantCode(t, err, codes.Unavailable)
}

// A create whose answer was lost, retried while its node is down, must not
// make a second volume elsewhere: generation 1 was promised to the first
// node, so the retry waits for it (found by the fault-injection
// simulation, seed 5). With three nodes, one down, new volumes still go
// to the others.
func TestCreateRetriedWhileItsNodeIsDownWaitsForIt(t *testing.T) {
	tc := newTestCluster(t, map[string]uint64{"n1": 4 << 30, "n2": 8 << 30, "n3": 2 << 30})
	ctx := context.Background()
	ctl := tc.controller()
	req := &csi.CreateVolumeRequest{Name: "v", VolumeCapabilities: mountCap}
	first, err := ctl.CreateVolume(ctx, req)
	if err != nil || first.GetVolume().GetVolumeContext()[config.TopologyNodeKey] != "n2" {
		t.Fatalf("first create: %v, %v (want it on n2, the most free)", first, err)
	}
	tc.stop("n2") // as if its answer had been lost, and then the node
	_, err = ctl.CreateVolume(ctx, req)
	wantCode(t, err, codes.Unavailable)
	for id, fake := range tc.fakes {
		if id != "n2" && slices.Contains(fake.Names(), "tank/nomad/"+contract.VolumeIDForName("v")) {
			t.Fatalf("the retried create made a second volume on %s", id)
		}
	}
	other, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "w", VolumeCapabilities: mountCap})
	if err != nil || other.GetVolume().GetVolumeContext()[config.TopologyNodeKey] == "n2" {
		t.Fatalf("create with n2 down: %v, %v", other, err)
	}
}

func TestControllerSerialisesOneVolume(t *testing.T) {
	tc := newTestCluster(t, map[string]uint64{"n1": 4 << 30})
	ctl := tc.controller()
	unlock, err := ctl.tryLock(contract.VolumeIDForName("busy"))
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	_, err = ctl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "busy", VolumeCapabilities: mountCap})
	wantCode(t, err, codes.Aborted)
}

// A migratable volume advertises its replication domain, a pinned one its
// node; ControllerPublishVolume answers with the generation where the
// primary is, refuses to move a pinned volume, and knows no strangers.
func TestControllerPublishDecisions(t *testing.T) {
	tc := newTestCluster(t, map[string]uint64{"n1": 8 << 30, "n2": 4 << 30})
	ctx := context.Background()
	ctl := tc.controller()
	create := func(name string, params map[string]string) *csi.Volume {
		t.Helper()
		resp, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: mountCap, Parameters: params})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetVolume()
	}
	moving := create("moving", map[string]string{"node": "n1"})
	pinned := create("pinned", map[string]string{"node": "n1", "pinned": "true"})
	tests := []struct {
		name string
		v    *csi.Volume
		want map[string]string
	}{
		{"migratable", moving, map[string]string{config.TopologyDomainKey: config.DefaultDomain}},
		{"pinned", pinned, map[string]string{config.TopologyNodeKey: "n1", config.TopologyDomainKey: config.DefaultDomain}},
	}
	for _, tt := range tests {
		if got := tt.v.GetAccessibleTopology()[0].GetSegments(); fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("%s volume: topology %v, want %v", tt.name, got, tt.want)
		}
	}

	publish := func(id, node string) (*csi.ControllerPublishVolumeResponse, error) {
		return ctl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: node, VolumeCapability: mountCap[0]})
	}
	resp, err := publish(moving.GetVolumeId(), "n1")
	if err != nil || resp.GetPublishContext()["generation"] != "1" {
		t.Fatalf("publish where the primary is: %v, %v", resp, err)
	}
	_, err = publish(pinned.GetVolumeId(), "n2")
	wantCode(t, err, codes.FailedPrecondition)
	_, err = publish(moving.GetVolumeId(), "n9")
	wantCode(t, err, codes.NotFound)
	_, err = publish(contract.VolumeIDForName("nothing"), "n1")
	wantCode(t, err, codes.NotFound)
	_, err = publish("", "n1")
	wantCode(t, err, codes.InvalidArgument)
	if _, err := ctl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: moving.GetVolumeId(), NodeId: "n1"}); err != nil {
		t.Fatal(err)
	}
}

// copyOf labels a dataset on a node's fake as a copy of volume id.
func (tc *testCluster) copyOf(node, id, role string, generation int) string {
	tc.t.Helper()
	ds := "tank/nomad/" + id
	props := map[string]string{copyrecord.PropVolumeID: id, copyrecord.PropRole: role, copyrecord.PropName: "v",
		copyrecord.PropGeneration: fmt.Sprint(generation), "mountpoint": "legacy"}
	if err := tc.fakes[node].CreateFilesystem(context.Background(), ds, props); err != nil {
		tc.t.Fatal(err)
	}
	return ds
}

// TestDeleteNeverLeavesACopyBehind: DeleteVolume answers OK only when no
// copy of the volume can remain; with a node down it touches nothing and
// answers Unavailable naming the node; an older primary is set aside, not
// destroyed.
func TestDeleteNeverLeavesACopyBehind(t *testing.T) {
	ctx := context.Background()
	id := contract.VolumeIDForName("v")

	t.Run("a node that may hold a copy is down", func(t *testing.T) {
		tc := newTestCluster(t, map[string]uint64{"n1": 4 << 30, "n2": 4 << 30})
		primary := tc.copyOf("n1", id, contract.RolePrimary, 2)
		tc.copyOf("n2", id, contract.RoleReplica, 2)
		ctl := tc.controller()
		tc.stop("n2")
		_, err := ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
		wantCode(t, err, codes.Unavailable)
		if !strings.Contains(status.Convert(err).Message(), "n2") {
			t.Errorf("the refusal does not name the node: %v", err)
		}
		if _, err := tc.fakes["n1"].Get(ctx, primary); err != nil {
			t.Errorf("the primary on n1 is gone although the delete was refused: %v", err)
		}
	})

	t.Run("an older primary is set aside", func(t *testing.T) {
		tc := newTestCluster(t, map[string]uint64{"n1": 4 << 30, "n2": 4 << 30, "n3": 4 << 30})
		stale := tc.copyOf("n1", id, contract.RolePrimary, 1)
		current := tc.copyOf("n2", id, contract.RolePrimary, 2)
		replica := tc.copyOf("n3", id, contract.RoleReplica, 2)
		ctl := tc.controller()
		if _, err := ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatal(err)
		}
		if _, err := tc.fakes["n2"].Get(ctx, current); err == nil {
			t.Error("the newest primary is still there")
		}
		if _, err := tc.fakes["n1"].Get(ctx, stale); err == nil {
			t.Error("the older primary still holds the volume's name")
		}
		aside := false
		for _, name := range tc.fakes["n1"].Names() {
			aside = aside || strings.HasPrefix(name, stale+"-aside-")
		}
		if !aside {
			t.Errorf("the older primary was destroyed instead of set aside: n1 holds %v", tc.fakes["n1"].Names())
		}
		_ = replica // n3's replica is removed by its receiver, which this in-memory cluster has not
	})
}

// promise records on a node's fake that it promised generation gen of
// volume id to holder (as Reserve does).
func (tc *testCluster) promise(node, id string, gen int, holder string) {
	tc.t.Helper()
	ctx, fake := context.Background(), tc.fakes[node]
	shard := copyrecord.PromiseShard("tank/nomad", id)
	for _, ds := range []string{zfs.Parent(shard), shard} {
		if err := fake.CreateFilesystem(ctx, ds, nil); err != nil && !errors.Is(err, zfs.ErrExists) {
			tc.t.Fatal(err)
		}
	}
	if err := fake.SetProperties(ctx, shard, map[string]string{copyrecord.PropPromisePrefix + id: fmt.Sprintf("%d %s", gen, holder)}); err != nil {
		tc.t.Fatal(err)
	}
}

// TestPublishDecidesOnlyFromAMajority: every generation is promised by a
// majority before it is used, so a majority of answers shows it even when
// the node holding it is down.
func TestPublishDecidesOnlyFromAMajority(t *testing.T) {
	ctx := context.Background()
	id := contract.VolumeIDForName("v")
	publish := func(ctl *Controller, node string) (*csi.ControllerPublishVolumeResponse, error) {
		return ctl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: node, VolumeCapability: mountCap[0]})
	}

	t.Run("a stale primary is not published while the newer one's node is down", func(t *testing.T) {
		tc := newTestCluster(t, map[string]uint64{"n1": 4 << 30, "n2": 4 << 30, "n3": 4 << 30})
		tc.copyOf("n1", id, contract.RolePrimary, 1) // came back from a partition
		tc.copyOf("n2", id, contract.RoleReplica, 2)
		tc.copyOf("n3", id, contract.RolePrimary, 2) // promoted by the failover
		tc.promise("n2", id, 2, "n3")
		tc.promise("n3", id, 2, "n3")
		ctl := tc.controller()
		tc.stop("n3")
		resp, err := publish(ctl, "n1")
		wantCode(t, err, codes.Unavailable)
		if !strings.Contains(status.Convert(err).Message(), "n3") {
			t.Errorf("the refusal does not name the node that holds the newer generation: %v", err)
		}
		_ = resp
	})

	t.Run("a promise whose holder answered without the copy is void", func(t *testing.T) {
		tc := newTestCluster(t, map[string]uint64{"n1": 4 << 30, "n2": 4 << 30, "n3": 4 << 30})
		tc.copyOf("n1", id, contract.RolePrimary, 1)
		tc.promise("n2", id, 2, "n3") // a promotion to n3 that never happened
		ctl := tc.controller()
		resp, err := publish(ctl, "n1")
		if err != nil || resp.GetPublishContext()["generation"] != "1" {
			t.Fatalf("publish where the only primary is: %v, %v", resp, err)
		}
	})

	t.Run("a failover never reuses a generation given to a node that is down", func(t *testing.T) {
		nodes := map[string]uint64{"n1": 4 << 30, "n2": 4 << 30, "n3": 4 << 30, "n4": 4 << 30, "n5": 4 << 30}
		tc := newTestCluster(t, nodes)
		tc.copyOf("n1", id, contract.RolePrimary, 1) // the lost primary
		tc.copyOf("n2", id, contract.RolePrimary, 2) // promoted, though the controller timed out
		replica := tc.copyOf("n3", id, contract.RoleReplica, 1)
		for _, n := range []string{"n2", "n3", "n4"} {
			tc.promise(n, id, 2, "n2")
		}
		if err := tc.fakes["n3"].SetProperties(ctx, replica, map[string]string{copyrecord.PropParameters: `{"failover":"auto"}`}); err != nil {
			t.Fatal(err)
		}
		ctl := tc.controller()
		tc.stop("n1")
		tc.stop("n2")
		resp, err := publish(ctl, "n3")
		if err != nil {
			t.Fatal(err)
		}
		if gen := resp.GetPublishContext()["generation"]; gen != "3" {
			t.Errorf("the failover promoted n3 to generation %s, want 3: generation 2 is n2's", gen)
		}
	})

	t.Run("a failover waits until a majority attests the lost node's silence", func(t *testing.T) {
		tc := newTestCluster(t, map[string]uint64{"n1": 4 << 30, "n2": 4 << 30, "n3": 4 << 30})
		tc.copyOf("n1", id, contract.RolePrimary, 1)
		replica := tc.copyOf("n2", id, contract.RoleReplica, 1)
		if err := tc.fakes["n2"].SetProperties(ctx, replica, map[string]string{copyrecord.PropParameters: `{"failover":"auto"}`}); err != nil {
			t.Fatal(err)
		}
		silent := false
		var mu sync.Mutex // n2 and n3 are asked at once
		var asked, answering []string
		for _, n := range []string{"n2", "n3"} {
			tc.servers[n].AttestSilence = func(addrs, answered []string) error {
				mu.Lock()
				defer mu.Unlock()
				asked, answering = addrs, answered
				if !silent {
					return errors.New(addrs[0] + " answered this node 3s ago")
				}
				return nil
			}
		}
		ctl := tc.controller()
		tc.stop("n1")
		_, err := publish(ctl, "n2")
		wantCode(t, err, codes.Unavailable)
		mu.Lock()
		askedAbout, answeringSent := asked, answering
		mu.Unlock()
		if !slices.Equal(answeringSent, []string{"n2", "n3"}) {
			t.Errorf("the reservation named %v as answering, want n2 and n3: the nodes attest the silence of every other peer they know", answeringSent)
		}
		if !strings.Contains(status.Convert(err).Message(), "n1:7670 answered") || len(askedAbout) != 1 || !strings.HasSuffix(askedAbout[0], "n1:7670") {
			t.Errorf("the refusal: %v (nodes asked about %v); want it to name n1:7670, the node lost", err, askedAbout)
		}
		if c, _ := tc.fakes["n2"].Get(ctx, replica); c.User[copyrecord.PropRole] != contract.RoleReplica {
			t.Fatalf("n2's replica was promoted although no majority attested n1's silence: %v", c.User)
		}
		mu.Lock()
		silent = true
		mu.Unlock()
		resp, err := publish(ctl, "n2")
		if err != nil || resp.GetPublishContext()["generation"] != "2" {
			t.Fatalf("the failover once n1 was silent long enough: %v, %v", resp, err)
		}
	})

	// G1: nodes without peers keep no lease, so the lost primary's node
	// never makes its copy read-only, and a failover granted at once
	// would leave two writers. They refuse the controller's automatic
	// failover and grant the operator's promotion.
	t.Run("nodes without peers refuse an automatic failover and grant the operator's", func(t *testing.T) {
		tc := newTestCluster(t, map[string]uint64{"n1": 4 << 30, "n2": 4 << 30, "n3": 4 << 30})
		tc.copyOf("n1", id, contract.RolePrimary, 1)
		replica := tc.copyOf("n2", id, contract.RoleReplica, 1)
		if err := tc.fakes["n2"].SetProperties(ctx, replica, map[string]string{copyrecord.PropParameters: `{"failover":"auto"}`}); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"n1", "n2", "n3"} {
			monitor := lease.NewMonitor(10*time.Second, time.Now) // no peers configured
			tc.servers[n].AttestSilence = func(addrs, answering []string) error {
				return monitor.AttestFailover(n, addrs, answering, 15*time.Second)
			}
		}
		ctl := tc.controller()
		tc.stop("n1")
		_, err := publish(ctl, "n2")
		wantCode(t, err, codes.Unavailable)
		if msg := status.Convert(err).Message(); !strings.Contains(msg, "no peers configured") || !strings.Contains(msg, "n1:7670") || !strings.Contains(msg, "zfs-controller promote") {
			t.Errorf("the refusal: %q; want it to say the nodes keep no lease, name n1:7670 and point to zfs-controller promote", msg)
		}
		if c, _ := tc.fakes["n2"].Get(ctx, replica); c.User[copyrecord.PropRole] != contract.RoleReplica {
			t.Fatalf("n2's replica was promoted by an automatic failover on nodes without leases: %v", c.User)
		}
		m := migration.New(tc.agents.Cluster(t), hclog.NewNullLogger())
		c, err := m.Promote(ctx, id, "n2", false)
		if err != nil || c.Generation != 2 || c.ForcedGeneration != 0 {
			t.Fatalf("the operator's promote on nodes without peers: %+v, %v; want generation 2, not forced", c, err)
		}
	})

	t.Run("a publish that finds a copy fenced by its lease current lifts it", func(t *testing.T) {
		tc := newTestCluster(t, map[string]uint64{"n1": 4 << 30, "n2": 4 << 30, "n3": 4 << 30})
		primary := tc.copyOf("n1", id, contract.RolePrimary, 1)
		if err := tc.fakes["n1"].SetProperties(ctx, primary, map[string]string{"readonly": "on", copyrecord.PropLeaseFenced: "1700000000000000000"}); err != nil {
			t.Fatal(err)
		}
		tc.promise("n2", id, 2, "n3") // an interrupted failover: n3 answers without the copy
		ctl := tc.controller()
		resp, err := publish(ctl, "n1")
		if err != nil || resp.GetPublishContext()["generation"] != "1" {
			t.Fatalf("publish: %v, %v", resp, err)
		}
		if ro, mark := tc.fakes["n1"].NativeProperty(primary, "readonly"), tc.fakes["n1"].NativeProperty(primary, copyrecord.PropLeaseFenced); ro != "off" {
			t.Errorf("after the publish the copy is readonly=%s (%s=%s), want writable", ro, copyrecord.PropLeaseFenced, mark)
		}
	})

	t.Run("the operator's forced promotion is published without a majority", func(t *testing.T) {
		tc := newTestCluster(t, map[string]uint64{"n1": 4 << 30, "n2": 4 << 30, "n3": 4 << 30})
		tc.copyOf("n1", id, contract.RolePrimary, 1)
		tc.copyOf("n3", id, contract.RoleReplica, 1)
		ctl := tc.controller()
		tc.stop("n1")
		tc.stop("n2")
		m := migration.New(tc.agents.Cluster(t), hclog.NewNullLogger())
		_, err := m.Promote(ctx, id, "n3", false)
		if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "-force") {
			t.Fatalf("promote without a majority: %v, want Unavailable pointing to -force", err)
		}
		c, err := m.Promote(ctx, id, "n3", true)
		if err != nil || c.Generation != 2 || c.ForcedGeneration != 2 {
			t.Fatalf("forced promote: %+v, %v", c, err)
		}
		resp, err := publish(ctl, "n3")
		if err != nil || resp.GetPublishContext()["generation"] != "2" {
			t.Fatalf("publish of the forced primary: %v, %v", resp, err)
		}
		_, err = publish(ctl, "n2")
		wantCode(t, err, codes.Unavailable) // a move still needs a majority
	})

	t.Run("no decision without a majority", func(t *testing.T) {
		tc := newTestCluster(t, map[string]uint64{"n1": 4 << 30, "n2": 4 << 30, "n3": 4 << 30})
		tc.copyOf("n1", id, contract.RolePrimary, 1)
		ctl := tc.controller()
		tc.stop("n2")
		tc.stop("n3")
		_, err := publish(ctl, "n1")
		wantCode(t, err, codes.Unavailable)
	})
}

// staleView is three nodes after a failover: n1 holds a stale primary of
// generation 1, n3 the primary of generation 2 (promised by n2 and n3),
// and n3 is down, so a majority answers but the newest copy does not.
// It returns n1's stale dataset.
func staleView(t *testing.T, id string) (*testCluster, *Controller, string) {
	tc := newTestCluster(t, map[string]uint64{"n1": 4 << 30, "n2": 4 << 30, "n3": 4 << 30})
	stale := tc.copyOf("n1", id, contract.RolePrimary, 1)
	tc.copyOf("n2", id, contract.RoleReplica, 2)
	tc.copyOf("n3", id, contract.RolePrimary, 2)
	tc.promise("n2", id, 2, "n3")
	tc.promise("n3", id, 2, "n3")
	ctl := tc.controller()
	tc.stop("n3")
	return tc, ctl, stale
}

// TestSnapshotsComeOnlyFromTheCurrentPrimary: a snapshot of a stale
// primary, taken while the newest one's node is down, would let a restore
// bring back stale data. CreateSnapshot first looks its name up on every
// node, which needs every node to answer: with one down it is Unavailable
// before any copy is chosen (docs/safety.md, "Generations").
func TestSnapshotsComeOnlyFromTheCurrentPrimary(t *testing.T) {
	ctx := context.Background()
	id := contract.VolumeIDForName("v")
	tc, ctl, stale := staleView(t, id)
	_, err := ctl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: id})
	wantCode(t, err, codes.Unavailable)
	for _, name := range tc.fakes["n1"].Names() {
		if strings.HasPrefix(name, stale+"@") {
			t.Errorf("a snapshot was taken of the stale primary: %s", name)
		}
	}
}

// TestNothingActsOnAStaleCopy (G8): the newest primary's node is down and
// a majority answers; the stale primary on n1 is neither reported as the
// volume, nor expanded, nor cloned: each answers Unavailable naming the
// silent node, as a publish does.
func TestNothingActsOnAStaleCopy(t *testing.T) {
	ctx := context.Background()
	id := contract.VolumeIDForName("v")
	tc, ctl, stale := staleView(t, id)
	quota := func() uint64 {
		ds, err := tc.fakes["n1"].Get(ctx, stale)
		if err != nil {
			t.Fatal(err)
		}
		return ds.RefQuota
	}
	before := quota()

	_, err := ctl.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: id})
	wantCode(t, err, codes.Unavailable)
	if !strings.Contains(status.Convert(err).Message(), "node n3") {
		t.Errorf("the error does not name the silent node: %v", err)
	}
	_, err = ctl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 3 << 30}})
	wantCode(t, err, codes.Unavailable)
	if after := quota(); after != before {
		t.Errorf("the stale primary's quota changed from %d to %d", before, after)
	}
	_, err = ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "clone", VolumeCapabilities: mountCap,
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}})
	wantCode(t, err, codes.Unavailable)
}

// oneBackup is a backup target holding one backup, which it would grant.
type oneBackup struct{ b agentclient.Backup }

func (o oneBackup) Names() []string { return []string{o.b.Target} }

func (o oneBackup) Backups(context.Context, string, string) ([]agentclient.Backup, error) {
	return []agentclient.Backup{o.b}, nil
}

func (o oneBackup) Backup(context.Context, contract.BackupRef) (agentclient.Backup, error) {
	return o.b, nil
}

func (o oneBackup) GrantRestore(context.Context, contract.BackupRef, string) (string, error) {
	return "grant", nil
}

// TestBackupsReachJobSubmittersOnlyWhereTheOperatorAllows: without
// backups_as_snapshots, CSI neither lists a backup nor restores one; with
// it, ListSnapshots lists it; a backup is never deleted through CSI.
func TestBackupsReachJobSubmittersOnlyWhereTheOperatorAllows(t *testing.T) {
	tc := newTestCluster(t, map[string]uint64{"n1": 4 << 30})
	ctx := context.Background()
	b := oneBackup{agentclient.Backup{Target: "vault", VolumeID: contract.VolumeIDForName("gone"), Snapshot: "zn-1", Received: time.Unix(1796294546, 0)}}
	id := b.b.Ref().SnapshotID()
	fromBackup := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
	listed := func(ctl *Controller) []string {
		resp, err := ctl.ListSnapshots(ctx, &csi.ListSnapshotsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, e := range resp.GetEntries() {
			ids = append(ids, e.GetSnapshot().GetSnapshotId())
		}
		return ids
	}
	for _, asSnapshots := range []bool{false, true} {
		ctl := tc.controller()
		ctl.UseTargets(b, asSnapshots)
		if got := listed(ctl); slices.Contains(got, id) != asSnapshots {
			t.Errorf("backups_as_snapshots %v: ListSnapshots answers %v", asSnapshots, got)
		}
		_, err := ctl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: id})
		wantCode(t, err, codes.FailedPrecondition)
		if !asSnapshots {
			_, err = ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "back", VolumeCapabilities: mountCap, VolumeContentSource: fromBackup})
			wantCode(t, err, codes.InvalidArgument)
			if vols, err := ctl.ListVolumes(ctx, &csi.ListVolumesRequest{}); err != nil || len(vols.GetEntries()) > 0 {
				t.Errorf("a refused restore left volumes: %v, %v", vols, err)
			}
		}
	}
}
