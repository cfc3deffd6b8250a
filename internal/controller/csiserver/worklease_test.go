package csiserver

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/worklease"
)

// TestOneControllerInstanceHoldsTheWorkLease runs two controller
// instances' holders against real agent servers over gRPC: one holds the
// work lease, every node names it to the other and lists both, and the
// other takes over once the holder releases it (the grants' running out
// is TestGrants's).
func TestOneControllerInstanceHoldsTheWorkLease(t *testing.T) {
	tc := newTestCluster(t, map[string]uint64{"n1": 4 << 30, "n2": 4 << 30, "n3": 4 << 30})
	for _, srv := range tc.servers {
		srv.WorkLease = worklease.NewGrantsAtOnce(time.Now)
	}
	ctx := context.Background()
	holder := func(id string) *worklease.Holder {
		c := tc.agents.Cluster(t)
		return worklease.NewHolder(worklease.Instance{ID: id, Host: "host-" + id, Address: "10.0.0.1:9100", Started: time.Now(), NomadAlloc: "alloc-" + id},
			cluster.WorkLeaseAsker(c), hclog.NewNullLogger())
	}
	a, b := holder("ctl-a"), holder("ctl-b")
	a.Try(ctx)
	b.Try(ctx)
	if _, ok := a.Held(); !ok {
		t.Fatal("the first instance to ask does not hold the lease")
	}
	if _, ok := b.Held(); ok {
		t.Fatal("both instances hold the lease")
	}
	l, _, err := tc.agents.Cluster(t).Nodes(ctx)
	if err != nil || len(l) != 3 {
		t.Fatalf("nodes: %v %v", l, err)
	}
	for _, n := range l {
		got, err := n.Agent.WorkLeases(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got.Holder.ID != "ctl-a" || got.Holder.Host != "host-ctl-a" || got.Holder.Address != "10.0.0.1:9100" || got.Holder.NomadAlloc != "alloc-ctl-a" || got.HolderSince.IsZero() || len(got.Seen) != 2 {
			t.Fatalf("node %s tells %+v", n.Info.NodeID, got)
		}
	}

	a.Release()
	b.Try(ctx)
	if _, ok := b.Held(); !ok {
		t.Fatal("the other instance did not take over after a release")
	}

	// With a node down, the other two still make a majority.
	tc.stop("n3")
	b.Try(ctx)
	if _, ok := b.Held(); !ok {
		t.Fatal("two of three nodes renewed, yet not held")
	}
	a.Try(ctx)
	if _, ok := a.Held(); ok {
		t.Fatal("both instances hold the lease")
	}
}

// TestTwoInstancesCreateOneVolume: creates of one name sent to two
// controller instances at once, each preferring another node, make one
// volume: the first generation is promised by a majority first, so the
// second instance finds the first's volume, or is refused retryably and
// finds it on its retry.
func TestTwoInstancesCreateOneVolume(t *testing.T) {
	tc := newTestCluster(t, map[string]uint64{"n1": 8 << 30, "n2": 8 << 30, "n3": 8 << 30})
	a, b := tc.controller(), tc.controller()
	ctx := context.Background()
	for i := range 20 {
		name := fmt.Sprintf("shared-%d", i)
		ids := make([]string, 2)
		var wg sync.WaitGroup
		for j, ctl := range []*Controller{a, b} {
			prefer := &csi.TopologyRequirement{Preferred: []*csi.Topology{{Segments: map[string]string{config.TopologyNodeKey: fmt.Sprintf("n%d", j+1)}}}}
			wg.Add(1)
			go func() {
				defer wg.Done()
				var last error
				for try := 0; try < 50; try++ {
					resp, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: mountCap,
						CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}, AccessibilityRequirements: prefer})
					if err == nil {
						ids[j] = resp.GetVolume().GetVolumeId()
						return
					}
					if !errdefs.Temporary(err) {
						t.Errorf("create %s: %v", name, err)
						return
					}
					last = err
					time.Sleep(10 * time.Millisecond)
				}
				t.Errorf("create %s: still refused after 50 tries: %v", name, last)
			}()
		}
		wg.Wait()
		if ids[0] != ids[1] {
			t.Fatalf("create %s: the instances answered volumes %s and %s", name, ids[0], ids[1])
		}
		var holders []string
		for node, fake := range tc.fakes {
			if _, err := fake.Get(ctx, "tank/nomad/"+ids[0]); err == nil {
				holders = append(holders, node)
			}
		}
		if len(holders) != 1 {
			t.Fatalf("create %s: volume %s exists on %v, want one node", name, ids[0], holders)
		}
	}
}
