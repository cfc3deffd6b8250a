package lease

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/node/volume"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfsfake"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
)

// TestAForcedPrimaryIsUnderTheLeaseOnceAMajorityAnswers, on the node's
// real volume code: five nodes, the operator promoted n1's copy with
// only n2 answering (promote -force) and the job writes there. While no
// majority answers, the operator's word stands in for it: the mount
// stays writable. Then the others answer again, and later n1 is cut off
// from all of them: the majority may fail the volume over after L+M, so
// n1's mount must turn read-only when its lease runs out, as any
// primary's. Before, the forced copy stayed exempt for as long as it
// kept that generation, and kept taking writes beside the failover's.
func TestAForcedPrimaryIsUnderTheLeaseOnceAMajorityAnswers(t *testing.T) {
	ctx := context.Background()
	fake := zfsfake.New(10<<30, "tank")
	if err := fake.CreateFilesystem(ctx, "tank/nomad", nil); err != nil {
		t.Fatal(err)
	}
	cfg := config.DefaultNode()
	cfg.NodeID, cfg.RootDataset, cfg.MaxQuota, cfg.DefaultQuota = "n1", "tank/nomad", 4<<30, 1<<30
	var staged string // the dataset the job's mount holds
	mounted := func(ds string) (bool, error) { return ds == staged, nil }
	m := volume.NewManager(volume.Deps{ZFS: fake, Config: cfg, Log: hclog.NewNullLogger(), Host: volume.Host{Mounted: mounted}})
	v, err := m.Create(ctx, volume.CreateRequest{Name: "forced"})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Fences().MarkForced(ctx, v.ID, v.Generation); err != nil {
		t.Fatal(err)
	}
	staged = v.Dataset
	c := &clock{t: time.Unix(1000, 0)}
	const lease = 8 * time.Second
	monitor := NewMonitor(lease, c.now)
	monitor.RequirePeers()
	m.Fences().FollowLease(func() bool { return monitor.Held("n1") })
	m.Fences().RequireConfirmation()

	peers := []string{"n2:7670", "n3:7670", "n4:7670", "n5:7670"}
	net := newMemNet()
	for _, p := range peers {
		net.serve(p, p[:2], map[string]uint64{})
	}
	cut := func(addrs ...string) {
		net.mu.Lock()
		defer net.mu.Unlock()
		net.cut = map[[2]string]bool{}
		for _, a := range addrs {
			net.cut[[2]string{"n1", a}] = true
		}
	}
	h := &Heartbeat{Monitor: monitor, NodeID: "n1", Interval: lease / 4, Client: net.client("n1"), Volumes: m.Fences(), Log: hclog.NewNullLogger(),
		Peers: func() ([]string, error) { return peers, nil }}
	writable := func() bool { return fake.NativeProperty(v.Dataset, "readonly") != "on" }
	beats := func(n int) {
		for range n {
			h.Beat(ctx)
			c.t = c.t.Add(lease / 4)
		}
	}

	cut(peers[1:]...) // only n2 answers: two of five, as when the operator forced it
	beats(6)
	if !h.lost {
		t.Fatal("n1 holds its lease with two of five nodes answering")
	}
	if !writable() {
		t.Fatal("the forced copy was made read-only while no majority answers: the operator's promotion is for that case")
	}

	cut() // the majority answers again
	beats(2)
	if h.lost {
		t.Fatal("n1 holds no lease with every node answering")
	}

	cut(peers...) // n1 is cut off from everyone, longer than its lease
	beats(6)
	if !h.lost {
		t.Fatal("n1 holds its lease cut off from every peer")
	}
	if writable() {
		t.Error("n1's forced copy is still writable after the majority answered again and n1 was then cut off past its lease: the majority may fail it over, two writers")
	}
}
